"""The older ``sparse_operation_kit.experiment`` namespace of SOK's documentation.

Everything is the main API, except ``lookup_sparse(params, sp_ids, hotness, combiners)``, whose
``hotness`` (the most ids of a sample, per table) is checked as an upper bound.

Example::

    from sparse_operation_kit import experiment as sok
    emb1, emb2 = sok.lookup_sparse([v1, v2], [ids1, ids2], hotness=[3, 2], combiners=["sum", "sum"])
"""

from __future__ import annotations

from typing import Any

from sparse_operation_kit import tf_version
from sparse_operation_kit.checkpoint.collective import dump, load
from sparse_operation_kit.communication import init, num_ranks, rank, set_comm_tool
from sparse_operation_kit.distributed_variable import DistributedVariable, LocalizedVariable, Variable
from sparse_operation_kit.dynamic_variable import DynamicVariable, assign, export, sparse_read_and_evict
from sparse_operation_kit.lookup import all2all_dense_embedding
from sparse_operation_kit.lookup import lookup_sparse as _lookup_sparse
from sparse_operation_kit.optimizer import SGD, OptimizerWrapper, filter_variables

__all__ = [
    "DistributedVariable",
    "DynamicVariable",
    "LocalizedVariable",
    "OptimizerWrapper",
    "SGD",
    "Variable",
    "all2all_dense_embedding",
    "assign",
    "dump",
    "export",
    "filter_variables",
    "init",
    "load",
    "lookup_sparse",
    "num_ranks",
    "rank",
    "set_comm_tool",
    "sparse_read_and_evict",
    "tf_version",
]


def lookup_sparse(params: Any, sp_ids: Any, hotness: Any = None, combiners: Any = None, sp_weights: Any = None) -> Any:
    """``sok.lookup_sparse`` with ``hotness``: one int per table, the most ids any sample may have
    (checked on every rank together)."""
    return _lookup_sparse(params, sp_ids, sp_weights, combiners, hotness=hotness)
