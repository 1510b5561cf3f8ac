import { h } from "../dom.js";

export function render(root) {
  root.append(h("h1", {}, "Cluster"), h("p", { class: "muted" }, "Partitions, nodes and the queue are not shown yet: use sinfo and squeue on a login node."));
}
