"""The on-disk format of SOK checkpoints: NVIDIA SOK's files plus a manifest. One source of truth.

A checkpoint is a directory with, per table (``<table>`` = the variable name with punctuation
replaced by ``_``, as NVIDIA SOK names it):

* ``<table>-key``: ``[N]`` keys (global row ids for static tables);
* ``<table>-weight``: ``[N, dim]`` float32 rows, in the order of the keys;
* ``<table>-<Optimizer>-<slot>``: ``[N, dim]`` optimizer state, same order (when dumped);

each with NVIDIA SOK's 296-byte header (big-endian uint32 fields: 256-byte table name, file type,
32-byte slot name, data type index), then the raw little-endian payload. Files written by NVIDIA SOK
load here and the other way round. ``manifest.json`` (ours; optional on load) records the format
version, tables, dims, dtypes, optimizer and step, slot names, the writer's world size and modes,
row counts and CRC-32 checksums (they catch corruption and truncation; they are no defence
against tampering).

Checksums use ISA-L's CRC-32 when the ``isal`` package is installed (the same checksum as zlib's,
about 6x faster: ``pip install sok-core[fast-crc]``; CI and the benchmarks install it) and zlib's
otherwise.
"""

from __future__ import annotations

import json
import os
import string
import struct
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

try:  # ISA-L: the same CRC-32 as zlib's, about 6x faster (the optional extra sok-core[fast-crc])
    from isal.isal_zlib import crc32 as _crc32
except ImportError:
    from zlib import crc32 as _crc32

#: Bytes read per system call (and checksummed per step) by :func:`read_payload`,
#: :func:`stream_payload` (rounded down to whole rows, at least one) and :func:`crc32`.
#: Cold reads of 16 MiB per call ran ~30% slower than one ``np.fromfile`` of a 2 GiB file on the
#: development VM; 64-256 MiB per call came within a few percent of it.
READ_CHUNK = 1 << 27

#: Version of manifest.json (the binary files are NVIDIA SOK's, unversioned).
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
HEADER_BYTES = 296
FILE_KEY, FILE_WEIGHT, FILE_STATE = 0, 1, 2

#: NVIDIA SOK's data type indices.
DTYPE_INDEX = {"int32": 0, "int64": 1, "uint32": 2, "uint64": 3, "float16": 4, "float32": 5, "float64": 6}
INDEX_DTYPE = {v: k for k, v in DTYPE_INDEX.items()}

#: Other (optimizer, slot) names NVIDIA SOK's files use for ours: it names Adamax files "Adam" (its
#: optimizer-name match lets the last substring win), and Keras 2 named Adamax's second slot "v".
SLOT_ALIASES = {("Adamax", "m"): [("Adam", "m")], ("Adamax", "u"): [("Adamax", "v"), ("Adam", "v")]}


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupt or does not match the variables."""


def table_name(variable_name: str) -> str:
    """NVIDIA SOK's file prefix of a variable: punctuation becomes ``_`` (``"emb:0"`` -> ``"emb_0"``)."""
    return "".join("_" if c in string.punctuation else c for c in variable_name)


def key_file(table: str) -> str:
    return f"{table}-key"


def weight_file(table: str) -> str:
    return f"{table}-weight"


def state_file(table: str, optimizer: str, slot: str) -> str:
    return f"{table}-{optimizer}-{slot}"


def header(file_type: int, dtype: str, slot: str = "") -> bytes:
    """The 296-byte header of one file."""
    name = " " * 256
    slot_field = slot.rjust(32, " ")
    if len(slot_field) != 32:
        raise CheckpointError(f"slot name {slot!r} is longer than the format's 32 bytes")
    return name.encode() + struct.pack(">I", file_type) + slot_field.encode() + struct.pack(">I", DTYPE_INDEX[dtype])


@dataclass(frozen=True)
class FileInfo:
    """What a file's header and size say."""

    path: str
    file_type: int
    slot: str
    dtype: str
    elements: int


