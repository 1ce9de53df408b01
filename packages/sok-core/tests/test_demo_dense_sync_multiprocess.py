"""sok.broadcast_dense_variables and sok.allreduce_dense_gradients on two Horovod ranks (Gloo, CPU),
against NumPy oracles (``distributed/dense_sync_worker.py``; one launch for every check), and in one
process, where both are identities."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

sys.path.insert(0, str(Path(__file__).parent / "distributed"))
import dense_sync_worker  # noqa: E402
from harness import assert_passed, launch, results  # noqa: E402

WORKER = Path(__file__).parent / "distributed" / "dense_sync_worker.py"
NP = 2


@pytest.fixture(scope="module")
def worker_run() -> tuple[int, str, dict]:
    pytest.importorskip("horovod.tensorflow")
    returncode, output = launch(WORKER, NP, timeout=240)
    return returncode, output, results(output)


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", list(dense_sync_worker.CHECKS))
def test_check_passes_on_every_rank(worker_run, name):
    returncode, output, found = worker_run
    assert_passed(found, name, NP, returncode, output)


def test_single_process_is_the_identity():
    import sparse_operation_kit as sok
    import tensorflow as tf

    layer = tf.keras.layers.Dense(2)
    layer.build((None, 3))
    before = [w.numpy() for w in layer.weights]
    assert sok.broadcast_dense_variables(layer) == 2
    assert all(np.array_equal(w.numpy(), b) for w, b in zip(layer.weights, before))
    grads = [tf.ones([3, 2]), tf.ones([2])]
    assert sok.allreduce_dense_gradients(grads, layer.weights) == grads
    with pytest.raises(ValueError, match="op 'max' is not valid"):
        sok.allreduce_dense_gradients(grads, layer.weights, op="max")
