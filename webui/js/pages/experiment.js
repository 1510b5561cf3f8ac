import { api, ApiError, stream } from "../api.js";
import { actionButtons } from "../actions.js";
import { learningCurves } from "../charts.js";
import { bytes, copyable, h, hparamsText, link, num, progressBar, replace, sortableTable, stateBadge, stateName, time } from "../dom.js";
import { liveUpdates, pageLife, runningDuration } from "../page.js";
import { hyperparameters } from "./hyperparameters.js";

const TABS = [["curves", "Learning curves"], ["hyperparameters", "Hyperparameters"], ["search", "Search"], ["trials", "Trials"], ["checkpoints", "Checkpoints"], ["config", "Config"]];
const TAB_VIEWS = { curves, hyperparameters: (e) => hyperparameters(e), search, trials, checkpoints, config };

export function notFound(root, what, id) {
  root.append(h("div", { class: "notfound" }, h("h1", {}, `No ${what} ${id}`),
    h("p", {}, `There is no ${what} with id ${JSON.stringify(String(id))}: it may have been deleted, or the link is wrong.`),
    h("p", {}, link("/experiments", "Go to the experiments"))));
}

export function render(root, { id, tab }, ctx) {
  if (!/^[1-9][0-9]{0,9}$/.test(id)) { notFound(root, "experiment", id); return null; }
  tab = tab || "curves";
  if (!TABS.some(([t]) => t === tab)) { notFound(root, "tab", tab); return null; }
  const headerBox = h("div");
  const error = h("p", { class: "error" });
  const body = h("div", { id: "tab-body" });
  const life = pageLife(error);
  let experiment = null;
  let canModify = false;
  let started = false;

  async function loadHeader() {
    try {
      const data = await api(`/experiments/${id}`, { signal: life.signal() });
      if (life.closed()) return;
      experiment = data.experiment;
      const me = ctx.session.user;
      canModify = me.admin || experiment.userId === me.id;
      drawHeader(data);
      error.textContent = "";
    } catch (e) {
      if (e instanceof ApiError && e.status === 404 && !experiment) { life.close(); replace(root); notFound(root, "experiment", id); return; }
      throw e;
    }
    if (!started) { started = true; TAB_VIEWS[tab](env); }
  }

  function drawHeader(data) {
    const e = data.experiment;
    const cfg = e.config || {};
    const searcher = cfg.searcher || {};
    const partition = (cfg.slurm && cfg.slurm.partition) || "";
    const counts = Object.entries(data.trialCounts || {}).map(([s, n]) => `${n} ${s.toLowerCase()}`).join(", ");
    replace(headerBox,
      h("div", { class: "header" }, h("h1", {}, e.name || `Experiment ${e.id}`), h("span", { class: "muted" }, `#${e.id}`), h("span", { id: "exp-state" }, stateBadge(e.state)),
        e.archived ? h("span", { class: "muted" }, "archived") : "",
        h("span", { class: "spacer", style: { flex: 1 } }),
        actionButtons(e, canModify, () => live.refresh(header), (err) => { error.textContent = err.message; })),
      h("div", { class: "facts" },
        fact("Progress", progressBar(e.progress)),
        fact("Searcher", `${searcher.name || e.searcherType || "–"}${searcher.promotion ? ` (${searcher.promotion})` : ""}`),
        fact("Metric", `${e.searcherMetric || "–"}${searcher.smaller_is_better === false ? " ↑ larger is better" : " ↓ smaller is better"}`),
        fact("Owner", e.username),
        fact("Pool", `${e.resourcePool}${partition ? ` · partition ${partition}` : ""}`),
        h("div", {}, h("span", {}, "Trials"), h("span", { id: "exp-trial-counts" }, counts || "none yet")),
        fact("Started", time(e.startTime)),
        h("div", {}, h("span", {}, "Duration"), runningDuration(e.startTime, e.endTime))));
  }

  const tabs = h("nav", { class: "tabs" }, TABS.map(([t, label]) => h("a", { href: `/experiments/${id}/${t}`, "data-nav": "", class: t === tab ? "active" : "", "data-tab": t }, label)));
  root.append(headerBox, error, tabs, body);

  // The experiment's change stream: the header and the open tab's table fetch again when theirs changed.
  const live = liveUpdates(life, `/webui/experiments/${id}/changes`);
  const env = {
    id, body, aborts: life.aborts, navigate: ctx.navigate, live,
    experiment: () => experiment, canModify: () => canModify,
    signal: life.signal, error: life.error, fail: life.fail,
  };
  const header = live.on(["experiment", "trialStates"], loadHeader, { eager: true });
  life.clock(root);
  return () => life.close();
}

