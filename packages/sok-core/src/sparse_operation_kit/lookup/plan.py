"""Who holds what in one ``sok.lookup_sparse`` call: the owner of each id, the ranks that hold each
table, and the columns each rank sends back.

A distributed ``sok.Variable`` holds row ``i`` on rank ``i % n`` (at local row ``i // n``); a
localized one (``mode="localized:r"``) and a localized ``sok.DynamicVariable`` hold every row on
rank ``r``; a distributed ``sok.DynamicVariable`` holds key ``k`` on rank ``k mod n`` (the key's
int64 bits for uint64 keys: where ``sok.load`` places them). Every rank builds the same plan from the
call's tables, so each knows, without asking, which ranks send it columns of which table.

Example::

    plan = ExchangePlan.of([v1, v2], ["distributed", "localized"], rank=0, n=2)
    plan.held(1)     # [0, 1] when v2 is localized on rank 1
    plan.width(0)    # v1's dim: rank 0 sends back only the columns of the tables it holds
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from sparse_operation_kit import device_ops, tf_ops

__all__ = ["ExchangePlan", "TablePlan", "dynamic_groups", "fused_tables", "owners", "shard"]


@dataclass(frozen=True)
class TablePlan:
    """One table of the call: ``kind`` is ``"distributed"``, ``"localized"`` or ``"dynamic"``;
    ``holders`` the ranks that hold rows of it (one rank for a localized table)."""

    param: Any
    kind: str
    dim: int
    holders: tuple[int, ...]


@dataclass(frozen=True)
class ExchangePlan:
    """The tables of one call on ``n`` ranks, as seen from ``rank``."""

    tables: tuple[TablePlan, ...]
    rank: int
    n: int

    @classmethod
    def of(cls, params: Sequence[Any], kinds: Sequence[str], rank: int, n: int) -> ExchangePlan:
        tables = []
        for param, kind in zip(params, kinds):
            target = param.target_gpu if kind != "distributed" else -1
            holders = (target,) if target >= 0 else tuple(range(n))
            tables.append(TablePlan(param, kind, int(param.shape[-1]), holders))
        return cls(tuple(tables), rank, n)

    def spread(self) -> list[int]:
        """The tables every rank holds rows of (distributed and dynamic ones), in call order: each
        rank sends back partial sums of them, which the requester adds."""
        return [t for t, table in enumerate(self.tables) if len(table.holders) == self.n]

    def held(self, rank: int) -> list[int]:
        """The tables (indices in the call) that ``rank`` holds rows of: the spread ones, then those
        it holds alone (localized on it), each part in call order. The order of the columns of the
        block it sends back, so the spread tables' columns lead every block alike."""
        alone = [t for t, table in enumerate(self.tables) if table.holders == (rank,) and self.n > 1]
        return self.spread() + alone

    def width(self, rank: int) -> int:
        """The columns ``rank`` sends back per sample: the dims of the tables it holds."""
        return sum(self.tables[t].dim for t in self.held(rank))

    def columns(self, rank: int) -> dict[int, int]:
        """The first column of each table ``rank`` holds, in the block it sends back."""
        offsets, offset = {}, 0
        for t in self.held(rank):
            offsets[t] = offset
            offset += self.tables[t].dim
        return offsets

    def reports_status(self, rank: int) -> bool:
        """Whether ``rank`` sends a status row: it holds a dynamic table, whose lookup may fail."""
        return any(self.tables[t].kind == "dynamic" for t in self.held(rank))


def owners(plan: ExchangePlan, keys: tf.Tensor, tables: tf.Tensor) -> tf.Tensor:
    """The rank (int64) that holds each of ``keys``: the ids of the call one table after the other
    (int64, a uint64 table's keys as their bits), ``tables`` the table of each (int64). A table
    with one holder (localized) sends every id there, the others id ``i`` to rank ``i mod n``
    (negative ids and keys too, as sok.load places them). One set of ops for all the tables."""
    spread = device_ops.floormod(keys, plan.n)
    single = [table.holders[0] if len(table.holders) == 1 else -1 for table in plan.tables]
    if all(holder < 0 for holder in single):
        return spread
    holder = tf.gather(tf.constant(single, tf.int64), tables)
    return tf.where(holder >= 0, holder, spread)


def shard(table: TablePlan, rank: int, n: int) -> tuple[int, int]:
    """``(stride, offset)`` of ``pooled_lookup`` for a static table that ``rank`` holds: a distributed
    table holds id ``i`` at row ``i // n`` when ``i % n == rank``, a localized one every id."""
    return (n, rank) if table.kind == "distributed" else (1, 0)


def fused_tables(params: Sequence[Any], kinds: Sequence[str]) -> list[int]:
    """The tables ``pooled_lookup`` takes, all on one device: the static ones on the host when there
    are any; else, when ``SokPooledLookup`` has GPU kernels, the static ones on the GPU of the first."""
    static = [i for i, k in enumerate(kinds) if k != "dynamic"]
    host = [i for i in static if not on_gpu(params[i])]
    if host or not static or not _pooled_lookup_has_gpu_kernels():
        return host
    gpu = _gpu_index(params[static[0]])
    return [i for i in static if _gpu_index(params[i]) == gpu]


def dynamic_groups(params: Sequence[Any], tables: Sequence[int]) -> list[list[int]]:
    """The dynamic ``tables`` that ``local_lookup.pool_dynamic`` pools, one group per device (in
    order of first appearance): every one on the host, those on a GPU when ``SokPooledLookup`` has
    GPU kernels there. The rest are left out (TensorFlow ops pool them)."""
    groups: dict[str, list[int]] = {}
    for t in tables:
        if on_gpu(params[t]) and not _pooled_lookup_has_gpu_kernels():
            continue
        groups.setdefault(tf.DeviceSpec.from_string(params[t].device).to_string(), []).append(t)
    return list(groups.values())


def on_gpu(param: Any) -> bool:
    """Whether a table (its variable's handle, and so its pooling) lives on a GPU."""
    return tf.DeviceSpec.from_string(param.device).device_type == "GPU"


def _gpu_index(param: Any) -> int | None:
    """The index of the GPU of ``param`` (of this process), however its device is spelled."""
    return tf.DeviceSpec.from_string(param.device).device_index


@functools.cache
def _pooled_lookup_has_gpu_kernels() -> bool:
    """Whether ``SokPooledLookup`` and its gradient have DEVICE_GPU kernels (sok-core's GPU kernels
    are loaded: a CUDA TensorFlow and a sok-core built with a CUDA toolkit)."""
    from tensorflow.python.framework import kernels  # TensorFlow's registry of op kernels

    tf_ops.library()  # loads the GPU kernels too, under a CUDA TensorFlow
    return all(
        any(kernel.device_type == "GPU" for kernel in kernels.get_registered_kernels_for_op(op).kernel)
        for op in ("SokPooledLookup", "SokPooledLookupGrad")
    )
