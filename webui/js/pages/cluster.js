// The cluster page: Slurm's partitions and nodes with their GPUs used and free (read by the master from
// scontrol, cached a few seconds, so any number of open pages cost Slurm one call per period), and the
// platform's queued trial runs with Slurm's pending reason and since when.
import { api } from "../api.js";
import { table } from "../components/table.js";
import { duration, h, link, num, replace, stateBadge, time, waitingBadge } from "../dom.js";
import { pageLife } from "../page.js";

const REFRESH_MS = 5000;

const PARTITIONS = [
  {
    key: "name",
    label: "Partition",
    render: (p) => [
      h("b", {}, p.name),
      p.defaultComputePool ? h("span", { class: "muted" }, " (default)") : "",
    ],
  },
  { key: "state", label: "State", render: (p) => stateBadge(p.state) },
  { key: "nodes", label: "Nodes", render: (p) => p.agentIds.join(", ") },
  { key: "used", label: "GPUs used", render: (p) => gpuBar(p.slotsUsed, p.slotsAvailable) },
  { key: "free", label: "GPUs free", num: true, value: (p) => p.slotsFree },
  { key: "maxTime", label: "Max time", render: (p) => (p.maxTime === "UNLIMITED" ? "unlimited" : p.maxTime) },
  { key: "tier", label: "Priority tier", num: true, value: (p) => p.priorityTier },
  { key: "preemption", label: "Preemption", render: (p) => p.preemptMode },
];

const QUEUED = [
  { key: "trial", label: "Trial", render: (r) => link(`/trials/${r.trialId}`, `#${r.trialId}`) },
  {
    key: "experiment",
    label: "Experiment",
    render: (r) => link(`/experiments/${r.experimentId}`, r.experimentName || `#${r.experimentId}`),
  },
  { key: "owner", label: "Owner", render: (r) => r.owner },
  { key: "run", label: "Run", num: true, value: (r) => r.trialRunId },
  {
    key: "job",
    label: "Slurm job",
    render: (r) => r.slurmJobId || h("span", { class: "muted" }, "not submitted"),
  },
  { key: "where", label: "Waiting in", render: (r) => r.waitingIn || "–" },
  { key: "reason", label: "Reason", render: (r) => waitingBadge(r) || stateBadge(r.state) },
  {
    key: "since",
    label: "Since",
    render: (r) =>
      r.pendingSince
        ? `${time(r.pendingSince)} (${duration(r.pendingSince)})`
        : h("span", { class: "muted" }, `submitted ${time(r.submitTime)}`),
  },
];

export function render(root) {
  const note = h("span", { class: "muted", id: "cluster-note" });
  const error = h("p", { class: "error", id: "cluster-error" });
  const pools = h("div", { id: "partitions" });
  const nodes = h("div", { id: "nodes", class: "node-grid" });
  const queue = h("div", { id: "queue" });
  root.append(
    h("div", { class: "header" }, h("h1", {}, "Cluster"), note),
    error,
    h("h2", {}, "Partitions"),
    pools,
    h("h2", {}, "Nodes"),
    nodes,
    h("h2", {}, "Queued trial runs"),
    queue,
  );
  const life = pageLife(error);

  async function load() {
    const data = await api("/webui/cluster", { signal: life.signal() });
    const gpus = data.agents.reduce(
      (a, n) => [a[0] + n.numSlots, a[1] + n.slotsUsed, a[2] + n.slotsFree],
      [0, 0, 0],
    );
    note.textContent = `${data.agents.length} node${data.agents.length === 1 ? "" : "s"} · ${gpus[0]} GPUs: ${gpus[1]} used, ${gpus[2]} free · read from Slurm at ${time(data.fetchedAt)} (refreshed every ${data.cacheSeconds} s)`;
    error.textContent = data.error ? `Slurm could not be read: ${data.error}` : "";
    replace(
      pools,
      table(PARTITIONS, data.resourcePools, {
        rowAttrs: (p) => ({ "data-partition": p.name }),
        empty: h("p", { class: "muted" }, "No partitions."),
      }),
    );
    replace(nodes, data.agents.length ? data.agents.map(node) : h("p", { class: "muted" }, "No nodes."));
    replace(
      queue,
      table(QUEUED, data.queued, {
        rowAttrs: (r) => ({ "data-run": r.id }),
        empty: h("p", { class: "muted" }, "No trial runs are queued."),
      }),
    );
  }

  life.every(load, REFRESH_MS);
  return () => life.close();
}

function node(n) {
  return h(
    "div",
    { class: "panel node", "data-node": n.id },
    h("div", { class: "node-head" }, h("b", {}, n.id), stateBadge(n.state)),
    h(
      "div",
      { class: "slots", title: `${n.slotsUsed} of ${n.numSlots} GPUs held by jobs` },
      Array.from({ length: n.numSlots }, (_, i) =>
        h("span", { class: `slot ${i < n.slotsUsed ? "used" : "free"}` }),
      ),
    ),
    h(
      "div",
      { class: "gpus" },
      `${n.numSlots} GPU${n.numSlots === 1 ? "" : "s"}${n.gpuType ? ` (${n.gpuType})` : ""}: ${n.slotsUsed} used, ${n.slotsFree} free`,
    ),
    h(
      "div",
      { class: "muted" },
      `CPUs ${n.cpusUsed}/${n.cpus} · memory ${num(n.memoryUsedMb)}/${num(n.memoryMb)} MB`,
    ),
    h("div", { class: "muted" }, `partitions ${n.resourcePools.join(", ")}`),
    n.reason ? h("div", { class: "error" }, n.reason) : "",
  );
}

function gpuBar(used, total) {
  const pct = total ? (100 * used) / total : 0;
  return h(
    "span",
    { title: `${used} of ${total} GPUs used` },
    h("span", { class: "progress" }, h("span", { style: { width: `${pct}%` } })),
    ` ${used} / ${total}`,
  );
}
