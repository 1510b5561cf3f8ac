import { api, ApiError, stream } from "../api.js";
import { lineChart } from "../charts.js";
import { flatten, h, link, num, replace, sortableTable, stateBadge, time } from "../dom.js";
import { liveUpdates, pageLife, runningDuration } from "../page.js";
import { checkpointTable, notFound } from "./experiment.js";

const TABS = [["metrics", "Metrics"], ["logs", "Logs"], ["runs", "Runs"], ["checkpoints", "Checkpoints"]];
const MAX_LOG_LINES = 20000;

export function render(root, { id, tab }, ctx) {
  if (!/^[1-9][0-9]{0,9}$/.test(id)) { notFound(root, "trial", id); return null; }
  tab = tab || "metrics";
  if (!TABS.some(([t]) => t === tab)) { notFound(root, "tab", tab); return null; }
  const headerBox = h("div");
  const error = h("p", { class: "error" });
  const body = h("div", { id: "tab-body" });
  const life = pageLife(error);
  const onTrial = []; // tabs drawn from the trial itself (its runs), again whenever the header reloads
  let trial = null;
  let started = false;

  async function loadHeader() {
    try {
      const data = await api(`/trials/${id}`, { signal: life.signal() });
      if (life.closed()) return;
      trial = data.trial;
    } catch (e) {
      if (e instanceof ApiError && e.status === 404 && !trial) { life.close(); replace(root); notFound(root, "trial", id); return; }
      throw e;
    }
    drawHeader();
    error.textContent = "";
    if (!started) { started = true; ({ metrics, logs, runs, checkpoints })[tab](env); }
    onTrial.forEach((fn) => fn());
  }
  function drawHeader() {
    const t = trial;
    const hp = flatten(t.hparams);
    replace(headerBox,
      h("div", { class: "header" }, h("h1", {}, `Trial ${t.id}`), h("span", { id: "trial-state" }, stateBadge(t.state)),
        h("span", { class: "muted" }, "of ", link(`/experiments/${t.experimentId}`, `experiment ${t.experimentId}`))),
      h("div", { class: "facts" },
        h("div", {}, h("span", {}, "Steps"), h("span", { id: "trial-steps" }, num(t.stepsCompleted))),
        h("div", {}, h("span", {}, "Best validation"), h("span", {}, num(t.bestValidationMetric))),
        h("div", {}, h("span", {}, "Restarts"), h("span", {}, t.restarts)),
        h("div", {}, h("span", {}, "Runs"), h("span", {}, (t.runs || []).length)),
        h("div", {}, h("span", {}, "Started"), h("span", {}, time(t.startTime))),
        h("div", {}, h("span", {}, "Duration"), runningDuration(t.startTime, t.endTime)),
        Object.entries(hp).map(([k, v]) => h("div", {}, h("span", {}, k), h("span", { class: "mono" }, typeof v === "number" ? num(v) : String(v))))),
      t.exitMessage ? h("p", { class: "muted" }, t.exitMessage) : "");
  }
  const tabs = h("nav", { class: "tabs" }, TABS.map(([t, label]) => h("a", { href: `/trials/${id}/${t}`, "data-nav": "", class: t === tab ? "active" : "", "data-tab": t }, label)));
  root.append(headerBox, error, tabs, body);
  // The trial's change stream: the header (with the runs) and the open tab fetch again when theirs changed.
  const live = liveUpdates(life, `/webui/trials/${id}/changes`);
  const env = {
    id, body, live, trial: () => trial, navigate: ctx.navigate,
    signal: life.signal, error: life.error, fail: life.fail,
    onTrial: (fn) => onTrial.push(fn),
  };
  live.on(["trial", "runs"], loadHeader, { eager: true });
  life.clock(root);
  return () => life.close();
}

function metrics(env) {
  const grid = h("div", { class: "charts-grid", id: "trial-charts" });
  replace(env.body, grid);
  let last = "";
  const plots = [];
  // A new report raises the trial's steps (its row) or adds a metric row: either way, fetch again (spaced
  // out while it trains).
  env.live.on(["trial", "metrics"], async () => {
    const data = await api("/trials/time-series", { params: { trialIds: env.id, maxDatapoints: 1000 }, signal: env.signal() });
    const groups = data.trials[0].metrics;
    const key = JSON.stringify(groups.map((g) => [g.group, g.data.length, g.data.length && g.data[g.data.length - 1].batches]));
    if (key === last) return;
    last = key;
    const byName = new Map();
    for (const g of groups) for (const p of g.data) for (const [name, v] of Object.entries(p.values)) {
      if (!byName.has(name)) byName.set(name, new Map());
      const series = byName.get(name);
      if (!series.has(g.group)) series.set(g.group, []);
      series.get(g.group).push([p.batches, v]);
    }
    plots.splice(0).forEach((p) => p.destroy());
    grid.replaceChildren();
    if (!byName.size) { grid.append(h("p", { class: "muted" }, "No metrics reported yet.")); return; }
    for (const [name, series] of [...byName].sort()) plots.push(lineChart(grid, name, [...series].map(([group, points]) => ({ label: group, points }))));
  }, { minIntervalMs: 500, spacing: 5 });
}