function fact(label, value) { return h("div", {}, h("span", {}, label), h("span", {}, value)); }

// ---------------------------------------------------------------- learning curves

function smallerIsBetter(env, name) {
  const s = (env.experiment().config || {}).searcher || {};
  if (name === s.metric) return s.smaller_is_better !== false;
  return !/acc|auc|f1|precision|recall|score|iou|bleu/i.test(name);
}

// Points per trial to ask for: one per pixel column for a few trials, fewer as trials add up, so a page
// never takes more than ~POINT_BUDGET points (1,000 trials: 320 each, ~9 MB) however large the search.
const POINT_BUDGET = 320000;
function pointsPerTrial(width, trials) {
  return Math.max(32, Math.min(1000, Math.floor(width), Math.floor(POINT_BUDGET / Math.max(1, trials || 1))));
}

function curves(env) {
  const params = new URLSearchParams(location.search);
  const view = { group: params.get("group") || "", metric: params.get("metric") || "", log: params.get("scale") === "log", best: Number(params.get("best") || 5) };
  const picker = h("select", { "aria-label": "metric", id: "metric-picker", onchange: (e) => { [view.group, view.metric] = JSON.parse(e.target.value); restart(); } });
  const scale = h("select", { "aria-label": "y scale", onchange: (e) => { view.log = e.target.value === "log"; draw(); } }, h("option", { value: "linear" }, "linear"), h("option", { value: "log", selected: view.log }, "log"));
  const bestN = h("input", { type: "number", min: 0, max: 50, value: view.best, style: { width: "54px" }, "aria-label": "best N", onchange: (e) => { view.best = Number(e.target.value) || 0; draw(); } });
  const note = h("span", { class: "muted", id: "curves-note" });
  const chartBox = h("div", { class: "chart", id: "learning-curves" });
  replace(env.body, h("div", { class: "toolbar" }, h("label", {}, "Metric", picker), h("label", {}, "Y", scale), h("label", {}, "Highlight best", bestN), note), chartBox);

  let names = null;
  const byTrial = new Map();
  let plot = null;
  let drawTimer = null;
  let signal = null;
  let firstDraw = false;
  let asked = 1000;

  // A hidden browser tab keeps no stream open (a browser has 6 connections per server for all its tabs):
  // both streams close, and open again (from the server's kept answer) when the tab is shown.
  let namesController = null;
  function onVisibility() {
    if (document.visibilityState === "hidden") {
      if (namesController) namesController.abort();
      if (signal) signal.controller.abort();
      signal = null;
    } else if (!namesController || namesController.signal.aborted) openNames();
  }
  document.addEventListener("visibilitychange", onVisibility);
  env.aborts.push({ abort: () => document.removeEventListener("visibilitychange", onVisibility) });
  if (document.visibilityState !== "hidden") openNames();

  function openNames() {
  names = null;
  namesController = new AbortController();
  env.aborts.push(namesController);
  stream(`/experiments/${env.id}/metrics-stream/metric-names`, { params: { periodSeconds: 2 }, signal: namesController.signal, onMessage: (m) => {
    const first = names === null;
    names = m;
    const current = JSON.stringify([view.group, view.metric]);
    const options = m.metricNames.flatMap((g) => g.metricNames.map((n) => [g.group, n]));
    replace(picker, m.metricNames.map((g) => h("optgroup", { label: g.group }, g.metricNames.map((n) => h("option", { value: JSON.stringify([g.group, n]) }, n)))));
    if (!options.length) { note.textContent = "No metrics reported yet."; return; }
    if (!options.some((o) => JSON.stringify(o) === current)) {
      const preferred = options.find(([g, n]) => g === "validation" && n === m.searcherMetric) || options.find(([g]) => g === "validation") || options[0];
      [view.group, view.metric] = preferred;
    }
    picker.value = JSON.stringify([view.group, view.metric]);
    if (first || !signal) restart();
  } }).catch((e) => { if (e.name !== "AbortError") env.error(e.message); });
  }

  function restart() {
    if (!view.metric) return;
    const q = new URLSearchParams(location.search);
    q.set("group", view.group); q.set("metric", view.metric);
    history.replaceState(null, "", `${location.pathname}?${q}`);
    byTrial.clear();
    if (signal) signal.controller.abort();
    const controller = new AbortController();
    env.aborts.push(controller);
    signal = { controller };
    const width = chartBox.getBoundingClientRect().width || 1000;
    asked = pointsPerTrial(width, (env.experiment() || {}).numTrials);
    stream(`/experiments/${env.id}/metrics-stream/trials-sample`, {
      params: { metricName: view.metric, group: view.group, maxDatapoints: asked, periodSeconds: 1 },
      signal: controller.signal,
      onMessage: (m) => { for (const t of m.trials) byTrial.set(t.trialId, t); scheduleDraw(); },
    }).catch((e) => { if (e.name !== "AbortError") env.error(e.message); });
  }

  function scheduleDraw() { if (!drawTimer) drawTimer = setTimeout(() => { drawTimer = null; draw(); }, 100); }

  function draw() {
    const trials = [...byTrial.values()].filter((t) => t.data.length).sort((a, b) => a.trialId - b.trialId);
    if (plot) { plot.destroy(); plot = null; }
    chartBox.replaceChildren();
    if (!trials.length) { note.textContent = "No data for this metric yet."; return; }
    const smaller = smallerIsBetter(env, view.metric);
    const score = (t) => { let best = smaller ? Infinity : -Infinity; for (const p of t.data) best = smaller ? Math.min(best, p.value) : Math.max(best, p.value); return best; };
    const ranked = [...trials].sort((a, b) => (smaller ? score(a) - score(b) : score(b) - score(a)));
    const best = new Set(ranked.slice(0, view.best).map((t) => t.trialId));
    const points = trials.reduce((n, t) => n + t.data.length, 0);
    note.textContent = `${trials.length} trial${trials.length === 1 ? "" : "s"} · ${points.toLocaleString("en-US")} points (downsampled on the server) · best ${Math.min(view.best, trials.length)} in colour: ${ranked.slice(0, Math.min(view.best, 5)).map((t) => `#${t.trialId}`).join(" ")}`;
    const log = view.log && trials.every((t) => t.data.every((p) => p.value > 0));
    plot = learningCurves(chartBox, trials, { metric: view.metric, log, best, columns: asked, onClick: (trialId) => env.navigate(`/trials/${trialId}`) });
    chartBox.dataset.series = String(trials.length);
    // When the curves were first drawn and painted (the next frame), in ms since navigation start: the
    // benchmark's "interactive" marker (bench/webui_curves.py).
    if (!firstDraw) { firstDraw = true; requestAnimationFrame(() => { chartBox.dataset.drawnAt = String(Math.round(performance.now())); performance.mark("curves-drawn"); }); }
  }
  env.aborts.push({ abort: () => { if (plot) plot.destroy(); clearTimeout(drawTimer); } });
}

