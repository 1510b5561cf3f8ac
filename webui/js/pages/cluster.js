// The cluster page: Slurm's partitions and nodes with their GPUs used and free (read by the master from
// scontrol, cached a few seconds, so any number of open pages cost Slurm one call per period), and the
// platform's queued trial runs with Slurm's pending reason and since when.
import { api } from "../api.js";
import { duration, h, link, num, replace, stateBadge, time } from "../dom.js";

const REFRESH_MS = 5000;

export function render(root) {
  const note = h("span", { class: "muted", id: "cluster-note" });
  const error = h("p", { class: "error", id: "cluster-error" });
  const pools = h("div", { id: "partitions" });
  const nodes = h("div", { id: "nodes", class: "node-grid" });
  const queue = h("div", { id: "queue" });
  root.append(h("div", { class: "header" }, h("h1", {}, "Cluster"), note), error,
    h("h2", {}, "Partitions"), pools, h("h2", {}, "Nodes"), nodes, h("h2", {}, "Queued trial runs"), queue);
  const controller = new AbortController();
  let timer = null;

  async function load() {
    try {
      const data = await api("/webui/cluster", { signal: controller.signal });
      draw(data);
    } catch (e) {
      if (e.name === "AbortError") return;
      error.textContent = e.message;
    }
    timer = setTimeout(load, REFRESH_MS);
  }

  function draw(data) {
    const gpus = data.agents.reduce((a, n) => [a[0] + n.numSlots, a[1] + n.slotsUsed, a[2] + n.slotsFree], [0, 0, 0]);
    note.textContent = `${data.agents.length} node${data.agents.length === 1 ? "" : "s"} · ${gpus[0]} GPUs: ${gpus[1]} used, ${gpus[2]} free · read from Slurm at ${time(data.fetchedAt)} (refreshed every ${data.cacheSeconds} s)`;
    error.textContent = data.error ? `Slurm could not be read: ${data.error}` : "";
    replace(pools, data.resourcePools.length ? table(
      ["Partition", "State", "Nodes", "GPUs used", "GPUs free", "Max time", "Priority tier", "Preemption"],
      data.resourcePools.map((p) => h("tr", { "data-partition": p.name },
        h("td", {}, h("b", {}, p.name), p.defaultComputePool ? h("span", { class: "muted" }, " (default)") : ""),
        h("td", {}, stateBadge(p.state)),
        h("td", {}, p.agentIds.join(", ")),
        h("td", {}, gpuBar(p.slotsUsed, p.slotsAvailable)),
        h("td", { class: "num" }, num(p.slotsFree)),
        h("td", {}, p.maxTime === "UNLIMITED" ? "unlimited" : p.maxTime),
        h("td", { class: "num" }, num(p.priorityTier)),
        h("td", {}, p.preemptMode)))) : h("p", { class: "muted" }, "No partitions."));
    replace(nodes, data.agents.length ? data.agents.map((n) => h("div", { class: "panel node", "data-node": n.id },
      h("div", { class: "node-head" }, h("b", {}, n.id), stateBadge(n.state)),
      h("div", { class: "slots", title: `${n.slotsUsed} of ${n.numSlots} GPUs held by jobs` },
        Array.from({ length: n.numSlots }, (_, i) => h("span", { class: `slot ${i < n.slotsUsed ? "used" : "free"}` }))),
      h("div", { class: "gpus" }, `${n.numSlots} GPU${n.numSlots === 1 ? "" : "s"}${n.gpuType ? ` (${n.gpuType})` : ""}: ${n.slotsUsed} used, ${n.slotsFree} free`),
      h("div", { class: "muted" }, `CPUs ${n.cpusUsed}/${n.cpus} · memory ${num(n.memoryUsedMb)}/${num(n.memoryMb)} MB`),
      h("div", { class: "muted" }, `partitions ${n.resourcePools.join(", ")}`),
      n.reason ? h("div", { class: "error" }, n.reason) : "")) : h("p", { class: "muted" }, "No nodes."));
    replace(queue, data.queued.length ? table(
      ["Trial", "Experiment", "Owner", "Run", "Slurm job", "Waiting in", "Reason", "Since"],
      data.queued.map((r) => h("tr", { "data-run": r.id },
        h("td", {}, link(`/trials/${r.trialId}`, `#${r.trialId}`)),
        h("td", {}, link(`/experiments/${r.experimentId}`, r.experimentName || `#${r.experimentId}`)),
        h("td", {}, r.owner),
        h("td", { class: "num" }, num(r.trialRunId)),
        h("td", {}, r.slurmJobId || h("span", { class: "muted" }, "not submitted")),
        h("td", {}, r.waitingIn || "–"),
        h("td", {}, r.pendingReason || stateBadge(r.state)),
        h("td", {}, r.pendingSince ? `${time(r.pendingSince)} (${duration(r.pendingSince)})` : h("span", { class: "muted" }, `submitted ${time(r.submitTime)}`))))) : h("p", { class: "muted" }, "No trial runs are queued."));
  }

  load();
  return () => { controller.abort(); clearTimeout(timer); };
}

function table(headers, rows) {
  return h("div", { class: "table-wrap" }, h("table", {}, h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))), h("tbody", {}, rows)));
}

function gpuBar(used, total) {
  const pct = total ? (100 * used) / total : 0;
  return h("span", { title: `${used} of ${total} GPUs used` }, h("span", { class: "progress" }, h("span", { style: { width: `${pct}%` } })), ` ${used} / ${total}`);
}
