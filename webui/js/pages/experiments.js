import { api } from "../api.js";
import { actionButtons } from "../actions.js";
import { h, link, num, progressBar, replace, stateBadge, time } from "../dom.js";
import { liveUpdates, pageLife, runningDuration } from "../page.js";

const STATES = ["ACTIVE", "PAUSED", "COMPLETED", "CANCELED", "ERROR", "STOPPING_CANCELED", "STOPPING_KILLED", "STOPPING_COMPLETED"];

const COLUMNS = [
  ["id", "ID", true], ["name", "Name", true], ["owner", "Owner", true], ["state", "State", true],
  ["progress", "Progress", true], ["best", "Best metric", false], ["trials", "Trials", false],
  ["startTime", "Started", true], ["duration", "Duration", false], ["resourcePool", "Pool", true], ["actions", "Actions", false],
];

export function render(root) {
  const params = new URLSearchParams(location.search);
  const view = {
    name: params.get("name") || "", owner: params.get("owner") || "", state: params.get("state") || "",
    archived: params.get("archived") === "true", sortBy: params.get("sortBy") || "id", desc: params.get("order") !== "asc",
  };
  const status = h("span", { class: "muted" });
  const error = h("p", { class: "error" });
  const table = h("div");
  const nameInput = h("input", { placeholder: "name contains…", value: view.name, "aria-label": "name filter", oninput: (e) => { view.name = e.target.value; reload(); } });
  const ownerInput = h("input", { placeholder: "owner", value: view.owner, size: 10, "aria-label": "owner filter", oninput: (e) => { view.owner = e.target.value.trim(); reload(); } });
  const stateSelect = h("select", { "aria-label": "state filter", onchange: (e) => { view.state = e.target.value; reload(); } },
    h("option", { value: "" }, "all states"), STATES.map((s) => h("option", { value: s, selected: s === view.state }, s.replace(/_/g, " "))));
  const archived = h("input", { type: "checkbox", checked: view.archived, onchange: (e) => { view.archived = e.target.checked; reload(); } });
  root.append(
    h("div", { class: "header" }, h("h1", {}, "Experiments"), status),
    h("div", { class: "toolbar" }, nameInput, ownerInput, stateSelect, h("label", {}, archived, "show archived")),
    error, table);

  const life = pageLife(error);
  async function load() {
    const q = new URLSearchParams();
    for (const [k, v] of [["name", view.name], ["owner", view.owner], ["state", view.state], ["archived", view.archived ? "true" : ""], ["sortBy", view.sortBy !== "id" ? view.sortBy : ""], ["order", view.desc ? "" : "asc"]]) if (v) q.set(k, v);
    history.replaceState(null, "", `/experiments${q.toString() ? `?${q}` : ""}`);
    const data = await api("/webui/experiments", { signal: life.signal(), params: {
      name: view.name, users: view.owner || undefined, states: view.state || undefined,
      archived: view.archived ? undefined : "false", sortBy: view.sortBy, orderBy: view.desc ? "ORDER_BY_DESC" : "ORDER_BY_ASC", limit: 200,
    } });
    error.textContent = "";
    status.textContent = `${data.pagination.total} experiment${data.pagination.total === 1 ? "" : "s"}`;
    replace(table, draw(data.experiments));
  }
  // The list's change stream: fetched again when an experiment or the trials changed (spaced out: progress
  // moves while experiments run), or at once when the filters or the sort change.
  const live = liveUpdates(life, "/webui/changes");
  const list = live.on(["experiments", "trials"], load, { minIntervalMs: 500, spacing: 5 });
  const now = () => live.refresh(list);
  let debounce = null;
  function reload() { clearTimeout(debounce); debounce = setTimeout(now, 200); }

  function draw(rows) {
    const head = h("tr", {}, COLUMNS.map(([key, label, sortable]) => h("th", {
      class: `${sortable ? "sortable" : ""} ${key === view.sortBy ? "sorted" : ""} ${view.desc ? "" : "asc"} ${["id", "progress", "best", "trials"].includes(key) ? "num" : ""}`,
      onclick: sortable ? () => { view.desc = key === view.sortBy ? !view.desc : key !== "name" && key !== "owner"; view.sortBy = key; now(); } : undefined,
    }, label)));
    const body = rows.map((e) => h("tr", { "data-experiment": e.id },
      h("td", { class: "num" }, link(`/experiments/${e.id}`, e.id)),
      h("td", {}, link(`/experiments/${e.id}`, e.name || `experiment ${e.id}`), e.archived ? h("span", { class: "muted" }, " (archived)") : ""),
      h("td", {}, e.username),
      h("td", {}, stateBadge(e.state)),
      h("td", { class: "num" }, progressBar(e.progress)),
      h("td", { class: "num", title: e.searcherMetric }, num(e.bestSearcherMetric)),
      h("td", { class: "num" }, e.numTrials),
      h("td", {}, time(e.startTime)),
      h("td", {}, runningDuration(e.startTime, e.endTime)),
      h("td", {}, e.resourcePool),
      h("td", {}, actionButtons(e, e.canModify, now, (err) => { error.textContent = err.message; }))));
    if (!rows.length) return h("p", { class: "muted" }, "No experiments match. Create one with det experiment create CONFIG DIR.");
    return h("div", { class: "table-wrap" }, h("table", { id: "experiments" }, h("thead", {}, head), h("tbody", {}, body)));
  }

  life.clock(root);
  return () => { clearTimeout(debounce); life.close(); };
}
