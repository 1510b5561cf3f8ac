// The learning-curves tab: every trial's curve of one metric on one chart (charts.js), streamed from
// Determined's trials-sample stream, downsampled on the server, the best N in colour.
import { stream } from "../../api.js";
import { learningCurves } from "../../charts.js";
import { h, replace } from "../../dom.js";

function smallerIsBetter(page, name) {
  const s = page.data().experiment.config?.searcher || {};
  if (name === s.metric) return s.smaller_is_better !== false;
  return !/acc|auc|f1|precision|recall|score|iou|bleu/i.test(name);
}

// Points per trial to ask for: one per pixel column for a few trials, fewer as trials add up, so a page
// never takes more than ~POINT_BUDGET points (1,000 trials: 320 each, ~9 MB) however large the search.
const POINT_BUDGET = 320000;
function pointsPerTrial(width, trials) {
  return Math.max(32, Math.min(1000, Math.floor(width), Math.floor(POINT_BUDGET / Math.max(1, trials || 1))));
}

export function curves(page) {
  const params = new URLSearchParams(location.search);
  const view = {
    group: params.get("group") || "",
    metric: params.get("metric") || "",
    log: params.get("scale") === "log",
    best: Number(params.get("best") || 5),
  };
  const picker = h("select", {
    "aria-label": "metric",
    id: "metric-picker",
    onchange: (e) => {
      [view.group, view.metric] = JSON.parse(e.target.value);
      restart();
    },
  });
  const scale = h(
    "select",
    {
      "aria-label": "y scale",
      onchange: (e) => {
        view.log = e.target.value === "log";
        draw();
      },
    },
    h("option", { value: "linear" }, "linear"),
    h("option", { value: "log", selected: view.log }, "log"),
  );
  const bestN = h("input", {
    type: "number",
    min: 0,
    max: 50,
    value: view.best,
    style: { width: "54px" },
    "aria-label": "best N",
    onchange: (e) => {
      view.best = Number(e.target.value) || 0;
      draw();
    },
  });
  const note = h("span", { class: "muted", id: "curves-note" });
  const chartBox = h("div", { class: "chart", id: "learning-curves" });
  replace(
    page.body,
    h(
      "div",
      { class: "toolbar" },
      h("label", {}, "Metric", picker),
      h("label", {}, "Y", scale),
      h("label", {}, "Highlight best", bestN),
      note,
    ),
    chartBox,
  );

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
  page.aborts.push({ abort: () => document.removeEventListener("visibilitychange", onVisibility) });
  if (document.visibilityState !== "hidden") openNames();

  function openNames() {
    names = null;
    namesController = new AbortController();
    page.aborts.push(namesController);
    stream(`/experiments/${page.id}/metrics-stream/metric-names`, {
      params: { periodSeconds: 2 },
      signal: namesController.signal,
      onMessage: (m) => {
        const first = names === null;
        names = m;
        const current = JSON.stringify([view.group, view.metric]);
        const options = m.metricNames.flatMap((g) => g.metricNames.map((n) => [g.group, n]));
        replace(
          picker,
          m.metricNames.map((g) =>
            h(
              "optgroup",
              { label: g.group },
              g.metricNames.map((n) => h("option", { value: JSON.stringify([g.group, n]) }, n)),
            ),
          ),
        );
        if (!options.length) {
          note.textContent = "No metrics reported yet.";
          return;
        }
        if (!options.some((o) => JSON.stringify(o) === current)) {
          const preferred =
            options.find(([g, n]) => g === "validation" && n === m.searcherMetric) ||
            options.find(([g]) => g === "validation") ||
            options[0];
          [view.group, view.metric] = preferred;
        }
        picker.value = JSON.stringify([view.group, view.metric]);
        if (first || !signal) restart();
      },
    }).catch((e) => {
      if (e.name !== "AbortError") page.error(e.message);
    });
  }

  function restart() {
    if (!view.metric) return;
    const q = new URLSearchParams(location.search);
    q.set("group", view.group);
    q.set("metric", view.metric);
    history.replaceState(null, "", `${location.pathname}?${q}`);
    byTrial.clear();
    if (signal) signal.controller.abort();
    const controller = new AbortController();
    page.aborts.push(controller);
    signal = { controller };
    const width = chartBox.getBoundingClientRect().width || 1000;
    asked = pointsPerTrial(width, page.data().experiment?.numTrials);
    stream(`/experiments/${page.id}/metrics-stream/trials-sample`, {
      params: { metricName: view.metric, group: view.group, maxDatapoints: asked, periodSeconds: 1 },
      signal: controller.signal,
      onMessage: (m) => {
        for (const t of m.trials) byTrial.set(t.trialId, t);
        scheduleDraw();
      },
    }).catch((e) => {
      if (e.name !== "AbortError") page.error(e.message);
    });
  }

  function scheduleDraw() {
    if (!drawTimer)
      drawTimer = setTimeout(() => {
        drawTimer = null;
        draw();
      }, 100);
  }

  function draw() {
    const trials = [...byTrial.values()].filter((t) => t.data.length).sort((a, b) => a.trialId - b.trialId);
    if (plot) {
      plot.destroy();
      plot = null;
    }
    chartBox.replaceChildren();
    if (!trials.length) {
      note.textContent = "No data for this metric yet.";
      return;
    }
    const smaller = smallerIsBetter(page, view.metric);
    const score = (t) => {
      let best = smaller ? Infinity : -Infinity;
      for (const p of t.data) best = smaller ? Math.min(best, p.value) : Math.max(best, p.value);
      return best;
    };
    const ranked = [...trials].sort((a, b) => (smaller ? score(a) - score(b) : score(b) - score(a)));
    const best = new Set(ranked.slice(0, view.best).map((t) => t.trialId));
    const points = trials.reduce((n, t) => n + t.data.length, 0);
    note.textContent = `${trials.length} trial${trials.length === 1 ? "" : "s"} · ${points.toLocaleString("en-US")} points (downsampled on the server) · best ${Math.min(view.best, trials.length)} in colour: ${ranked
      .slice(0, Math.min(view.best, 5))
      .map((t) => `#${t.trialId}`)
      .join(" ")}`;
    const log = view.log && trials.every((t) => t.data.every((p) => p.value > 0));
    plot = learningCurves(chartBox, trials, {
      metric: view.metric,
      log,
      best,
      columns: asked,
      onClick: (trialId) => page.navigate(`/trials/${trialId}`),
    });
    chartBox.dataset.series = String(trials.length);
    // When the curves were first drawn and painted (the next frame), in ms since navigation start: the
    // benchmark's "interactive" marker (bench/webui_curves.py).
    if (!firstDraw) {
      firstDraw = true;
      requestAnimationFrame(() => {
        chartBox.dataset.drawnAt = String(Math.round(performance.now()));
        performance.mark("curves-drawn");
      });
    }
  }
  page.aborts.push({
    abort: () => {
      if (plot) plot.destroy();
      clearTimeout(drawTimer);
    },
  });
}
