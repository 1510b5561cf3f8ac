"""slots_per_trial → nodes × GPUs per node, from the resource pool's slots per node. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from det_errors import ClientError

FIELD = "resources.slots_per_trial"


@dataclass(frozen=True)
class NodeShape:
    nodes: int
    gpus_per_node: int  # 0: a CPU-only job

    @property
    def slots(self) -> int:
        return self.nodes * self.gpus_per_node


def _is_whole_number(value: object) -> bool:
    """An int ≥ 0 (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= 0


def slots_to_nodes(slots_per_trial: int, slots_per_node: int, *, single_node: bool = False) -> NodeShape:
    """Fill whole nodes: 4 slots at 2 per node → 2 × 2; 1 slot → 1 × 1; 0 slots → one CPU-only node.

    A trial that fits on one node takes one node with exactly its slots; a larger one must be a multiple of the
    pool's slots per node, so that every node runs the same number of ranks, and is refused when `single_node`
    (``resources.is_single_node``).
    """
    if not _is_whole_number(slots_per_trial):
        raise ClientError(f"slots_per_trial must be a whole number ≥ 0, not {slots_per_trial!r}", field=FIELD)
    if not _is_whole_number(slots_per_node):
        raise ClientError(
            f"the pool's slots per node must be a whole number ≥ 0, not {slots_per_node!r}",
            field="slurm.slots_per_node",
        )
    if slots_per_trial == 0:
        return NodeShape(nodes=1, gpus_per_node=0)
    if slots_per_node == 0:
        raise ClientError(
            f"slots_per_trial {slots_per_trial} asks for GPUs, but this resource pool is CPU-only "
            "(0 slots per node); use slots_per_trial: 0",
            field=FIELD,
        )
    if slots_per_trial <= slots_per_node:
        return NodeShape(nodes=1, gpus_per_node=slots_per_trial)
    if single_node:
        raise ClientError(
            f"slots_per_trial {slots_per_trial} does not fit on one node ({slots_per_node} slots per node) and "
            "resources.is_single_node is true",
            field=FIELD,
        )
    if slots_per_trial % slots_per_node:
        raise ClientError(
            f"slots_per_trial {slots_per_trial} is not a multiple of the pool's {slots_per_node} slots per node",
            field=FIELD,
        )
    return NodeShape(nodes=slots_per_trial // slots_per_node, gpus_per_node=slots_per_node)
