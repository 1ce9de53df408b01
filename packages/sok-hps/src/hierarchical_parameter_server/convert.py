"""SOK checkpoints to HPS's sparse-model layout (``sok ckpt convert``), without TensorFlow.

HPS reads each embedding table of a sparse model from a directory of two raw files:
``<output>/<table>/key`` (``int64 [N]``) and ``<output>/<table>/emb_vector`` (``float32 [N, dim]``,
row ``i`` for the ``i``-th key). A checkpoint of ``sok.dump`` (or NVIDIA SOK) is checked first as
``sok ckpt inspect`` checks it (checksums included), through sok-core's
:mod:`~sparse_operation_kit.checkpoint_inspect` and :mod:`~sparse_operation_kit.checkpoint_format`.

Example::

    from hierarchical_parameter_server.convert import convert_to_hps

    convert_to_hps("ckpt", "hps_model")   # ["hps_model/emb_0", ...]
"""

from __future__ import annotations

import os

import numpy as np
from sparse_operation_kit import checkpoint_format as fmt
from sparse_operation_kit.checkpoint_inspect import inspect
from sparse_operation_kit.progress import Callback, NoOpCallback

__all__ = ["convert_to_hps"]


def convert_to_hps(path: str, output: str, callback: Callback | None = None) -> list[str]:
    """Write each table of a checkpoint in HPS's sparse-model layout: ``<output>/<table>/key``
    (int64; uint64 keys keep their bits) and ``emb_vector`` (float32 rows, in the keys' order).

    Args:
        path: the checkpoint directory (``sok.dump``'s or NVIDIA SOK's).
        output: the directory of the sparse model; made when missing, and a table's files in it are
            replaced.
        callback: progress (one step per table).

    Returns:
        The table directories written, in table-name order.

    Raises:
        CheckpointError: the checkpoint fails a check of ``sok ckpt inspect`` (a missing,
            truncated or corrupt file); nothing is written then.
    """
    info = inspect(path)
    callback = callback or NoOpCallback()
    callback.set_size(len(info["tables"]))
    written = []
    for table in info["tables"]:
        target = os.path.join(output, table)
        os.makedirs(target, exist_ok=True)
        key_info = fmt.read_header(os.path.join(path, fmt.key_file(table)))
        weight_info = fmt.read_header(os.path.join(path, fmt.weight_file(table)))
        keys = fmt.payload(key_info)
        np.asarray(keys.view(np.int64) if keys.dtype == np.uint64 else keys, dtype=np.int64).tofile(
            os.path.join(target, "key")
        )
        np.asarray(fmt.payload(weight_info), dtype=np.float32).tofile(os.path.join(target, "emb_vector"))
        written.append(target)
        callback.relative_update(1)
    return written
