// Charts drawn by uPlot (vendored: webui/vendor/uPlot.iife.min.js, MIT). Learning curves put every trial
// on one chart: the server sends each trial's min/max-downsampled curve; here the points are put on one
// shared step grid (each grid bucket keeps its min and max again), as uPlot wants aligned columns.
import { h, hparamsText, num } from "./dom.js";

const PALETTE = [
  "#2f6db5",
  "#d9480f",
  "#2b8a3e",
  "#ae3ec9",
  "#e8590c",
  "#1098ad",
  "#c2255c",
  "#5c940d",
  "#f08c00",
  "#4263eb",
];
export const color = (i) => PALETTE[i % PALETTE.length];

function width(el) {
  return Math.max(320, Math.floor(el.getBoundingClientRect().width || 800) - 14);
}

// trials: [{trialId, hparams, data: [{batches, value}]}] → [xs, ...ys] on a grid of ≤ 2 × buckets columns.
export function alignCurves(trials, buckets) {
  let maxStep = 0;
  for (const t of trials) for (const p of t.data) if (p.batches > maxStep) maxStep = p.batches;
  // A power of two, as the server's bucket widths are: each grid bucket then holds whole server buckets
  // (no aliasing between the two grids, which draws a beat pattern on a noisy, trending curve).
  let w = 1;
  while ((maxStep + 1) / w > buckets) w *= 2;
  const cols = 2 * (Math.floor(maxStep / w) + 1);
  const xs = new Array(cols);
  for (let i = 0; i < cols; i++) xs[i] = Math.floor(i / 2) * w + (i % 2 ? w / 2 : 0);
  const ys = trials.map((t) => {
    const y = new Array(cols).fill(null);
    const lo = new Map(),
      hi = new Map();
    for (const p of t.data) {
      const b = Math.floor(p.batches / w);
      const l = lo.get(b),
        u = hi.get(b);
      if (!l || p.value < l.value) lo.set(b, p);
      if (!u || p.value > u.value) hi.set(b, p);
    }
    for (const [b, l] of lo) {
      const u = hi.get(b);
      const [first, second] = l.batches <= u.batches ? [l, u] : [u, l];
      y[2 * b] = first.value;
      y[2 * b + 1] = second.value;
    }
    return y;
  });
  return [xs, ...ys];
}

