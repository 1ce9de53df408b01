"""SOK checkpoints to HPS's sparse-model layout (``sok ckpt convert``), without TensorFlow.

HPS reads each embedding table of a sparse model from a directory of two raw files:
``<output>/<table>/key`` (``int64 [N]``) and ``<output>/<table>/emb_vector`` (``float32 [N, dim]``,
row ``i`` for the ``i``-th key). A checkpoint of ``sok.dump`` (or NVIDIA SOK) is checked first as
``sok ckpt inspect`` checks it (checksums included), through sok-core's
:mod:`~sparse_operation_kit.checkpoint_inspect` and :mod:`~sparse_operation_kit.checkpoint_format`,
and its files are read through the same directory handle (a dump that replaces the checkpoint
meanwhile makes the conversion start again, never mixes two checkpoints). A table whose name is
not a plain name (``..``, one with a ``/``) is refused before anything is written, so every file
written is inside ``output``.

Example::

    from hierarchical_parameter_server.convert import convert_to_hps

    convert_to_hps("ckpt", "hps_model")   # ["hps_model/emb_0", ...]
"""

from __future__ import annotations

import os

import numpy as np
from sparse_operation_kit import checkpoint_dir as ckdir
from sparse_operation_kit import checkpoint_format as fmt
from sparse_operation_kit.checkpoint_inspect import describe
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
            truncated or corrupt file; a table name that is not a plain name, e.g. ``..``); nothing
            is written then.
        CheckpointChanged: dumps replaced ``path`` during each of the conversion's reads.
    """
    return ckdir.read_consistently(path, lambda ckpt: _convert(ckpt, output, callback or NoOpCallback()))


def _convert(ckpt: ckdir.OpenCheckpoint, output: str, callback: Callback) -> list[str]:
    """:func:`convert_to_hps` of an open checkpoint."""
    tables = [fmt.check_name(table, "table", ckpt.path) for table in describe(ckpt)["tables"]]
    callback.set_size(len(tables))
    written = []
    for table in tables:
        target = os.path.join(output, table)
        os.makedirs(target, exist_ok=True)
        key_info, weight_info, _ = ckpt.table_files(table)
        keys = fmt.payload(key_info)
        np.asarray(keys.view(np.int64) if keys.dtype == np.uint64 else keys, dtype=np.int64).tofile(
            os.path.join(target, "key")
        )
        np.asarray(fmt.payload(weight_info), dtype=np.float32).tofile(os.path.join(target, "emb_vector"))
        written.append(target)
        callback.relative_update(1)
    return written