function runs(env) {
  const box = h("div", { id: "runs" });
  replace(env.body, box);
  const view = { sort: "run", asc: true };
  const draw = () => replace(box, sortableTable([
    { key: "run", label: "Run", num: true, value: (r) => r.trialRunId },
    { key: "job", label: "Slurm job", value: (r) => r.slurmJobId, render: (r) => r.slurmJobId || "–" },
    { key: "nodes", label: "Nodes", value: (r) => r.nodeList, render: (r) => r.nodeList || "–" },
    { key: "state", label: "State", value: (r) => r.state, render: (r) => stateBadge(r.state) },
    { key: "submit", label: "Submitted", value: (r) => r.submitTime, render: (r) => time(r.submitTime) },
    { key: "start", label: "Started", value: (r) => r.startTime, render: (r) => time(r.startTime) },
    { key: "end", label: "Ended", value: (r) => r.endTime, render: (r) => time(r.endTime) },
    { key: "how", label: "How it ended", value: (r) => r.exitReason, render: (r) => endedHow(r) },
    { key: "msg", label: "Message", wrap: true, value: (r) => r.exitMessage, render: (r) => r.exitMessage || "" },
  ], env.trial().runs || [], view, (v) => { Object.assign(view, v); draw(); }));
  draw();
  env.onTrial(draw); // the runs come with the trial, which the header fetches again when they change
}

const ENDED = {
  SLURM_PREEMPTED: "preempted by Slurm", TIME_LIMIT_CHECKPOINTED: "time limit (checkpointed)", TIME_LIMIT: "time limit",
  PAUSED_BY_USER: "paused by the user", PAUSED_BY_SEARCHER: "paused by the searcher", NONZERO_EXIT: "failed (non-zero exit)",
  NODE_FAIL: "node failure", OUT_OF_MEMORY: "out of memory", SEARCHER_DONE: "finished", KILLED_BY_USER: "killed",
  CANCELED_BY_USER: "canceled", JOB_LOST: "job lost", SUBMIT_FAILED: "submission failed",
};
function endedHow(r) { return r.exitReason ? (ENDED[r.exitReason] || r.exitReason.toLowerCase().replace(/_/g, " ")) : (r.endTime ? "–" : h("span", { class: "muted" }, "running")); }

function logs(env) {
  const lines = [];
  const ranks = new Set();
  const view = { rank: "", text: "", follow: true };
  const box = h("div", { class: "logs", id: "logs", tabindex: 0 });
  const rankSel = h("select", { "aria-label": "rank", onchange: (e) => { view.rank = e.target.value; redraw(); } }, h("option", { value: "" }, "all ranks"));
  const search = h("input", { placeholder: "search…", "aria-label": "search logs", oninput: (e) => { view.text = e.target.value; redraw(); } });
  const follow = h("input", { type: "checkbox", checked: true, onchange: (e) => { view.follow = e.target.checked; if (view.follow) box.scrollTop = box.scrollHeight; } });
  const status = h("span", { class: "muted", id: "log-status" });
  const download = h("button", { class: "small", onclick: () => {
    const blob = new Blob(lines.map((l) => l.message), { type: "text/plain" });
    const a = h("a", { href: URL.createObjectURL(blob), download: `trial-${env.id}-logs.txt` });
    document.body.append(a); a.click(); a.remove(); setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  } }, "Download");
  replace(env.body, h("div", { class: "toolbar" }, rankSel, search, h("label", {}, follow, "follow"), download, status), box);

  const shown = (l) => (!view.rank || String(l.rankId) === view.rank) && (!view.text || l.message.toLowerCase().includes(view.text.toLowerCase()));
  function lineEl(l) {
    const el = h("div", {});
    const text = l.message.replace(/\n$/, "");
    if (view.text) {
      const i = text.toLowerCase().indexOf(view.text.toLowerCase());
      el.append(text.slice(0, i), h("mark", {}, text.slice(i, i + view.text.length)), text.slice(i + view.text.length));
    } else el.textContent = text;
    return el;
  }
  function redraw() { box.replaceChildren(...lines.filter(shown).slice(-5000).map(lineEl)); if (view.follow) box.scrollTop = box.scrollHeight; }
  function add(batch) {
    const frag = document.createDocumentFragment();
    for (const l of batch) {
      lines.push(l);
      if (l.rankId !== null && l.rankId !== undefined && !ranks.has(l.rankId)) { ranks.add(l.rankId); rankSel.append(h("option", { value: String(l.rankId) }, `rank ${l.rankId}`)); }
      if (shown(l)) frag.append(lineEl(l));
    }
    if (lines.length > MAX_LOG_LINES) lines.splice(0, lines.length - MAX_LOG_LINES);
    box.append(frag);
    while (box.childElementCount > 5000) box.firstChild.remove();
    if (view.follow) box.scrollTop = box.scrollHeight;
    status.textContent = `${lines.length} lines${following ? " · following" : ""}`;
  }
  let following = true;
  let pending = [];
  let flush = null;
  status.textContent = "following…";
  stream(`/trials/${env.id}/logs`, { params: { follow: "true" }, signal: env.signal(), onMessage: (l) => {
    pending.push(l);
    if (!flush) flush = setTimeout(() => { flush = null; const b = pending; pending = []; add(b); }, 50);
  } }).then(() => { following = false; setTimeout(() => { status.textContent = `${lines.length} lines · the trial has ended`; }, 100); })
    .catch((e) => {
      if (e.name === "AbortError") return;
      following = false;
      if (e instanceof ApiError && e.status === 403) box.replaceChildren(h("div", {}, "A trial's logs are visible to the experiment's owner and admins only."));
      else env.error(e.message);
    });
}

function checkpoints(env) {
  const box = h("div", { id: "checkpoints" });
  replace(env.body, box);
  const view = { sort: "steps", asc: false };
  let list = [];
  const draw = () => replace(box, list.length ? checkpointTable(list, view, (v) => { Object.assign(view, v); draw(); }) : h("p", { class: "muted" }, "No checkpoints yet."));
  env.live.on(["checkpoints"], async () => {
    list = (await api(`/trials/${env.id}/checkpoints`, { signal: env.signal() })).checkpoints;
    draw();
  });
}
