"""Worker of test_gpu_pinning_multiprocess.py, run under ``horovodrun -np N --gloo`` on a host with
N GPUs, each rank seeing all of them (no ``CUDA_VISIBLE_DEVICES``).

``sok.init()`` must pin each rank to its own GPU: a dynamic table and a lookup land there, a
Horovod allreduce of a GPU tensor (NCCL) gives the sum over the ranks, and the process holds a CUDA
context on that GPU only (the driver's primary context state of every GPU, through libcuda).
Prints ``CHECK <name> rank=<r> PASS|FAIL <detail>`` per check.
"""

from __future__ import annotations

import ctypes
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import sparse_operation_kit as sok  # noqa: E402
import tensorflow as tf  # noqa: E402
from harness import print_stacks_before_timeout  # noqa: E402


def contexts() -> list[int]:
    """The CUDA ordinals (all of the host's) on which this process holds an active primary context."""
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    count = ctypes.c_int()
    assert cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
    active = []
    for ordinal in range(count.value):
        device, flags, state = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        assert cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0
        assert cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(state)) == 0
        if state.value:
            active.append(ordinal)
    return active


def check(name: str, problem: str | None) -> None:
    print(f"CHECK {name} rank={hvd.rank()} {'FAIL ' + problem if problem else 'PASS'}", flush=True)


def main() -> int:
    print_stacks_before_timeout()
    hvd.init()
    sok.init()
    mine = hvd.local_rank()
    var = sok.DynamicVariable(dimension=4, var_type="hbm", initializer="1")
    rows = tf.nn.embedding_lookup(var, tf.constant([3, 5], tf.int64))
    check(
        "table_on_own_gpu",
        None if var.storage.device == f"cuda:{mine}" and rows.numpy().sum() == 8.0 else f"{var.storage.device}",
    )
    with tf.device("/GPU:0"):
        total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
    expected = hvd.size() * (hvd.size() + 1) / 2
    check("nccl_allreduce", None if np.isclose(total.numpy()[0], expected) else f"{total.numpy()} != {expected}")
    hvd.allreduce(tf.constant(0.0), name="every_rank_has_run")  # before anyone reads the contexts
    active = contexts()
    check("contexts_on_own_gpu_only", None if active == [mine] else f"contexts on GPUs {active}, expected [{mine}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