// ---------------------------------------------------------------- search (ASHA rungs)

function search(env) {
  const box = h("div", { id: "rungs" });
  replace(env.body, box);
  // Rungs change with the searcher's snapshot (the experiment's row) and with the trials' states.
  env.live.on(["experiment", "trialStates"], async () => {
    const data = await api(`/webui/experiments/${env.id}/rungs`, { signal: env.signal() });
    if (!data.brackets.length) { replace(box, h("p", { class: "muted" }, `The ${data.searcherType || "search"} method has no rungs to show${data.searcherType && !/asha|halving/.test(data.searcherType) ? " (only ASHA searches do)" : " yet"}.`)); return; }
    const paused = data.brackets.flatMap((b) => b.rungs.flatMap((r) => r.trials.filter((t) => t.status === "paused"))).length;
    replace(box,
      h("p", { class: "muted" }, `Promotion: ${data.promotion}. `, data.promotion === "pause"
        ? `A trial not promoted at once is paused: its Slurm job checkpoints and ends, freeing the GPUs, and it resumes from that checkpoint if later results promote it. ${paused} paused now, waiting for promotion.`
        : "A trial not promoted at once stops for good."),
      data.brackets.map((b) => h("div", {}, data.brackets.length > 1 ? h("h2", {}, `Bracket ${b.index + 1}`) : "",
        h("div", { class: "rungs" }, b.rungs.map((r) => h("div", { class: "panel rung", "data-rung": r.index },
          h("h3", {}, `Rung ${r.index + 1}`, r.length ? h("span", { class: "muted" }, ` · trains to ${num(r.length)}`) : "", h("span", { class: "muted" }, ` · ${r.trials.length} reported`)),
          r.trials.length || r.trainingTrialIds.length ? h("table", {}, h("tbody", {},
            r.trials.map((t) => h("tr", {},
              h("td", {}, t.trialId ? link(`/trials/${t.trialId}`, `#${t.trialId}`) : t.requestId.slice(0, 8)),
              h("td", { class: "num" }, num(t.metric)),
              h("td", {}, h("span", { class: `state ${t.status}` }, t.status === "paused" ? "paused · waiting for promotion" : t.status), t.resumed ? h("span", { class: "muted" }, " resumed") : ""))),
            r.trainingTrialIds.map((tid) => h("tr", {}, h("td", {}, link(`/trials/${tid}`, `#${tid}`)), h("td", { class: "num muted" }, "…"), h("td", {}, h("span", { class: "state running" }, "training to this rung")))))) : h("p", { class: "muted" }, "no results yet")))))));
  });
}