def read_header(path: str) -> FileInfo:
    """Parse and check a file's header; CheckpointError names the file and the problem."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint file {path} is missing")
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise CheckpointError(
            f"checkpoint file {path} is truncated: {size} bytes, shorter than the {HEADER_BYTES}-byte header"
        )
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
    file_type = struct.unpack(">I", raw[256:260])[0]
    slot = raw[260:292].decode(errors="replace").strip()
    dtype_index = struct.unpack(">I", raw[292:296])[0]
    if file_type not in (FILE_KEY, FILE_WEIGHT, FILE_STATE) or dtype_index not in INDEX_DTYPE:
        raise CheckpointError(
            f"checkpoint file {path} has a corrupt header (file type {file_type}, dtype index {dtype_index})"
        )
    dtype = INDEX_DTYPE[dtype_index]
    itemsize = np.dtype(dtype).itemsize
    payload = size - HEADER_BYTES
    if payload % itemsize:
        raise CheckpointError(
            f"checkpoint file {path} is truncated: {payload} payload bytes is not a whole number of {dtype}"
        )
    return FileInfo(path, file_type, slot, dtype, payload // itemsize)


def payload(info: FileInfo, rows: int | None = None, dim: int | None = None) -> np.ndarray:
    """The file's data as a read-only memory map (``[rows, dim]`` when given)."""
    data = np.memmap(info.path, dtype=info.dtype, mode="r", offset=HEADER_BYTES, shape=(info.elements,))
    return data.reshape(rows, dim) if rows is not None and dim is not None else data


def read_payload(
    info: FileInfo, rows: int, expected_crc: str | None = None, select: np.ndarray | None = None
) -> np.ndarray:
    """Read a file's data once into fresh memory as ``[rows, elements // rows]``, checking it.

    A thread computes the CRC-32 of each chunk while the next one is read; the whole file's must
    equal ``expected_crc`` (8 hex digits, as the manifest holds it; None skips the check).

    Args:
        info: the file (its header already checked by :func:`read_header`).
        rows: rows of the file (its keys); 0 for an empty file.
        expected_crc: the manifest's checksum of the file, or None.
        select: ``bool [rows]``: keep only these rows (read chunk by chunk into a reused buffer
            and copied), so memory holds just the rows a rank owns; None keeps every row and reads
            straight into the result.

    Raises:
        CheckpointError: the file is shorter than its size said (truncated meanwhile) or does not
            match ``expected_crc``; it names the file.
    """
    width = info.elements // rows if rows else 0
    kept = rows if select is None else int(np.count_nonzero(select))
    out = np.empty((kept, width), info.dtype)
    _read_rows(info, rows, expected_crc, select, out=out)
    return out


def stream_payload(
    info: FileInfo,
    rows: int,
    consume: Callable[[int, np.ndarray], None],
    expected_crc: str | None = None,
    select: np.ndarray | None = None,
) -> None:
    """Read a file's rows once, chunk by chunk, and hand each chunk to ``consume`` while the next
    one is read; the file is checked as :func:`read_payload` checks it, but only at the end.

    Chunks are whole rows, about :data:`READ_CHUNK` bytes (at least one row), read into two reused
    buffers. The checksum thread chains each chunk's CRC-32 and a worker thread calls ``consume``
    on it (so ``consume`` should release the GIL, as the storage calls do, to overlap the reads); a
    buffer is read into again only when its CRC-32 and its ``consume`` call have finished, and the
    calls come in file order.

    ``consume`` sees rows that are not yet verified: a caller that keeps them must undo what it did
    when this raises.

    Args:
        info: the file (its header already checked by :func:`read_header`).
        rows: rows of the file (its keys); 0 for an empty file (``consume`` is not called).
        consume: ``consume(first_row, block)``: ``block [r, width]`` holds the kept rows
            ``first_row .. first_row + r - 1`` (indices among the kept rows: the file's rows
            without ``select``). Valid only during the call (its buffer is reused).
        expected_crc: the manifest's checksum of the file, or None.
        select: ``bool [rows]``: hand over only these rows (chunks without any are skipped);
            None hands over every row.

    Raises:
        CheckpointError: as :func:`read_payload`, after every call of ``consume`` has returned.
        Exception: the first exception of ``consume`` (KeyboardInterrupt too), as it was raised;
            ``consume`` is not called again after it.

    Example::

        # keys [N] read before; insert the weight file's rows while the file is read.
        stream_payload(info, N, lambda first, block: storage.insert_or_assign(keys[first : first + len(block)], block))
    """
    _read_rows(info, rows, expected_crc, select, consume=consume)


