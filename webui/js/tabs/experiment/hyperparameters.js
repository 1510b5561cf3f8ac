// The hyperparameters tab: parallel coordinates over the numeric hyperparameters coloured by the metric
// (a small SVG: uPlot has no such chart), and the metric against each hyperparameter (uPlot scatter).
import { api, stream } from "../../api.js";
import { scatter } from "../../charts.js";
import { flatten, h, hparamsText, num, replace } from "../../dom.js";

const SVG = "http://www.w3.org/2000/svg";
const s = (tag, attrs = {}, ...kids) => {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  el.append(...kids);
  return el;
};

export function hyperparameters(page) {
  const e = page.data().experiment;
  const metric = e.searcherMetric;
  const smaller = e.config?.searcher?.smaller_is_better !== false;
  const step = h("input", {
    type: "number",
    min: 0,
    placeholder: "each trial's best",
    style: { width: "130px" },
    "aria-label": "step",
  });
  const apply = h("button", { class: "small", onclick: () => load() }, "Show");
  const note = h("span", { class: "muted", id: "hp-note" });
  const pc = h("div", { class: "chart", id: "pcoords" });
  const grid = h("div", { class: "hp-grid", id: "hp-scatter" });
  replace(
    page.body,
    h("div", { class: "toolbar" }, h("label", {}, `${metric} at step`, step), apply, note),
    pc,
    h("h2", {}, `${metric} against each hyperparameter`),
    grid,
  );

  async function load() {
    let points;
    if (step.value === "") {
      const trials = (await api(`/webui/experiments/${page.id}/trials`, { signal: page.signal() })).trials;
      points = trials
        .filter((t) => t.bestValidationMetric !== null)
        .map((t) => ({ trialId: t.id, hparams: t.hparams, metric: t.bestValidationMetric }));
      note.textContent = `${points.length} trials, each at its best validation`;
    } else {
      points = [];
      const at = Number(step.value);
      await stream(`/experiments/${page.id}/metrics-stream/trials-snapshot`, {
        params: {
          metricName: metric,
          group: "validation",
          batchesProcessed: at,
          batchesMargin: Math.max(1, Math.round(at * 0.05)),
        },
        signal: page.signal(),
        onMessage: (m) => {
          points = m.trials;
        },
      });
      note.textContent = `${points.length} trials reported ${metric} within 5% of step ${at}`;
    }
    draw(points);
  }

  function draw(points) {
    pc.replaceChildren();
    grid.replaceChildren();
    if (!points.length) {
      pc.append(h("p", { class: "muted" }, "No validation results yet."));
      return;
    }
    const rows = points.map((p) => ({ ...p, hp: flatten(p.hparams) }));
    const keys = Object.keys(rows[0].hp).filter(
      (k) =>
        rows.every((r) => typeof r.hp[k] === "number" || typeof r.hp[k] === "string") &&
        new Set(rows.map((r) => r.hp[k])).size > 1,
    );
    parallel(pc, rows, keys, metric, smaller, (id) => page.navigate(`/trials/${id}`));
    for (const k of keys.filter((k) => rows.every((r) => typeof r.hp[k] === "number"))) {
      const xs = rows.map((r) => r.hp[k]);
      scatter(
        grid,
        k,
        xs,
        rows.map((r) => r.metric),
        [k, metric],
        { xlog: xs.every((x) => x > 0) && Math.max(...xs) / Math.min(...xs) > 100 },
      );
    }
  }
  // Live: drawn again when a validation or a trial changed (the experiment's change stream).
  page.live.on(["validations", "trials"], load, { minIntervalMs: 1000, spacing: 5 });
}

