// A trial: its header (state, steps, hyperparameters) and its tabs, each a module of tabs/trial/.
import { api } from "../api.js";
import { checkpointsTab } from "../components/checkpoints.js";
import { detailPage, fact } from "../components/detail.js";
import { flatten, h, link, num, replace, stateBadge, time } from "../dom.js";
import { runningDuration } from "../page.js";
import { logs } from "../tabs/trial/logs.js";
import { metrics } from "../tabs/trial/metrics.js";
import { runs } from "../tabs/trial/runs.js";

const TABS = [
  { key: "metrics", label: "Metrics", view: metrics },
  { key: "logs", label: "Logs", view: logs },
  { key: "runs", label: "Runs", view: runs },
  {
    key: "checkpoints",
    label: "Checkpoints",
    view: (page) => checkpointsTab(page, `/trials/${page.id}/checkpoints`),
  },
];

export function render(root, params, ctx) {
  const id = params.id;
  return detailPage(root, params, ctx, {
    what: "trial",
    base: `/trials/${id}`,
    tabs: TABS,
    // The header (with the runs, which the runs tab draws) changes with the trial's row and its runs.
    changes: `/webui/trials/${id}/changes`,
    headerKeys: ["trial", "runs"],
    load: (signal) => api(`/trials/${id}`, { signal }),
    header,
  });
}

function header(box, data) {
  const t = data.trial;
  const hp = flatten(t.hparams);
  replace(
    box,
    h(
      "div",
      { class: "header" },
      h("h1", {}, `Trial ${t.id}`),
      h("span", { id: "trial-state" }, stateBadge(t.state)),
      h(
        "span",
        { class: "muted" },
        "of ",
        link(`/experiments/${t.experimentId}`, `experiment ${t.experimentId}`),
      ),
    ),
    h(
      "div",
      { class: "facts" },
      fact("Steps", num(t.stepsCompleted), "trial-steps"),
      fact("Best validation", num(t.bestValidationMetric)),
      fact("Restarts", t.restarts),
      fact("Runs", (t.runs || []).length),
      fact("Started", time(t.startTime)),
      fact("Duration", runningDuration(t.startTime, t.endTime)),
      Object.entries(hp).map(([k, v]) =>
        h(
          "div",
          {},
          h("span", {}, k),
          h("span", { class: "mono" }, typeof v === "number" ? num(v) : String(v)),
        ),
      ),
    ),
    t.exitMessage ? h("p", { class: "muted" }, t.exitMessage) : "",
  );
}