def _read_rows(
    info: FileInfo,
    rows: int,
    expected_crc: str | None,
    select: np.ndarray | None,
    out: np.ndarray | None = None,
    consume: Callable[[int, np.ndarray], None] | None = None,
) -> None:
    """The reading loop of :func:`read_payload` (``out``: the kept rows go there) and
    :func:`stream_payload` (``consume``). Every row of the file is read once, in whole-row chunks:
    straight into ``out`` when every row is kept, otherwise into two reused buffers. The checksum
    thread chains the CRC-32 of each chunk while the next one is read, and a worker thread copies
    the selected rows (into ``out``, or into a reused buffer) and calls ``consume``."""
    width = info.elements // rows if rows else 0
    step = max(1, READ_CHUNK // max(1, width * np.dtype(info.dtype).itemsize))
    direct = out is not None and select is None
    buffers = [] if direct else [np.empty((min(step, rows), width), info.dtype) for _ in range(2)]
    picked: list[np.ndarray] = []
    if select is not None and out is None:
        picked = [np.empty((min(step, int(np.count_nonzero(select))), width), info.dtype) for _ in range(2)]
    pending: list[list[Future]] = [[], []]  # per buffer: its CRC-32 and its work, both to finish before reuse
    with open(info.path, "rb", buffering=0) as f, ThreadPoolExecutor(1) as checksums:
        worker = ThreadPoolExecutor(1)
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            crc = checksums.submit(update_crc32, _read_exactly(f, memoryview(bytearray(HEADER_BYTES)), info.path))
            kept, work = 0, None
            for turn, start in enumerate(range(0, rows, step)):
                stop, slot = min(rows, start + step), turn % 2
                for future in pending[slot]:
                    future.result()  # raises the exception of a consume call
                target = out[start:stop] if direct else buffers[slot][: stop - start]
                raw = _read_exactly(f, memoryview(target.reshape(-1).view(np.uint8)), info.path)
                crc = checksums.submit(_chain_crc, raw, crc)
                pending[slot] = [crc]
                if select is not None:
                    chosen = select[start:stop]
                    count = int(np.count_nonzero(chosen))
                    if count:
                        into = out[kept : kept + count] if out is not None else picked[slot][:count]
                        work = worker.submit(_after, work, _pick, chosen, target, into, consume, kept)
                        pending[slot].append(work)
                    kept += count
                elif consume is not None:
                    work = worker.submit(_after, work, consume, start, target)
                    pending[slot].append(work)
            for future in pending[0] + pending[1]:
                future.result()
            value = f"{crc.result():08x}"
        except BaseException:
            worker.shutdown(wait=True, cancel_futures=True)  # no consume call runs after this returns
            raise
        worker.shutdown(wait=True)
    if expected_crc is not None and value != expected_crc:
        raise CheckpointError(
            f"{info.path} does not match its checksum in the manifest (CRC-32 {value}, expected "
            f"{expected_crc}): the file is corrupt"
        )


def _after(previous: Future | None, fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` unless the work before it (done: one worker, in order) failed; then fail the same
    way, so no consume call follows a failed one."""
    if previous is not None:
        previous.result()
    fn(*args)


def _pick(
    chosen: np.ndarray,
    block: np.ndarray,
    into: np.ndarray,
    consume: Callable[[int, np.ndarray], None] | None,
    first: int,
) -> None:
    """Copy the ``chosen`` rows of ``block`` to ``into`` and hand them to ``consume``."""
    np.compress(chosen, block, axis=0, out=into)
    if consume is not None:
        consume(first, into)


def _read_exactly(f: BinaryIO, target: memoryview, path: str) -> memoryview:
    """Fill ``target`` from ``f``; CheckpointError when the file ends first."""
    done = 0
    while done < len(target):
        count = f.readinto(target[done:])
        if not count:
            raise CheckpointError(
                f"checkpoint file {path} is truncated: it ended {len(target) - done} bytes early while being read"
            )
        done += count
    return target


def _chain_crc(data: memoryview, previous: Future) -> int:
    return update_crc32(data, previous.result())


def crc32(path: str, chunk: int = READ_CHUNK) -> str:
    """The CRC-32 of a whole file, as 8 hex digits. Two buffers: a thread reads the next chunk from
    disk while this one checksums the last (both release the GIL), so a cold read costs about the
    read alone."""
    value = 0
    buffers = [bytearray(chunk), bytearray(chunk)]
    with open(path, "rb", buffering=0) as f, ThreadPoolExecutor(1) as reader:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        pending = reader.submit(f.readinto, buffers[0])
        turn = 0
        while count := pending.result():
            pending = reader.submit(f.readinto, buffers[1 - turn])
            value = update_crc32(memoryview(buffers[turn])[:count], value)
            turn = 1 - turn
    return f"{value:08x}"


def update_crc32(data: bytes | memoryview | np.ndarray, value: int = 0) -> int:
    """The CRC-32 (zlib's) of ``value``'s data followed by ``data``: checksums go chunk by chunk."""
    return _crc32(data, value)


def write_manifest(directory: str, manifest: dict) -> None:
    path = os.path.join(directory, MANIFEST)
    with open(path, "w") as f:
        json.dump({"format_version": FORMAT_VERSION, **manifest}, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def read_manifest(directory: str) -> dict | None:
    """The checked manifest of a checkpoint directory, or None when it has none (NVIDIA SOK's layout).

    Raises:
        CheckpointError: the manifest is not UTF-8 JSON, has another format version, or a field of
            the wrong type or value (:func:`validate_manifest`); it names the file and the field.
    """
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return None  # NVIDIA SOK writes none
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path} is not a valid manifest (UTF-8 JSON): {error}") from error
    if not isinstance(manifest, dict):
        kind = type(manifest).__name__
        raise CheckpointError(f"{path} is not a valid manifest: it holds a JSON {kind}, not an object")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format version {manifest.get('format_version')!r}; this sok-core reads "
            f"version {FORMAT_VERSION}: upgrade sok-core"
        )
    validate_manifest(manifest, path)
    return manifest


#: Optional fields of a manifest (beside ``format_version`` and ``tables``): name -> (types, least
#: integer value, what is valid).
_MANIFEST_FIELDS: dict[str, tuple[tuple[type, ...], int, str]] = {
    "world_size": ((int,), 1, "an integer >= 1"),
    "optimizer": ((str, type(None)), 0, "a string or null"),
    "step": ((int, type(None)), 0, "an integer >= 0 or null"),
    "optimizer_step": ((int, type(None)), 0, "an integer >= 0 or null"),
}
#: Key dtypes a key file may hold.
KEY_FILE_DTYPES = ("int32", "int64", "uint32", "uint64")
#: Fields of each table entry: name -> (types, least integer value, what is valid).
_TABLE_FIELDS: dict[str, tuple[tuple[type, ...], int, str]] = {
    "variable": ((str,), 0, "a string"),
    "dim": ((int,), 1, "an integer >= 1"),
    "rows": ((int,), 0, "an integer >= 0"),
    "key_dtype": ((str,), 0, f"one of {', '.join(KEY_FILE_DTYPES)}"),
    "dtype": ((str,), 0, '"float32"'),
    "slots": ((list,), 0, "a list of slot names"),
    "kind": ((str,), 0, '"dynamic" or "static"'),
    "mode": ((str, type(None)), 0, "a string or null"),
    "crc32": ((dict,), 0, "an object of file name -> 8 hex digits"),
}


def validate_manifest(manifest: dict, path: str) -> None:
    """Check every field of a parsed manifest (types and values) so that a load can trust it before
    anything changes. Raises CheckpointError naming ``path`` and the field (e.g. ``tables.emb_0.dim``)."""

    def bad(field: str, value: Any, what: str) -> CheckpointError:
        return CheckpointError(f"{path}: field {field} is {value!r}; expected {what}. The manifest is corrupt")

    def check(field: str, value: Any, spec: tuple[tuple[type, ...], int, str]) -> None:
        types, least, what = spec
        if isinstance(value, bool) or not isinstance(value, types) or (isinstance(value, int) and value < least):
            raise bad(field, value, what)

    for field, spec in _MANIFEST_FIELDS.items():
        if field in manifest:
            check(field, manifest[field], spec)
    tables = manifest.get("tables")
    if not isinstance(tables, dict):
        raise bad("tables", tables, "an object of table name -> entry")
    for table, entry in tables.items():
        if not isinstance(entry, dict):
            raise bad(f"tables.{table}", entry, "an object")
        for field, spec in _TABLE_FIELDS.items():
            if field in entry:
                check(f"tables.{table}.{field}", entry[field], spec)
        for field in ("dim", "rows", "key_dtype", "slots"):
            if field not in entry:
                raise CheckpointError(f"{path}: table {table} lacks the field {field!r}. The manifest is corrupt")
        if entry["key_dtype"] not in KEY_FILE_DTYPES:
            raise bad(f"tables.{table}.key_dtype", entry["key_dtype"], _TABLE_FIELDS["key_dtype"][2])
        if entry.get("dtype", "float32") != "float32":
            raise bad(f"tables.{table}.dtype", entry["dtype"], _TABLE_FIELDS["dtype"][2])
        if entry.get("kind", "dynamic") not in ("dynamic", "static"):
            raise bad(f"tables.{table}.kind", entry["kind"], _TABLE_FIELDS["kind"][2])
        if not all(isinstance(s, str) and s for s in entry["slots"]):
            raise bad(f"tables.{table}.slots", entry["slots"], _TABLE_FIELDS["slots"][2])
        for name, digest in entry.get("crc32", {}).items():
            if not isinstance(digest, str) or len(digest) != 8 or any(c not in string.hexdigits for c in digest):
                raise bad(f"tables.{table}.crc32.{name}", digest, "8 hex digits")
