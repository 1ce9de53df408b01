#!/usr/bin/env python
"""HPS lookups per tier on a GPU, against ``tf.gather`` on a ``tf.Variable`` resident on that GPU.

The same measurement as ``hps_cpu.py`` (same options, same table and batches, same printout)
under a CUDA TensorFlow: the embedding cache lives on the first GPU TensorFlow sees, the batches
and the ``tf.gather`` baseline's variable too. The published figure to beat: NVIDIA's TF + HPS on
an A100 served a 4,096-sample DLRM batch (26 keys, dim 128) in 1,459 us (reference §5), so run it
with ``--dim 128`` for that comparison.

Exits with status 2 and a message when TensorFlow sees no GPU.

Usage::

    .venv/bin/python benchmarks/hps_gpu.py --dim 128 --rows 1572864
    .venv/bin/python benchmarks/hps_gpu.py --quick
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")  # the Redis and RocksDB tiers share the machine

import hps_cpu  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    import tensorflow as tf

    if not tf.config.list_logical_devices("GPU"):
        print(
            f"hps_gpu.py needs a GPU: TensorFlow {tf.__version__} sees none (built with CUDA: "
            f"{tf.test.is_built_with_cuda()}). Install a CUDA TensorFlow (pip install tensorflow[and-cuda]) on a "
            f"machine with an NVIDIA GPU, or run benchmarks/hps_cpu.py",
            file=sys.stderr,
        )
        return 2
    return hps_cpu.main(argv, device="/GPU:0")


if __name__ == "__main__":
    sys.exit(main())