function parallel(box, rows, keys, metric, smaller, onClick) {
  const axes = [...keys, metric];
  const width = Math.max(500, box.getBoundingClientRect().width - 20),
    height = 300,
    pad = 40;
  const x = (i) => pad + (i * (width - 2 * pad)) / Math.max(1, axes.length - 1);
  const scales = axes.map((k, i) => {
    const vals = rows.map((r) => (i === axes.length - 1 ? r.metric : r.hp[k]));
    if (vals.every((v) => typeof v === "number")) {
      const lo = Math.min(...vals),
        hi = Math.max(...vals);
      const log = lo > 0 && hi / lo > 100;
      const f = log ? Math.log10 : (v) => v;
      return {
        label: (v) => num(v),
        pos: (v) => (hi === lo ? 0.5 : (f(v) - f(lo)) / (f(hi) - f(lo))),
        lo,
        hi,
      };
    }
    const cats = [...new Set(vals.map(String))].sort();
    return { cats, pos: (v) => (cats.length === 1 ? 0.5 : cats.indexOf(String(v)) / (cats.length - 1)) };
  });
  const y = (i, v) => height - pad - scales[i].pos(v) * (height - 2 * pad);
  const m = scales[axes.length - 1];
  const colour = (v) => {
    const t = m.hi === m.lo ? 0.5 : (v - m.lo) / (m.hi - m.lo);
    const good = smaller ? 1 - t : t;
    return `hsl(${Math.round(10 + good * 200)}, 70%, 45%)`;
  };
  const svg = s("svg", { class: "pcoords", width, height, viewBox: `0 0 ${width} ${height}` });
  const tooltip = h("div", { class: "tooltip", style: { display: "none" } });
  const lines = s("g", {});
  for (const r of rows) {
    const d = axes
      .map(
        (k, i) =>
          `${i ? "L" : "M"}${x(i).toFixed(1)},${y(i, i === axes.length - 1 ? r.metric : r.hp[k]).toFixed(1)}`,
      )
      .join(" ");
    // A wide transparent twin takes the pointer: a 1-pixel line is too thin to hover or click.
    const line = s(
      "g",
      { class: "trial", "data-trial": r.trialId },
      s("path", { d, stroke: colour(r.metric), class: "line" }),
      s("path", { d, class: "hit" }),
    );
    line.addEventListener("click", () => onClick(r.trialId));
    line.addEventListener("mousemove", (ev) => {
      lines.append(line); // drawn last, on top of the others
      tooltip.replaceChildren(
        h("b", {}, `Trial ${r.trialId}`),
        ` · ${metric} ${num(r.metric)}`,
        h("br"),
        hparamsText(r.hparams) || "no hyperparameters",
        h("br"),
        h("span", { class: "muted" }, "click to open the trial"),
      );
      tooltip.style.display = "block";
      const at = box.getBoundingClientRect();
      tooltip.style.left = `${Math.max(0, Math.min(ev.clientX - at.left + 14, at.width - tooltip.offsetWidth - 4))}px`;
      tooltip.style.top = `${ev.clientY - at.top + 14}px`;
      box.dataset.hoverTrial = String(r.trialId);
    });
    line.addEventListener("mouseleave", () => {
      tooltip.style.display = "none";
      delete box.dataset.hoverTrial;
    });
    lines.append(line);
  }
  svg.append(lines);
  axes.forEach((k, i) => {
    svg.append(s("line", { x1: x(i), x2: x(i), y1: pad, y2: height - pad, stroke: "#98a2b3" }));
    svg.append(
      s(
        "text",
        {
          x: x(i),
          y: 16,
          "text-anchor": i === 0 ? "start" : i === axes.length - 1 ? "end" : "middle",
          style: "font-weight:600;fill:#1d2430",
        },
        k,
      ),
    );
    const sc = scales[i];
    const ticks = sc.cats ? sc.cats : [sc.lo, sc.hi];
    for (const t of ticks)
      svg.append(s("text", { x: x(i) + 4, y: y(i, sc.cats ? t : t) + 4 }, sc.cats ? t : num(t)));
  });
  box.append(
    h("h3", {}, `Parallel coordinates (colour: ${metric}, blue is best; click a line to open its trial)`),
    svg,
    tooltip,
  );
}
