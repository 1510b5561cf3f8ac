// The experiment list: filters and sort in the address bar, sorted by the server, live (the list's change
// stream), with each experiment's actions.
import { api } from "../api.js";
import { actionButtons } from "../actions.js";
import { table } from "../components/table.js";
import { h, link, num, progressBar, replace, stateBadge, time } from "../dom.js";
import { liveUpdates, pageLife, runningDuration } from "../page.js";
import { experimentStates } from "../vocabulary.js";

export function render(root) {
  const params = new URLSearchParams(location.search);
  const view = {
    name: params.get("name") || "",
    owner: params.get("owner") || "",
    state: params.get("state") || "",
    archived: params.get("archived") === "true",
    sort: params.get("sortBy") || "id",
    asc: params.get("order") === "asc",
  };
  const status = h("span", { class: "muted" });
  const error = h("p", { class: "error" });
  const box = h("div");
  const nameInput = h("input", {
    placeholder: "name contains…",
    value: view.name,
    "aria-label": "name filter",
    oninput: (e) => {
      view.name = e.target.value;
      reload();
    },
  });
  const ownerInput = h("input", {
    placeholder: "owner",
    value: view.owner,
    size: 10,
    "aria-label": "owner filter",
    oninput: (e) => {
      view.owner = e.target.value.trim();
      reload();
    },
  });
  const stateSelect = h(
    "select",
    {
      "aria-label": "state filter",
      onchange: (e) => {
        view.state = e.target.value;
        reload();
      },
    },
    h("option", { value: "" }, "all states"),
    experimentStates().map((s) =>
      h("option", { value: s, selected: s === view.state }, s.replace(/_/g, " ")),
    ),
  );
  const archived = h("input", {
    type: "checkbox",
    checked: view.archived,
    onchange: (e) => {
      view.archived = e.target.checked;
      reload();
    },
  });
  root.append(
    h("div", { class: "header" }, h("h1", {}, "Experiments"), status),
    h(
      "div",
      { class: "toolbar" },
      nameInput,
      ownerInput,
      stateSelect,
      h("label", {}, archived, "show archived"),
    ),
    error,
    box,
  );

  const life = pageLife(error);
  async function load() {
    const q = new URLSearchParams();
    for (const [k, v] of [
      ["name", view.name],
      ["owner", view.owner],
      ["state", view.state],
      ["archived", view.archived ? "true" : ""],
      ["sortBy", view.sort !== "id" ? view.sort : ""],
      ["order", view.asc ? "asc" : ""],
    ])
      if (v) q.set(k, v);
    history.replaceState(null, "", `/experiments${q.toString() ? `?${q}` : ""}`);
    const data = await api("/webui/experiments", {
      signal: life.signal(),
      params: {
        name: view.name,
        users: view.owner || undefined,
        states: view.state || undefined,
        archived: view.archived ? undefined : "false",
        sortBy: view.sort,
        orderBy: view.asc ? "ORDER_BY_ASC" : "ORDER_BY_DESC",
        limit: 200,
      },
    });
    error.textContent = "";
    status.textContent = `${data.pagination.total} experiment${data.pagination.total === 1 ? "" : "s"}`;
    replace(
      box,
      table(columns(), data.experiments, {
        view,
        server: true,
        id: "experiments",
        rowAttrs: (e) => ({ "data-experiment": e.id }),
        onSort: (v) => {
          Object.assign(view, v);
          now();
        },
        empty: h(
          "p",
          { class: "muted" },
          "No experiments match. Create one with det experiment create CONFIG DIR.",
        ),
      }),
    );
  }
  // The list's change stream: fetched again when an experiment or the trials changed (spaced out: progress
  // moves while experiments run), or at once when the filters or the sort change.
  const live = liveUpdates(life, "/webui/changes");
  const list = live.on(["experiments", "trials"], load, { minIntervalMs: 500, spacing: 5 });
  const now = () => live.refresh(list);
  let debounce = null;
  function reload() {
    life.cancel(debounce);
    debounce = life.later(now, 200);
  }

  // Sorted by the server; names and owners sort A to Z first, the rest largest first.
  const columns = () => [
    { key: "id", label: "ID", num: true, render: (e) => link(`/experiments/${e.id}`, e.id) },
    {
      key: "name",
      label: "Name",
      ascFirst: true,
      render: (e) => [
        link(`/experiments/${e.id}`, e.name || `experiment ${e.id}`),
        e.archived ? h("span", { class: "muted" }, " (archived)") : "",
      ],
    },
    { key: "owner", label: "Owner", ascFirst: true, render: (e) => e.username },
    { key: "state", label: "State", render: (e) => stateBadge(e.state) },
    { key: "progress", label: "Progress", num: true, render: (e) => progressBar(e.progress) },
    {
      key: "best",
      label: "Best metric",
      num: true,
      sortable: false,
      title: (e) => e.searcherMetric,
      render: (e) => num(e.bestSearcherMetric),
    },
    { key: "trials", label: "Trials", num: true, sortable: false, render: (e) => e.numTrials },
    { key: "startTime", label: "Started", render: (e) => time(e.startTime) },
    {
      key: "duration",
      label: "Duration",
      sortable: false,
      render: (e) => runningDuration(e.startTime, e.endTime),
    },
    { key: "resourcePool", label: "Pool", render: (e) => e.resourcePool },
    {
      key: "actions",
      label: "Actions",
      sortable: false,
      render: (e) =>
        actionButtons(e, e.canModify, now, (err) => {
          error.textContent = err.message;
        }),
    },
  ];

  life.clock(root);
  return () => life.close();
}
