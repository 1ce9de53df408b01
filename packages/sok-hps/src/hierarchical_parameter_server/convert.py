"""SOK checkpoints to HPS's sparse-model layout (``sok ckpt convert``), without TensorFlow.

HPS reads each embedding table of a sparse model from a directory of two raw files:
``<output>/<table>/key`` (``int64 [N]``) and ``<output>/<table>/emb_vector`` (``float32 [N, dim]``,
row ``i`` for the ``i``-th key). A checkpoint of ``sok.dump`` (or NVIDIA SOK) is checked first as
``sok ckpt inspect`` checks it (checksums included), through sok-core's
:mod:`~sparse_operation_kit.checkpoint.inspect` and :mod:`~sparse_operation_kit.checkpoint.format`,
and its files are read through the same directory handle (a dump that replaces the checkpoint
meanwhile makes the conversion start again, never mixes two checkpoints). A table whose name is
not a plain name (``..``, one with a ``/``) is refused before anything is written, so every file
written is inside ``output``. The whole conversion is written into a temporary directory beside
``output`` (``.<name>.sok-convert-<random>``) and its tables are moved into ``output`` only once
every table was read and written, so a failed or retried conversion leaves ``output`` as it was.

Example::

    from hierarchical_parameter_server.convert import convert_to_hps

    convert_to_hps("ckpt", "hps_model")   # ["hps_model/emb_0", ...]
"""

from __future__ import annotations

import os
import secrets
import shutil

import numpy as np
from sparse_operation_kit.checkpoint import directory as ckdir
from sparse_operation_kit.checkpoint import format as fmt
from sparse_operation_kit.checkpoint.inspect import describe
from sparse_operation_kit.progress import Callback, NoOpCallback

__all__ = ["convert_to_hps"]


def convert_to_hps(path: str, output: str, callback: Callback | None = None) -> list[str]:
    """Write each table of a checkpoint in HPS's sparse-model layout: ``<output>/<table>/key``
    (int64; uint64 keys keep their bits) and ``emb_vector`` (float32 rows, in the keys' order).

    Args:
        path: the checkpoint directory (``sok.dump``'s or NVIDIA SOK's).
        output: the directory of the sparse model; made when missing. Each table's directory in it
            is replaced whole (once every table is written); its other entries are kept.
        callback: progress (one step per table; counted again when a dump replaces the checkpoint
            during the conversion and it starts again).

    Returns:
        The table directories written, in table-name order.

    Raises:
        CheckpointError: the checkpoint fails a check of ``sok ckpt inspect`` (a missing,
            truncated or corrupt file; a table name that is not a plain name, e.g. ``..``).
        CheckpointChanged: dumps replaced ``path`` during each of the conversion's reads.
        NotADirectoryError: ``output`` is a file.
        OSError: writing failed (e.g. a full disk).

        On any of these ``output`` is left as it was.
    """
    output = os.path.abspath(output)
    if os.path.exists(output) and not os.path.isdir(output):
        raise NotADirectoryError(f"sok ckpt convert: the output {output} is a file; pass a directory path")
    parent = os.path.dirname(output)
    tables, temporary = ckdir.read_consistently(
        path, lambda ckpt: _convert(ckpt, parent, os.path.basename(output), callback or NoOpCallback())
    )
    try:
        _move_into_place(temporary, output, tables)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return [os.path.join(output, table) for table in tables]


def _convert(ckpt: ckdir.OpenCheckpoint, parent: str, name: str, callback: Callback) -> tuple[list[str], str]:
    """Write every table of an open checkpoint into ``<temporary>/tables/<table>``, a new directory
    ``.<name>.sok-convert-<random>`` of ``parent`` (made when missing, once the tables' names are
    checked; ``temporary`` is deleted again when anything fails): returns
    ``(tables, temporary)``."""
    tables = [fmt.check_name(table, "table", ckpt.path) for table in describe(ckpt)["tables"]]
    callback.set_size(len(tables))
    os.makedirs(parent, exist_ok=True)
    temporary = os.path.join(parent, f".{name}.sok-convert-{secrets.token_hex(4)}")
    os.mkdir(temporary)
    try:
        os.mkdir(os.path.join(temporary, "tables"))
        for table in tables:
            target = os.path.join(temporary, "tables", table)
            os.mkdir(target)
            key_info, weight_info, _ = ckpt.table_files(table)
            keys = fmt.payload(key_info)
            np.asarray(keys.view(np.int64) if keys.dtype == np.uint64 else keys, dtype=np.int64).tofile(
                os.path.join(target, "key")
            )
            np.asarray(fmt.payload(weight_info), dtype=np.float32).tofile(os.path.join(target, "emb_vector"))
            callback.relative_update(1)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return tables, temporary


def _move_into_place(temporary: str, output: str, tables: list[str]) -> None:
    """Make the written tables ``output``'s: rename ``<temporary>/tables`` to ``output`` when it is
    missing or empty, else move each table's directory in, the one it replaces set aside into
    ``<temporary>/replaced`` (deleted with ``temporary``)."""
    written = os.path.join(temporary, "tables")
    if not os.path.lexists(output) or (os.path.isdir(output) and not os.listdir(output)):
        os.replace(written, output)
        return
    replaced = os.path.join(temporary, "replaced")
    os.mkdir(replaced)
    for table in tables:
        target = os.path.join(output, table)
        if os.path.lexists(target):
            os.rename(target, os.path.join(replaced, table))
        os.rename(os.path.join(written, table), target)