// ---------------------------------------------------------------- trials

export function trialColumns(hpKeys) {
  return [
    { key: "id", label: "Trial", num: true, render: (t) => link(`/trials/${t.id}`, `#${t.id}`) },
    { key: "state", label: "State", value: (t) => stateName(t.state), render: (t) => stateBadge(t.state) },
    ...hpKeys.map((k) => ({ key: `hp.${k}`, label: k, value: (t) => t.hparams[k], num: true })),
    { key: "steps", label: "Steps", num: true, value: (t) => t.stepsCompleted },
    { key: "best", label: "Best val.", num: true, value: (t) => t.bestValidationMetric },
    { key: "latest", label: "Latest val.", num: true, value: (t) => t.searcherLatest },
    { key: "restarts", label: "Restarts", num: true, value: (t) => t.restarts },
    { key: "job", label: "Slurm job", value: (t) => t.currentRun && t.currentRun.slurmJobId, render: (t) => t.currentRun ? h("span", { class: t.runLive ? "" : "muted" }, t.currentRun.slurmJobId || "pending") : "–" },
    { key: "nodes", label: "Nodes", value: (t) => t.currentRun && t.currentRun.nodeList, render: (t) => (t.currentRun && t.currentRun.nodeList) || "–" },
    { key: "duration", label: "Duration", value: (t) => new Date(t.endTime || Date.now()) - new Date(t.startTime), render: (t) => runningDuration(t.startTime, t.endTime) },
  ];
}

