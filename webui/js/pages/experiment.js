// An experiment: its header (state, actions, facts) and its tabs, each a module of tabs/experiment/.
import { api } from "../api.js";
import { actionButtons } from "../actions.js";
import { checkpointsTab } from "../components/checkpoints.js";
import { detailPage, fact } from "../components/detail.js";
import { h, progressBar, replace, stateBadge, time } from "../dom.js";
import { runningDuration } from "../page.js";
import { config } from "../tabs/experiment/config.js";
import { curves } from "../tabs/experiment/curves.js";
import { hyperparameters } from "../tabs/experiment/hyperparameters.js";
import { search } from "../tabs/experiment/search.js";
import { trials } from "../tabs/experiment/trials.js";

const TABS = [
  { key: "curves", label: "Learning curves", view: curves },
  { key: "hyperparameters", label: "Hyperparameters", view: hyperparameters },
  { key: "search", label: "Search", view: search },
  { key: "trials", label: "Trials", view: trials },
  {
    key: "checkpoints",
    label: "Checkpoints",
    view: (page) => checkpointsTab(page, `/experiments/${page.id}/checkpoints`),
  },
  { key: "config", label: "Config", view: config },
];

export function render(root, params, ctx) {
  const id = params.id;
  return detailPage(root, params, ctx, {
    what: "experiment",
    base: `/experiments/${id}`,
    tabs: TABS,
    // The header changes with the experiment's row and with its trials' states (the counts).
    changes: `/webui/experiments/${id}/changes`,
    headerKeys: ["experiment", "trialStates"],
    load: (signal) => api(`/experiments/${id}`, { signal }),
    header,
  });
}

function header(box, data, page) {
  const e = data.experiment;
  const me = page.session.user;
  const canModify = me.admin || e.userId === me.id;
  const cfg = e.config || {};
  const searcher = cfg.searcher || {};
  const partition = cfg.slurm?.partition || "";
  const counts = Object.entries(data.trialCounts || {})
    .map(([s, n]) => `${n} ${s.toLowerCase()}`)
    .join(", ");
  replace(
    box,
    h(
      "div",
      { class: "header" },
      h("h1", {}, e.name || `Experiment ${e.id}`),
      h("span", { class: "muted" }, `#${e.id}`),
      h("span", { id: "exp-state" }, stateBadge(e.state)),
      e.archived ? h("span", { class: "muted" }, "archived") : "",
      h("span", { class: "spacer", style: { flex: 1 } }),
      actionButtons(e, canModify, page.refreshHeader, (err) => page.error(err.message)),
    ),
    h(
      "div",
      { class: "facts" },
      fact("Progress", progressBar(e.progress)),
      fact(
        "Searcher",
        `${searcher.name || e.searcherType || "–"}${searcher.promotion ? ` (${searcher.promotion})` : ""}`,
      ),
      fact(
        "Metric",
        `${e.searcherMetric || "–"}${searcher.smaller_is_better === false ? " ↑ larger is better" : " ↓ smaller is better"}`,
      ),
      fact("Owner", e.username),
      fact("Pool", `${e.resourcePool}${partition ? ` · partition ${partition}` : ""}`),
      fact("Trials", counts || "none yet", "exp-trial-counts"),
      fact("Started", time(e.startTime)),
      fact("Duration", runningDuration(e.startTime, e.endTime)),
    ),
  );
}
