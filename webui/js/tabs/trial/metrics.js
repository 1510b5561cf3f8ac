// The metrics tab: one chart per metric name, each group (training, validation) a series.
import { api } from "../../api.js";
import { lineChart } from "../../charts.js";
import { h, replace } from "../../dom.js";

export function metrics(page) {
  const grid = h("div", { class: "charts-grid", id: "trial-charts" });
  replace(page.body, grid);
  let last = "";
  const plots = [];
  // A new report raises the trial's steps (its row) or adds a metric row: either way, fetch again (spaced
  // out while it trains).
  page.live.on(
    ["trial", "metrics"],
    async () => {
      const data = await api("/trials/time-series", {
        params: { trialIds: page.id, maxDatapoints: 1000 },
        signal: page.signal(),
      });
      const groups = data.trials[0].metrics;
      const key = JSON.stringify(
        groups.map((g) => [g.group, g.data.length, g.data.length && g.data[g.data.length - 1].batches]),
      );
      if (key === last) return;
      last = key;
      const byName = new Map();
      for (const g of groups)
        for (const p of g.data)
          for (const [name, v] of Object.entries(p.values)) {
            if (!byName.has(name)) byName.set(name, new Map());
            const series = byName.get(name);
            if (!series.has(g.group)) series.set(g.group, []);
            series.get(g.group).push([p.batches, v]);
          }
      for (const p of plots.splice(0)) p.destroy();
      grid.replaceChildren();
      if (!byName.size) {
        grid.append(h("p", { class: "muted" }, "No metrics reported yet."));
        return;
      }
      for (const [name, series] of [...byName].sort())
        plots.push(
          lineChart(
            grid,
            name,
            [...series].map(([group, points]) => ({ label: group, points })),
          ),
        );
    },
    { minIntervalMs: 500, spacing: 5 },
  );
}
