"""The embedding tables a ps_config's ``sparse_files`` name, read in chunks, without TensorFlow.

An entry of ``sparse_files`` is one of:

* the original's sparse-model directory (reference §3.2): ``<entry>/key`` (int64 ``[N]``) and
  ``<entry>/emb_vector`` (float32 ``[N, dim]``, row ``i`` for ``key[i]``), both without header;
* one table of a ``sok.dump`` (or NVIDIA SOK) checkpoint, named ``<checkpoint dir>/<table>``: the
  files ``<checkpoint dir>/<table>-key`` and ``<table>-weight``, read and checked through
  sok-core's :mod:`~sparse_operation_kit.checkpoint.format` (headers, sizes, the manifest, and the
  CRC-32 checksums; only the weights, never optimizer state). No conversion step is needed.
  The key file is checksummed at open; the weight file by :meth:`TableSource.verify`, which a
  loader calls before it stores any row, so a corrupt checkpoint leaves its databases untouched.

Keys come out as int64; uint64 keys keep their bits (``2**64 - 1`` reads as ``-1``).

Unlike the original loader, the size of ``emb_vector`` is checked against ``N x dim``: a wrong
``embedding_vecsize_per_table`` is an error, not silently misread rows.

Example::

    from hierarchical_parameter_server.model_files import open_table

    table = open_table("model/emb0", dim=16)
    table.rows                                  # 30000
    table.verify()                              # ModelFileError if the weights are corrupt
    for keys, rows in table.chunks(4096):       # int64 [n], float32 [n, 16]
        tier.insert("hps_et.foo.emb0", keys, rows)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from sparse_operation_kit.checkpoint import directory as ckdir
from sparse_operation_kit.checkpoint import format as fmt

__all__ = ["ModelFileError", "TableSource", "open_table"]

log = logging.getLogger(__name__)

KEY_FILE = "key"
VECTOR_FILE = "emb_vector"
#: Rows per read of :meth:`TableSource.verify`.
_VERIFY_ROWS = 1 << 16


class ModelFileError(ValueError):
    """A table's files cannot be served: the message names the file, what is wrong and how to fix it."""


