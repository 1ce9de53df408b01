"""Every error of SokPooledLookup and SokPooledLookupGrad on the CPU, text for text: the attributes,
the inputs' shapes and values, the ids outside a table or its shard. pooled_lookup_ops.h holds these
texts for both devices; test_pooled_lookup_gpu.py checks on a GPU that its kernels raise the same."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
from sparse_operation_kit import tf_ops  # noqa: E402

PARAMS = np.arange(20, dtype=np.float32).reshape(5, 4)
IDS = np.array([0, 4, 2], np.int64)
SPLITS = np.array([0, 1, 1, 3], np.int64)  # a batch of 3: one id, none, two


def _forward(**changes: Any) -> None:
    args = {
        "params": [PARAMS],
        "ids": [IDS],
        "row_splits": [SPLITS],
        "weights": [],
        "combiners": ["sum"],
        "names": ["t0"],
        "positions": [0],
        "strides": [],
        "offsets": [],
    }
    args.update(changes)
    with tf.device("/CPU:0"):
        tf_ops.library().sok_pooled_lookup(
            params=[tf.constant(p) for p in args.pop("params")],
            ids=[tf.constant(i) for i in args.pop("ids")],
            row_splits=[tf.constant(s) for s in args.pop("row_splits")],
            weights=[tf.constant(w) for w in args.pop("weights")],
            **args,
        )


def _gradient(**changes: Any) -> None:
    args = {
        "grads": [np.ones((3, 4), np.float32)],
        "ids": [IDS],
        "row_splits": [SPLITS],
        "weights": [],
        "combiners": ["sum"],
        "table_rows": [5],
        "padded": False,
        "strides": [],
        "offsets": [],
    }
    args.update(changes)
    with tf.device("/CPU:0"):
        tf_ops.library().sok_pooled_lookup_grad(
            grads=[tf.constant(g) for g in args.pop("grads")],
            ids=[tf.constant(i) for i in args.pop("ids")],
            row_splits=[tf.constant(s) for s in args.pop("row_splits")],
            weights=[tf.constant(w) for w in args.pop("weights")],
            **args,
        )


TWO = {"combiners": ["sum", "sum"], "names": ["t0", "t1"], "positions": [0, 1]}

CASES = [
    (_forward, {"combiners": ["max"]}, "combiners[0] = 'max' is not valid; valid: sum, mean, sqrtn"),
    (
        _forward,
        {"strides": [2, 2], "offsets": [0, 0]},
        "strides has 2 entries and offsets 2 for 1 tables; valid: both ",
    ),
    (_forward, {"strides": [2], "offsets": [2]}, "strides[0] = 2, offsets[0] = 2; valid: stride >= 1 and -1 <= "),
    (_forward, {"names": ["t0", "t1"]}, "SokPooledLookup: 1 combiners but 2 names and 1 positions"),
    (
        _forward,
        {"params": [PARAMS] * 2, "ids": [IDS] * 2, "row_splits": [SPLITS] * 2},
        "SokPooledLookup: 2 params for 1 combiners",
    ),
    (_forward, {"params": [PARAMS.ravel()]}, "params[0] must be [rows, dim], got [20]"),
    (_forward, {"ids": [IDS, IDS]}, "SokPooledLookup: 1 tables but 2 ids, 1 row_splits and 0 weights (valid: 0 or 1)"),
    (_forward, {"ids": [IDS.reshape(3, 1)]}, "ids[0] must be 1-D, got [3,1]"),
    (
        _forward,
        {**TWO, "params": [PARAMS] * 2, "ids": [IDS] * 2, "row_splits": [SPLITS, SPLITS[:3]]},
        "row_splits[1] must have shape [4] (batch + 1), got [3]",
    ),
    (
        _forward,
        {"row_splits": [np.array([1, 1, 1, 3], np.int64)]},
        "row_splits[0] must run from 0 to 3 (the ids), got 1 .. 3",
    ),
    (_forward, {"row_splits": [np.array([0, 2, 1, 3], np.int64)]}, "row_splits[0] decreases at row 1"),
    (_forward, {"weights": [np.ones(2, np.float32)]}, "weights[0] has 2 values for 3 ids"),
    (
        _forward,
        {"ids": [np.array([0, 7, 9], np.int64)], "names": ["small"], "positions": [4]},
        "sp_ids[4] has ids outside [0, 5) for table small: 2 of them, e.g. 7; static tables take ids 0 .. rows-1",
    ),
    (
        _forward,
        {"ids": [np.array([1, 11, 2], np.int64)], "strides": [2], "offsets": [1]},
        "sp_ids[0] has ids outside [0, 5) (this rank holds id i at row i / 2) for table t0: 1 of them, e.g. 11",
    ),
    (  # the CPU kernel checks the ids of a call its caller checked too (it waits on nothing)
        _forward,
        {"ids": [np.array([0, 7, 2], np.int64)], "checked": True},
        "sp_ids[0] has ids outside [0, 5) for table t0: 1 of them, e.g. 7",
    ),
    (_gradient, {"table_rows": [5, 5]}, "SokPooledLookupGrad: 1 combiners but 2 row counts"),
    (_gradient, {"table_rows": [-2]}, "table_rows[0] = -2; valid: the table's rows (>= 0), or -1 for ids that number "),
    (_gradient, {"grads": [np.ones(4, np.float32)]}, "grads[0] must be [batch, dim], got [4]"),
    (_gradient, {"grads": [np.ones((5, 4), np.float32)]}, "grads[0] has 5 rows for a batch of 3"),
    (_gradient, {"ids": [np.array([0, 5, 2], np.int64)]}, "ids[0] has ids outside [0, 5), the rows of its shard"),
    (_gradient, {"row_splits": [np.array([0, 2, 1, 3], np.int64)]}, "row_splits[0] decreases at row 1"),
]


@pytest.mark.parametrize(
    ("op", "changes", "message"), CASES, ids=[f"{c[0].__name__[1:]}-{i}" for i, c in enumerate(CASES)]
)
def test_each_error_names_the_value_and_what_is_valid(op, changes: dict, message: str) -> None:
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        op(**changes)
    assert message in error.value.message
