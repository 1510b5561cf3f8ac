// The checkpoints table, and the tab that shows it live (an experiment's or a trial's checkpoints).
import { api } from "../api.js";
import { bytes, copyable, h, link, replace, stateBadge, stateName, time } from "../dom.js";
import { table } from "./table.js";

const size = (c) => Object.values(c.resources || {}).reduce((a, b) => a + (Number(b) || 0), 0);

const COLUMNS = [
  { key: "uuid", label: "UUID", render: (c) => h("code", {}, c.uuid) },
  {
    key: "trial",
    label: "Trial",
    num: true,
    value: (c) => c.training.trialId,
    render: (c) => link(`/trials/${c.training.trialId}`, `#${c.training.trialId}`),
  },
  { key: "steps", label: "Steps", num: true, value: (c) => c.stepsCompleted },
  { key: "metric", label: "Metric", num: true, value: (c) => c.training.searcherMetric },
  { key: "size", label: "Size", num: true, value: size, render: (c) => bytes(size(c)) },
  { key: "state", label: "State", value: (c) => stateName(c.state), render: (c) => stateBadge(c.state) },
  { key: "time", label: "Reported", value: (c) => c.reportTime, render: (c) => time(c.reportTime) },
  {
    key: "cmd",
    label: "Download",
    sortable: false,
    render: (c) => copyable(`det checkpoint download ${c.uuid}`),
  },
];

// The tab: `path` lists the checkpoints (GET, Determined's shape); fetched again when they change.
export function checkpointsTab(page, path) {
  const view = { sort: "steps", asc: false };
  const box = h("div", { id: "checkpoints" });
  replace(page.body, box);
  let list = [];
  const draw = () =>
    replace(
      box,
      table(COLUMNS, list, {
        view,
        onSort: (v) => {
          Object.assign(view, v);
          draw();
        },
        empty: h("p", { class: "muted" }, "No checkpoints yet."),
      }),
    );
  page.live.on(["checkpoints"], async () => {
    list = (await api(path, { signal: page.signal() })).checkpoints;
    draw();
  });
}
