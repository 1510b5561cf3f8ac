"""slots_per_trial → nodes × GPUs per node."""

from __future__ import annotations

import pytest

from hpc_master.errors import ClientError
from slurm_backend.resources import NodeShape, slots_to_nodes


@pytest.mark.parametrize(
    ("slots", "per_node", "shape"),
    [
        (4, 2, NodeShape(2, 2)),
        (1, 2, NodeShape(1, 1)),
        (2, 2, NodeShape(1, 2)),
        (3, 4, NodeShape(1, 3)),  # fits one node: no multiple needed
        (8, 4, NodeShape(2, 4)),
        (16, 8, NodeShape(2, 8)),
        (0, 2, NodeShape(1, 0)),  # CPU-only
        (0, 0, NodeShape(1, 0)),
    ],
)
def test_shapes(slots: int, per_node: int, shape: NodeShape) -> None:
    assert slots_to_nodes(slots, per_node) == shape
    assert shape.slots == slots


def test_not_a_multiple() -> None:
    with pytest.raises(ClientError) as e:
        slots_to_nodes(3, 2)
    assert e.value.message == "slots_per_trial 3 is not a multiple of the pool's 2 slots per node"
    assert e.value.field == "resources.slots_per_trial"


def test_gpus_on_cpu_only_pool() -> None:
    with pytest.raises(ClientError, match=r"asks for GPUs, but this resource pool is CPU-only"):
        slots_to_nodes(2, 0)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_bad_slot_counts(bad: object) -> None:
    with pytest.raises(ClientError, match="slots_per_trial must be a whole number"):
        slots_to_nodes(bad, 2)  # type: ignore[arg-type]