@dataclass(frozen=True)
class TableSource:
    """The rows of one table on disk.

    Attributes:
        path: the ``sparse_files`` entry.
        rows: keys in the table.
        dim: floats per row.
        format: ``"hps"`` (a sparse-model directory) or ``"sok"`` (a checkpoint table).
    """

    path: str
    rows: int
    dim: int
    format: str
    _keys: np.ndarray  # int64 [rows]
    _vectors: np.ndarray  # float32 [rows, dim], a read-only memory map
    _header: bytes  # the checkpoint weight file's header (empty for "hps")
    _crc32: str | None  # the manifest's checksum of the weight file, or None

    @property
    def keys(self) -> np.ndarray:
        """Every key of the table, int64 ``[rows]`` in file order (read-only)."""
        keys = self._keys.view()
        keys.flags.writeable = False
        return keys

    def verify(self) -> None:
        """Check a checkpoint's weight file against the manifest's checksum, reading it once;
        nothing to check for a sparse-model directory (it has no checksum). Call it before storing
        any row: :meth:`chunks` finds a mismatch only after its last chunk.

        Raises:
            ModelFileError: the weight file does not match the manifest's checksum.

        Example::

            table = open_table("ckpt/emb_0", 8)
            table.verify()                      # before the first row goes anywhere
        """
        if self._crc32 is None:
            return
        crc = fmt.update_crc32(self._header)
        for first in range(0, self.rows, _VERIFY_ROWS):
            crc = fmt.update_crc32(np.ascontiguousarray(self._vectors[first : first + _VERIFY_ROWS]), crc)
        self._check_crc(crc)

    def _check_crc(self, crc: int) -> None:
        if f"{crc:08x}" != self._crc32:
            raise ModelFileError(
                f"{self.path}: the weight file does not match the checkpoint's checksum ({crc:08x} != "
                f"{self._crc32}): the file is corrupt; dump the checkpoint again"
            )

    def chunks(self, chunk_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The table's rows in file order, ``chunk_rows`` at a time: ``(int64 [n], float32 [n, dim])``,
        fresh arrays the caller may keep.

        A checkpoint's weight file is checksummed while it is read too: a mismatch (a file changed
        since :meth:`verify`) raises :class:`ModelFileError` after the last chunk.

        Raises:
            ValueError: ``chunk_rows`` is below 1.
            ModelFileError: the weight file does not match the manifest's checksum.
        """
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows!r}")
        crc = fmt.update_crc32(self._header) if self._crc32 is not None else 0
        for first in range(0, self.rows, chunk_rows):
            vectors = np.array(self._vectors[first : first + chunk_rows], dtype=np.float32)
            if self._crc32 is not None:
                crc = fmt.update_crc32(vectors, crc)
            yield self._keys[first : first + chunk_rows].copy(), vectors
        if self._crc32 is not None:
            self._check_crc(crc)


def open_table(entry: str | os.PathLike, dim: int) -> TableSource:
    """Open one table of ``sparse_files`` and check its files.

    Args:
        entry: a sparse-model directory (holding ``key`` and ``emb_vector``) or
            ``<checkpoint dir>/<table>`` of a ``sok.dump`` checkpoint.
        dim: the row width the config gives (``embedding_vecsize_per_table``).

    Raises:
        ModelFileError: the entry is neither; a file is empty, truncated, or not ``rows x dim``;
            the checkpoint is inconsistent.

    Example::

        open_table("ckpt/emb_0", 8).rows    # the rows sok.dump wrote for emb_0
    """
    path = os.fspath(entry)
    if dim < 1:
        raise ModelFileError(f"{path}: dim must be >= 1, got {dim!r}")
    if os.path.isfile(os.path.join(path, KEY_FILE)):
        return _open_hps(path, dim)
    directory, table = os.path.split(os.path.normpath(path))
    if os.path.isfile(os.path.join(directory, fmt.key_file(table))):
        return _open_checkpoint(path, directory, table, dim)
    raise ModelFileError(
        f"{path}: no table there; expected a sparse-model directory with the files {KEY_FILE!r} and "
        f"{VECTOR_FILE!r}, or <checkpoint dir>/<table> of a sok.dump checkpoint (files <table>-key and "
        "<table>-weight); check sparse_files in the ps_config"
    )


def _open_hps(path: str, dim: int) -> TableSource:
    key_path, vec_path = os.path.join(path, KEY_FILE), os.path.join(path, VECTOR_FILE)
    if not os.path.isfile(vec_path):
        raise ModelFileError(f"{vec_path} is missing: a sparse-model directory holds {KEY_FILE!r} and {VECTOR_FILE!r}")
    key_bytes, vec_bytes = os.path.getsize(key_path), os.path.getsize(vec_path)
    for file, size, item in ((key_path, key_bytes, 8), (vec_path, vec_bytes, 4)):
        if size == 0:
            raise ModelFileError(f"{file} is empty: a table needs at least one row")
        if size % item:
            raise ModelFileError(f"{file} has {size} bytes, not a whole number of {item}-byte values: it is truncated")
    rows = key_bytes // 8
    if vec_bytes != rows * dim * 4:
        found = vec_bytes / (rows * 4)
        raise ModelFileError(
            f"{vec_path} has {vec_bytes} bytes; {rows} keys x dim {dim} x 4 bytes would be {rows * dim * 4}. "
            f"The file holds {found:g} floats per key: set embedding_vecsize_per_table to the table's dim, or "
            "rewrite the files"
        )
    keys = np.fromfile(key_path, dtype=np.int64)
    vectors = np.memmap(vec_path, dtype=np.float32, mode="r", shape=(rows, dim))
    log.debug("opened sparse-model table %s: %d rows x %d", path, rows, dim)
    return TableSource(path, rows, dim, "hps", keys, vectors, b"", None)


def _open_checkpoint(path: str, directory: str, table: str, dim: int) -> TableSource:
    """The table read through one handle of the checkpoint directory
    (:func:`~sparse_operation_kit.checkpoint.directory.read_consistently`): a ``sok.dump`` that replaces the
    checkpoint meanwhile makes it read the new one again, never mix the files of two."""

    def read(ckpt: ckdir.OpenCheckpoint) -> TableSource:
        key_info, weight_info, rows = ckpt.table_files(table)
        found = weight_info.elements // rows if rows else dim
        if found != dim:
            raise ModelFileError(
                f"{weight_info.path} holds rows of {found} floats, but the ps_config gives dim {dim}: set "
                "embedding_vecsize_per_table to the table's dim"
            )
        entry = fmt.check_against_manifest(directory, table, ckpt.manifest, [key_info, weight_info], dim)
        crcs = entry.crc32 if entry is not None else {}
        key_crc = crcs.get(os.path.basename(key_info.path))
        keys = fmt.read_payload(key_info, 1, key_crc).reshape(-1) if rows else np.empty(0, key_info.dtype)
        keys = keys.view(np.int64) if keys.dtype == np.uint64 else keys.astype(np.int64)
        with fmt.open_file(weight_info.path, weight_info.dir_fd) as f:
            header = f.read(fmt.HEADER_BYTES)
        # a memory map stays valid after the directory handle closes
        vectors = fmt.payload(weight_info, rows, dim) if rows else np.empty((0, dim), np.float32)
        weight_crc = crcs.get(os.path.basename(weight_info.path))
        return TableSource(path, rows, dim, "sok", keys, vectors, header, weight_crc)

    try:
        source = ckdir.read_consistently(directory, read)
    except fmt.CheckpointError as e:
        raise ModelFileError(f"{path}: {e}") from e
    log.debug("opened checkpoint table %s: %d rows x %d", path, source.rows, dim)
    return source
