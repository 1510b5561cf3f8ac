// The trials tab: every trial of the experiment in one table, filtered by state and by text.
import { api } from "../../api.js";
import { table } from "../../components/table.js";
import { h, hparamsText, link, replace, stateBadge, stateName, waitingBadge } from "../../dom.js";
import { runningDuration } from "../../page.js";
import { trialStates } from "../../vocabulary.js";

function trialColumns(hpKeys) {
  return [
    { key: "id", label: "Trial", num: true, render: (t) => link(`/trials/${t.id}`, `#${t.id}`) },
    { key: "state", label: "State", value: (t) => stateName(t.state), render: (t) => stateBadge(t.state) },
    ...hpKeys.map((k) => ({ key: `hp.${k}`, label: k, value: (t) => t.hparams[k], num: true })),
    { key: "steps", label: "Steps", num: true, value: (t) => t.stepsCompleted },
    { key: "best", label: "Best val.", num: true, value: (t) => t.bestValidationMetric },
    { key: "latest", label: "Latest val.", num: true, value: (t) => t.searcherLatest },
    { key: "restarts", label: "Restarts", num: true, value: (t) => t.restarts },
    {
      key: "job",
      label: "Slurm job",
      value: (t) => t.currentRun?.slurmJobId,
      render: (t) =>
        t.currentRun
          ? h(
              "span",
              {},
              h("span", { class: t.runLive ? "" : "muted" }, t.currentRun.slurmJobId || "pending"),
              t.currentRun.pendingReason ? " " : "",
              waitingBadge(t.currentRun) || "",
            )
          : "–",
    },
    {
      key: "nodes",
      label: "Nodes",
      value: (t) => t.currentRun?.nodeList,
      render: (t) => t.currentRun?.nodeList || "–",
    },
    {
      key: "duration",
      label: "Duration",
      value: (t) => new Date(t.endTime || Date.now()) - new Date(t.startTime),
      render: (t) => runningDuration(t.startTime, t.endTime),
    },
  ];
}

export function trials(page) {
  const view = { sort: "id", asc: true, state: "", text: "" };
  const tableBox = h("div", { id: "trials" });
  const stateSel = h(
    "select",
    {
      "aria-label": "trial state",
      onchange: (e) => {
        view.state = e.target.value;
        draw();
      },
    },
    h("option", { value: "" }, "all states"),
    trialStates().map((s) => h("option", { value: s }, s.replace(/_/g, " "))),
  );
  const text = h("input", {
    placeholder: "filter hyperparameters, job, nodes…",
    oninput: (e) => {
      view.text = e.target.value.toLowerCase();
      draw();
    },
  });
  const count = h("span", { class: "muted" });
  replace(page.body, h("div", { class: "toolbar" }, stateSel, text, count), tableBox);
  let rows = [];
  function draw() {
    const metric = page.data().experiment.searcherMetric || "";
    const hpKeys = [...new Set(rows.flatMap((t) => Object.keys(t.hparams || {})))].filter((k) =>
      rows.every((t) => typeof t.hparams[k] !== "object"),
    );
    const shown = rows.filter(
      (t) =>
        (!view.state || stateName(t.state) === view.state) &&
        (!view.text ||
          `${hparamsText(t.hparams)} ${t.currentRun ? `${t.currentRun.slurmJobId} ${t.currentRun.nodeList}` : ""} #${t.id}`
            .toLowerCase()
            .includes(view.text)),
    );
    for (const t of shown) t.searcherLatest = t.latestValidation ? t.latestValidation.metrics[metric] : null;
    count.textContent = `${shown.length} of ${rows.length} trials`;
    replace(
      tableBox,
      table(trialColumns(hpKeys), shown, {
        view,
        onSort: (v) => {
          Object.assign(view, v);
          draw();
        },
      }),
    );
  }
  // Spaced out: while trials train, their steps change at every report, and a large experiment's table is
  // the heaviest read of the page (at most a fifth of the time spent fetching it).
  page.live.on(
    ["trials", "runs", "validations"],
    async () => {
      rows = (await api(`/webui/experiments/${page.id}/trials`, { signal: page.signal() })).trials;
      draw();
    },
    { minIntervalMs: 500, spacing: 5 },
  );
}