function trials(env) {
  const view = { sort: "id", asc: true, state: "", text: "" };
  const tableBox = h("div", { id: "trials" });
  const stateSel = h("select", { "aria-label": "trial state", onchange: (e) => { view.state = e.target.value; draw(); } }, h("option", { value: "" }, "all states"), ["ACTIVE", "PAUSED", "COMPLETED", "CANCELED", "ERROR"].map((s) => h("option", { value: s }, s)));
  const text = h("input", { placeholder: "filter hyperparameters, job, nodes…", oninput: (e) => { view.text = e.target.value.toLowerCase(); draw(); } });
  const count = h("span", { class: "muted" });
  replace(env.body, h("div", { class: "toolbar" }, stateSel, text, count), tableBox);
  let rows = [];
  function draw() {
    const metric = (env.experiment().searcherMetric) || "";
    const hpKeys = [...new Set(rows.flatMap((t) => Object.keys(t.hparams || {})))].filter((k) => rows.every((t) => typeof t.hparams[k] !== "object"));
    const shown = rows.filter((t) => (!view.state || stateName(t.state) === view.state)
      && (!view.text || `${hparamsText(t.hparams)} ${t.currentRun ? `${t.currentRun.slurmJobId} ${t.currentRun.nodeList}` : ""} #${t.id}`.toLowerCase().includes(view.text)));
    for (const t of shown) t.searcherLatest = t.latestValidation ? t.latestValidation.metrics[metric] : null;
    count.textContent = `${shown.length} of ${rows.length} trials`;
    replace(tableBox, sortableTable(trialColumns(hpKeys), shown, view, (v) => { Object.assign(view, v); draw(); }));
  }
  // Spaced out: while trials train, their steps change at every report, and a large experiment's table is
  // the heaviest read of the page (at most a fifth of the time spent fetching it).
  env.live.on(["trials", "runs", "validations"], async () => {
    rows = (await api(`/webui/experiments/${env.id}/trials`, { signal: env.signal() })).trials;
    draw();
  }, { minIntervalMs: 500, spacing: 5 });
}

// ---------------------------------------------------------------- checkpoints

export function checkpointTable(list, view, onSort) {
  const size = (c) => Object.values(c.resources || {}).reduce((a, b) => a + (Number(b) || 0), 0);
  return sortableTable([
    { key: "uuid", label: "UUID", render: (c) => h("code", {}, c.uuid) },
    { key: "trial", label: "Trial", num: true, value: (c) => c.training.trialId, render: (c) => link(`/trials/${c.training.trialId}`, `#${c.training.trialId}`) },
    { key: "steps", label: "Steps", num: true, value: (c) => c.stepsCompleted },
    { key: "metric", label: "Metric", num: true, value: (c) => c.training.searcherMetric },
    { key: "size", label: "Size", num: true, value: size, render: (c) => bytes(size(c)) },
    { key: "state", label: "State", value: (c) => stateName(c.state), render: (c) => stateBadge(c.state) },
    { key: "time", label: "Reported", value: (c) => c.reportTime, render: (c) => time(c.reportTime) },
    { key: "cmd", label: "Download", sortable: false, render: (c) => copyable(`det checkpoint download ${c.uuid}`) },
  ], list, view, onSort);
}

function checkpoints(env) {
  const view = { sort: "steps", asc: false };
  const box = h("div", { id: "checkpoints" });
  replace(env.body, box);
  let list = [];
  const draw = () => replace(box, list.length ? checkpointTable(list, view, (v) => { Object.assign(view, v); draw(); }) : h("p", { class: "muted" }, "No checkpoints yet."));
  env.live.on(["checkpoints"], async () => { list = (await api(`/experiments/${env.id}/checkpoints`, { signal: env.signal() })).checkpoints; draw(); });
}

// ---------------------------------------------------------------- config

function config(env) {
  const e = env.experiment();
  replace(env.body, h("pre", { class: "config", id: "config" }, e.originalConfig || JSON.stringify(e.config, null, 2)));
}