// One chart, one line per trial. opts: {metric, log, best: Set of highlighted trial ids, onClick(trialId)}.
export function learningCurves(container, trials, opts) {
  const tooltip = h("div", { class: "tooltip", style: { display: "none" } });
  const target = h("div");
  container.append(target, tooltip);
  // No more grid columns than the points asked per trial (opts.columns): 1,000 trials × 160 columns, not × 1,000.
  const buckets = Math.max(
    16,
    Math.min(500, Math.floor(width(container) / 2), Math.floor((opts.columns || 1000) / 2)),
  );
  const data = alignCurves(trials, buckets);
  const best = opts.best || new Set();
  let bestIndex = 0;
  const series = [
    { label: "batches" },
    ...trials.map((t) => {
      const top = best.has(t.trialId);
      return {
        label: `trial ${t.trialId}`,
        spanGaps: true,
        points: { show: false },
        stroke: top ? color(bestIndex++) : "rgba(120,130,150,0.35)",
        width: top ? 2 : 1,
      };
    }),
  ];
  let focused = -1;
  const plot = new uPlot(
    {
      width: width(container),
      height: opts.height || 380,
      series,
      legend: { show: false },
      scales: { x: { time: false }, y: { distr: opts.log ? 3 : 1 } },
      axes: [{ label: "batches" }, { label: opts.metric, size: 70 }],
      focus: { alpha: 0.25 },
      cursor: {
        // The grid is sparse (a trial has a value only in the columns of its own buckets), and uPlot 1.6.32
        // treats null as a value unless told to skip it: the cursor's index then holds null for every
        // series, no line is ever "closest", focus never changes and the tooltip never shows. Skipping
        // null makes each series' cursor index its nearest real point.
        hover: { skip: [null, undefined] },
        focus: { prox: 24 },
        drag: { x: true, y: false },
        points: { show: false },
      },
      hooks: {
        setSeries: [
          (u, idx) => {
            focused = idx ?? -1;
            showTip(u);
          },
        ],
        setCursor: [(u) => showTip(u)],
      },
    },
    data,
    target,
  );

  function showTip(u) {
    const i = focused > 0 && u.cursor.idxs ? u.cursor.idxs[focused] : null;
    if (focused < 1 || i === null || i === undefined || u.cursor.left < 0) {
      tooltip.style.display = "none";
      delete container.dataset.hoverTrial;
      return;
    }
    const t = trials[focused - 1];
    const v = u.data[focused][i];
    container.dataset.hoverTrial = String(t.trialId);
    tooltip.replaceChildren(
      h("b", {}, `Trial ${t.trialId}`),
      ` · ${opts.metric} ${num(v)} at ≈${num(Math.round(u.data[0][i]))} batches`,
      h("br"),
      hparamsText(t.hparams) || "no hyperparameters",
      h("br"),
      h("span", { class: "muted" }, "click to open the trial"),
    );
    tooltip.style.display = "block";
    const over = u.over.getBoundingClientRect(),
      box = container.getBoundingClientRect();
    const left = u.cursor.left + over.left - box.left + 14;
    tooltip.style.left = `${Math.max(0, Math.min(left, box.width - tooltip.offsetWidth - 4))}px`;
    tooltip.style.top = `${u.cursor.top + over.top - box.top + 14}px`;
  }
  let downAt = null;
  plot.over.addEventListener("mousedown", (e) => {
    downAt = [e.clientX, e.clientY];
  });
  plot.over.addEventListener("mouseup", (e) => {
    if (downAt && Math.abs(e.clientX - downAt[0]) < 4 && Math.abs(e.clientY - downAt[1]) < 4 && focused > 0)
      opts.onClick(trials[focused - 1].trialId);
    downAt = null;
  });
  plot.over.addEventListener("mouseleave", () => {
    tooltip.style.display = "none";
    delete container.dataset.hoverTrial;
  });
  plot.over.style.cursor = "pointer";
  container.plot = plot; // for tests and the console: the chart's scales and data (valToPos, data)
  return plot;
}

// Several named series against steps (a trial's metrics): series [{label, points: [[step, value]]}].
export function lineChart(container, title, seriesList, { log = false, height = 240 } = {}) {
  const steps = [...new Set(seriesList.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
  const index = new Map(steps.map((s, i) => [s, i]));
  const ys = seriesList.map((s) => {
    const y = new Array(steps.length).fill(null);
    for (const [x, v] of s.points) y[index.get(x)] = v;
    return y;
  });
  const box = h("div", { class: "chart" }, h("h3", {}, title));
  container.append(box);
  return new uPlot(
    {
      width: width(box),
      height,
      series: [
        { label: "batches" },
        ...seriesList.map((s, i) => ({
          label: s.label,
          stroke: color(i),
          width: 1.5,
          spanGaps: true,
          points: { show: s.points.length < 60 },
        })),
      ],
      scales: { x: { time: false }, y: { distr: log ? 3 : 1 } },
      axes: [{}, { size: 60 }],
    },
    [steps, ...ys],
    box,
  );
}

// Points (x, y): the metric against one hyperparameter.
export function scatter(container, title, xs, ys, labels, { xlog = false } = {}) {
  const order = xs.map((_, i) => i).sort((a, b) => xs[a] - xs[b]);
  const box = h("div", { class: "chart" }, h("h3", {}, title));
  container.append(box);
  return new uPlot(
    {
      width: width(box),
      height: 240,
      legend: { show: false },
      series: [
        {},
        {
          stroke: "#2f6db5",
          fill: "rgba(47,109,181,0.3)",
          paths: () => null,
          points: { show: true, size: 7, width: 1 },
        },
      ],
      scales: { x: { time: false, distr: xlog ? 3 : 1 }, y: {} },
      axes: [{ label: labels[0] }, { label: labels[1], size: 60 }],
    },
    [order.map((i) => xs[i]), order.map((i) => ys[i])],
    box,
  );
}
