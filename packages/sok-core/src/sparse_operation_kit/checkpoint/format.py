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
against tampering). Its schema is :class:`Manifest` (one :class:`TableEntry` per table), which
writes it (:meth:`Manifest.to_json`) and reads it, validated whole (:meth:`Manifest.from_json`);
:data:`FORMAT_VERSION` is its version.

Everything here reads and writes files only (no TensorFlow): ``sok ckpt inspect`` and sok-hps's
converter read checkpoints through it. Table and file names (from a manifest or a directory
listing) are plain names inside their directory, checked by :func:`check_name`. A reader may pass
``dir_fd`` (a directory opened once, :class:`~sparse_operation_kit.checkpoint.directory.OpenCheckpoint`):
every file is then opened relative to it, so a dump that replaces the path meanwhile cannot mix
the files of two checkpoints.

Checksums use ISA-L's CRC-32 when the ``isal`` package is installed (the same checksum as zlib's,
computed faster: ``pip install sok-core[fast-crc]``; CI and the benchmarks install it) and zlib's
otherwise.

Example::

    manifest = read_manifest("ckpt")               # None: NVIDIA SOK's layout
    key_info, weight_info, rows = table_files("ckpt", "emb_0")
    check_against_manifest("ckpt", "emb_0", manifest, [key_info, weight_info], weight_info.elements // rows)
"""

from __future__ import annotations

import errno
import json
import os
import stat
import string
import struct
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from sparse_operation_kit.dtypes import STATIC_ROW_DTYPES

try:  # ISA-L: the same CRC-32 as zlib's, computed faster (the optional extra sok-core[fast-crc])
    from isal.isal_zlib import crc32 as _crc32
except ImportError:
    from zlib import crc32 as _crc32

#: Bytes read per system call (and checksummed per step) by :func:`read_payload`,
#: :func:`stream_payload` (rounded down to whole rows, at least one) and :func:`crc32`.
#: Large, because cold reads in much smaller calls measured slower than one ``np.fromfile`` of the
#: whole file, and calls of this size came close to it.
READ_CHUNK = 1 << 27

#: Version of manifest.json (the binary files are NVIDIA SOK's, unversioned).
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
HEADER_BYTES = 296
FILE_KEY, FILE_WEIGHT, FILE_STATE = 0, 1, 2

#: NVIDIA SOK's data type indices.
DTYPE_INDEX = {"int32": 0, "int64": 1, "uint32": 2, "uint64": 3, "float16": 4, "float32": 5, "float64": 6}
INDEX_DTYPE = {v: k for k, v in DTYPE_INDEX.items()}


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupt or does not match the variables."""


class CheckpointChanged(CheckpointError):
    """Another ``sok.dump`` replaced the checkpoint while it was read: read it again."""


def check_name(name: str, what: str, where: str = "") -> str:
    """Return ``name`` when it is a plain name inside one directory (a table, or a checkpoint file).

    Args:
        name: the name (a table's, from a manifest or a file name; or a file's, from a manifest).
        what: what it names, for the message (``"table"``, ``"file"``).
        where: where it comes from, for the message (a manifest's path), or ``""``.

    Raises:
        CheckpointError: ``name`` is empty, ``.`` or ``..``, or holds a path separator or NUL: it
            names the name and the rule.

    Example::

        check_name("emb_0", "table")          # "emb_0"
        check_name("../../x", "file")         # CheckpointError: ... it contains a path separator
    """
    if not name:
        rule = "it is empty"
    elif name in (".", ".."):
        rule = "it is '.' or '..'"
    elif any(sep in name for sep in (os.sep, os.altsep) if sep):
        rule = "it contains a path separator"
    elif "\0" in name:
        rule = "it contains a NUL character"
    else:
        return name
    raise CheckpointError(
        f"{where + ': ' if where else ''}{what} {name!r} is refused: {rule}; table and file names of a "
        f"checkpoint are plain names inside its directory (not empty, not '.' or '..', no path separator, no "
        f"NUL). The checkpoint is corrupt or was not written by sok.dump"
    )


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
    """What a file's header and size say.

    Attributes:
        path: the file's path (in messages; opened when ``dir_fd`` is None).
        dir_fd: the checkpoint directory opened by the reader, or None: the file is then opened as
            ``basename(path)`` relative to it (valid only while the reader holds it open).
    """

    path: str
    file_type: int
    slot: str
    dtype: str
    elements: int
    dir_fd: int | None = field(default=None, compare=False, repr=False)


def open_file(path: str, dir_fd: int | None = None) -> BinaryIO:
    """Open a checkpoint file for reading, unbuffered: ``path``, or ``basename(path)`` relative to the
    directory ``dir_fd``. It must be a regular file: a symbolic link is not followed (so every file
    read is inside the checkpoint), and a FIFO or device is refused without blocking.

    Raises:
        CheckpointError: the file is missing or not a regular file; it names ``path``.
    """
    name = path if dir_fd is None else os.path.basename(path)
    not_regular = (
        f"checkpoint file {path} is not a regular file (a symbolic link, a directory or a special file); "
        f"sok reads only the files inside the checkpoint: put the file itself there"
    )
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError) as error:
        raise CheckpointError(f"checkpoint file {path} is missing") from error
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise CheckpointError(not_regular) from error
        raise
    f = os.fdopen(fd, "rb", buffering=0)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise CheckpointError(not_regular)
    return f


def exists(path: str, dir_fd: int | None = None) -> bool:
    """Whether ``path`` (``basename(path)`` relative to ``dir_fd`` when given) names an entry (a
    symbolic link too, dangling or not: it is not followed)."""
    try:
        os.stat(path if dir_fd is None else os.path.basename(path), dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def read_header(path: str, dir_fd: int | None = None) -> FileInfo:
    """Parse and check a file's header (the file ``basename(path)`` of directory ``dir_fd`` when
    given); CheckpointError names the file and the problem."""
    with open_file(path, dir_fd) as f:
        size = os.fstat(f.fileno()).st_size
        if size < HEADER_BYTES:
            raise CheckpointError(
                f"checkpoint file {path} is truncated: {size} bytes, shorter than the {HEADER_BYTES}-byte header"
            )
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
    return FileInfo(path, file_type, slot, dtype, payload // itemsize, dir_fd)


def payload(info: FileInfo, rows: int | None = None, dim: int | None = None) -> np.ndarray:
    """The file's data as a read-only memory map (``[rows, dim]`` when given)."""
    with open_file(info.path, info.dir_fd) as f:
        data = np.memmap(f, dtype=info.dtype, mode="r", offset=HEADER_BYTES, shape=(info.elements,))
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
    with open_file(info.path, info.dir_fd) as f, ThreadPoolExecutor(1) as checksums:
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


def crc32(path: str, chunk: int = READ_CHUNK, dir_fd: int | None = None) -> str:
    """The CRC-32 of a whole file (``basename(path)`` of directory ``dir_fd`` when given), as 8 hex
    digits. Two buffers: a thread reads the next chunk from disk while this one checksums the last
    (both release the GIL), so a cold read costs about the read alone."""
    value = 0
    buffers = [bytearray(chunk), bytearray(chunk)]
    with open_file(path, dir_fd) as f, ThreadPoolExecutor(1) as reader:
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


#: Key dtypes a key file may hold.
KEY_FILE_DTYPES = ("int32", "int64", "uint32", "uint64")
#: The kinds of table a manifest names.
TABLE_KINDS = ("dynamic", "static")

#: A field's spec for validation: (types, least integer value, what is valid).
_Spec = tuple[tuple[type, ...], int, str]
#: Optional fields of a manifest (beside ``format_version`` and ``tables``): name -> spec.
_MANIFEST_FIELDS: dict[str, _Spec] = {
    "world_size": ((int,), 1, "an integer >= 1"),
    "optimizer": ((str, type(None)), 0, "a string or null"),
    "step": ((int, type(None)), 0, "an integer >= 0 or null"),
    "optimizer_step": ((int, type(None)), 0, "an integer >= 0 or null"),
}
#: Fields of each table entry: name -> spec.
_TABLE_FIELDS: dict[str, _Spec] = {
    "variable": ((str,), 0, "a string"),
    "dim": ((int,), 1, "an integer >= 1"),
    "rows": ((int,), 0, "an integer >= 0"),
    "key_dtype": ((str,), 0, f"one of {', '.join(KEY_FILE_DTYPES)}"),
    "dtype": ((str,), 0, f"one of {', '.join(STATIC_ROW_DTYPES)}"),
    "slots": ((list,), 0, "a list of slot names"),
    "kind": ((str,), 0, '"dynamic" or "static"'),
    "mode": ((str, type(None)), 0, "a string or null"),
    "crc32": ((dict,), 0, "an object of file name -> 8 hex digits"),
}
#: Fields a table entry must have.
_REQUIRED_TABLE_FIELDS = ("dim", "rows", "key_dtype", "slots")


def _bad(path: str, name: str, value: Any, what: str) -> CheckpointError:
    """The error of a manifest field (``name``: its dotted path) whose value is not ``what``."""
    return CheckpointError(f"{path}: field {name} is {value!r}; expected {what}. The manifest is corrupt")


def _check(path: str, name: str, value: Any, spec: _Spec) -> None:
    """Raise :func:`_bad` unless ``value`` has a type of ``spec`` (never bool) and is at least its least value."""
    types, least, what = spec
    if isinstance(value, bool) or not isinstance(value, types) or (isinstance(value, int) and value < least):
        raise _bad(path, name, value, what)


@dataclass
class TableEntry:
    """One table of a manifest (``tables.<table>``): what its files hold.

    Attributes:
        dim: floats per row (of the weight file and of each slot file).
        rows: keys in the key file (rows of every other file of the table).
        key_dtype: the key file's dtype, one of :data:`KEY_FILE_DTYPES`.
        slots: optimizer slot names whose files were dumped (``<table>-<optimizer>-<slot>``).
        variable: the variable's name (``"emb:0"``); None when the manifest has none.
        dtype: the table's row dtype (:data:`~sparse_operation_kit.dtypes.STATIC_ROW_DTYPES`:
            ``"float16"`` and ``"bfloat16"`` for ``sok.Variable`` tables of half-width rows). The
            files hold float32 values either way: half-width rows widened, exactly.
        kind: ``"dynamic"`` (a DynamicVariable) or ``"static"`` (a sok.Variable).
        mode: how the variable was placed (``"distributed"``, ``"localized:<gpu>"``, or a
            DynamicVariable's mode, often None).
        crc32: file name -> CRC-32 of the whole file (header included), 8 hex digits.

    Example::

        TableEntry(dim=4, rows=8, key_dtype="int64", slots=["accumulator"], variable="emb:0",
                   kind="dynamic", crc32={"emb_0-key": "fc11b5d4", ...})
    """

    dim: int
    rows: int
    key_dtype: str
    slots: list[str]
    variable: str | None = None
    dtype: str = "float32"
    kind: str = "dynamic"
    mode: str | None = None
    crc32: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The entry as ``manifest.json`` holds it (``variable`` only when known)."""
        out: dict[str, Any] = {} if self.variable is None else {"variable": self.variable}
        out.update(
            dim=self.dim,
            rows=self.rows,
            key_dtype=self.key_dtype,
            dtype=self.dtype,
            slots=list(self.slots),
            kind=self.kind,
            mode=self.mode,
            crc32=dict(self.crc32),
        )
        return out

    @classmethod
    def from_dict(cls, table: str, data: Any, path: str) -> TableEntry:
        """Check every field of ``tables.<table>`` (types and values) and build the entry.

        Raises:
            CheckpointError: naming ``path`` and the field (e.g. ``tables.emb_0.dim``), its value
                and what is valid.
        """
        if not isinstance(data, dict):
            raise _bad(path, f"tables.{table}", data, "an object")
        for name, spec in _TABLE_FIELDS.items():
            if name in data:
                _check(path, f"tables.{table}.{name}", data[name], spec)
        for name in _REQUIRED_TABLE_FIELDS:
            if name not in data:
                raise CheckpointError(f"{path}: table {table} lacks the field {name!r}. The manifest is corrupt")
        if data["key_dtype"] not in KEY_FILE_DTYPES:
            raise _bad(path, f"tables.{table}.key_dtype", data["key_dtype"], _TABLE_FIELDS["key_dtype"][2])
        if data.get("dtype", "float32") not in STATIC_ROW_DTYPES:
            raise _bad(path, f"tables.{table}.dtype", data["dtype"], _TABLE_FIELDS["dtype"][2])
        if data.get("kind", "dynamic") not in TABLE_KINDS:
            raise _bad(path, f"tables.{table}.kind", data["kind"], _TABLE_FIELDS["kind"][2])
        if not all(isinstance(s, str) and s for s in data["slots"]):
            raise _bad(path, f"tables.{table}.slots", data["slots"], _TABLE_FIELDS["slots"][2])
        for name, digest in data.get("crc32", {}).items():
            check_name(name, f"tables.{table}.crc32 file", path)
            if not isinstance(digest, str) or len(digest) != 8 or any(c not in string.hexdigits for c in digest):
                raise _bad(path, f"tables.{table}.crc32.{name}", digest, "8 hex digits")
        return cls(**{name: data[name] for name in _TABLE_FIELDS if name in data})


@dataclass
class Manifest:
    """``manifest.json``: what a checkpoint holds, as :func:`write_manifest` writes it and
    :func:`read_manifest` reads it (validated whole). The file is this object's :meth:`to_json`.

    Attributes:
        tables: table name (``<table>``, as in the file names) -> its entry.
        world_size: ranks that wrote the checkpoint; None when the manifest has none.
        optimizer: the optimizer whose state was dumped (``"Adagrad"``), or None.
        step: the sok.OptimizerWrapper's step (dynamic tables), or None.
        optimizer_step: the wrapped Keras optimizer's own step (static tables), or None.
        format_version: :data:`FORMAT_VERSION`, the only version this sok-core reads.

    Example::

        manifest = Manifest(tables={"emb_0": entry}, world_size=2, optimizer="Adagrad", step=10, optimizer_step=10)
        assert Manifest.from_json(manifest.to_json(), "manifest.json") == manifest
    """

    tables: dict[str, TableEntry] = field(default_factory=dict)
    world_size: int | None = None
    optimizer: str | None = None
    step: int | None = None
    optimizer_step: int | None = None
    format_version: int = field(default=FORMAT_VERSION, init=False)

    def to_dict(self) -> dict[str, Any]:
        """The manifest as JSON values (``world_size`` only when known)."""
        out: dict[str, Any] = {"format_version": self.format_version}
        if self.world_size is not None:
            out["world_size"] = self.world_size
        out.update(
            optimizer=self.optimizer,
            step=self.step,
            optimizer_step=self.optimizer_step,
            tables={name: entry.to_dict() for name, entry in self.tables.items()},
        )
        return out

    def to_json(self) -> str:
        """The text of ``manifest.json`` (keys sorted, indented by 2)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any, path: str) -> Manifest:
        """Check a parsed manifest whole (its format version, then every field's type and value),
        so that a load can trust it before anything changes, and build it.

        Raises:
            CheckpointError: naming ``path`` and the field (e.g. ``tables.emb_0.dim``), its value and
                what is valid; or the format version and how to read it.
        """
        if not isinstance(data, dict):
            kind = type(data).__name__
            raise CheckpointError(f"{path} is not a valid manifest: it holds a JSON {kind}, not an object")
        if data.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(
                f"{path} has format version {data.get('format_version')!r}; this sok-core reads "
                f"version {FORMAT_VERSION}: upgrade sok-core"
            )
        for name, spec in _MANIFEST_FIELDS.items():
            if name in data:
                _check(path, name, data[name], spec)
        tables = data.get("tables")
        if not isinstance(tables, dict):
            raise _bad(path, "tables", tables, "an object of table name -> entry")
        for table in tables:
            check_name(table, "table", path)
        entries = {table: TableEntry.from_dict(table, entry, path) for table, entry in tables.items()}
        return cls(tables=entries, **{name: data[name] for name in _MANIFEST_FIELDS if name in data})

    @classmethod
    def from_json(cls, raw: bytes, path: str) -> Manifest:
        """Parse and check the bytes of ``manifest.json`` (:meth:`from_dict`).

        Raises:
            CheckpointError: the bytes are not UTF-8 JSON, or as :meth:`from_dict`; it names ``path``.
        """
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{path} is not a valid manifest (UTF-8 JSON): {error}") from error
        return cls.from_dict(data, path)


def write_manifest(directory: str, manifest: Manifest) -> None:
    """Write ``manifest`` to ``directory``/``manifest.json`` and sync it."""
    path = os.path.join(directory, MANIFEST)
    with open(path, "w") as f:
        f.write(manifest.to_json())
        f.flush()
        os.fsync(f.fileno())


def read_manifest(directory: str, dir_fd: int | None = None) -> Manifest | None:
    """The checked manifest of a checkpoint directory, or None when it has none (NVIDIA SOK's layout).

    Args:
        directory: the checkpoint directory.
        dir_fd: that directory opened by the reader (the manifest is read relative to it), or None.

    Raises:
        CheckpointError: the manifest is not UTF-8 JSON, has another format version, or a field of
            the wrong type or value (:meth:`Manifest.from_dict`); it names the file and the field.
    """
    raw = read_manifest_bytes(directory, dir_fd)
    return None if raw is None else Manifest.from_json(raw, os.path.join(directory, MANIFEST))


def read_manifest_bytes(directory: str, dir_fd: int | None = None) -> bytes | None:
    """The bytes of a checkpoint directory's manifest file, unchecked, or None when it has none
    (NVIDIA SOK's layout); :func:`read_manifest` checks them (``Manifest.from_json``).

    Raises:
        CheckpointError: the file cannot be read, or is not a regular file.
    """
    path = os.path.join(directory, MANIFEST)
    if not exists(path, dir_fd):
        return None  # NVIDIA SOK writes none
    try:
        with open_file(path, dir_fd) as f:
            return f.readall()
    except OSError as error:
        raise CheckpointError(f"{path} is not a valid manifest (UTF-8 JSON): {error}") from error


def table_files(path: str, table: str, dir_fd: int | None = None) -> tuple[FileInfo, FileInfo, int]:
    """Check a table's key and weight files against each other: ``(key info, weight info, rows)``.

    Args:
        path: the checkpoint directory.
        table: the table's name (``<table>`` of its files): a plain name (:func:`check_name`).
        dir_fd: that directory opened by the reader (the files are opened relative to it), or None.

    Raises:
        CheckpointError: ``table`` is not a plain name; a file is missing, truncated, of the wrong
            type or dtype, or the weight file is not a whole number of rows for the keys; it names
            the file.
    """
    check_name(table, "table", path)
    key_info = read_header(os.path.join(path, key_file(table)), dir_fd)
    weight_info = read_header(os.path.join(path, weight_file(table)), dir_fd)
    if key_info.file_type != FILE_KEY or weight_info.file_type != FILE_WEIGHT:
        raise CheckpointError(f"{key_info.path} / {weight_info.path} have the wrong file types")
    if key_info.dtype not in KEY_FILE_DTYPES or weight_info.dtype != "float32":
        raise CheckpointError(
            f"{table}: keys are {key_info.dtype} and weights {weight_info.dtype}; expected integer "
            f"keys ({', '.join(KEY_FILE_DTYPES)}) and float32 weights"
        )
    rows = key_info.elements
    if rows == 0 and weight_info.elements != 0 or rows and weight_info.elements % rows:
        raise CheckpointError(
            f"{weight_info.path} holds {weight_info.elements} floats, not a whole number of rows "
            f"for the {rows} keys of {key_info.path}: the file is truncated or from another table"
        )
    return key_info, weight_info, rows


def check_against_manifest(
    path: str, table: str, manifest: Manifest | None, infos: list[FileInfo], dim: int
) -> TableEntry | None:
    """The manifest's entry of ``table`` must describe its files (rows, dim, key dtype, one checksum
    per file): returns that entry (None without a manifest).

    Args:
        path: the checkpoint directory.
        table: the table's name (``<table>`` of its files).
        manifest: the directory's manifest, or None (NVIDIA SOK's layout: nothing to check).
        infos: the table's files, the key file first.
        dim: the row width the files have (any value for a table without rows).

    Raises:
        CheckpointError: naming the manifest and what differs.
    """
    if manifest is None:
        return None
    where = os.path.join(path, MANIFEST)
    entry = manifest.tables.get(table)
    if entry is None:
        raise CheckpointError(
            f"{where} does not list table {table!r}, whose files are in {path} (listed: "
            f"{sorted(manifest.tables)}); the files do not belong to this checkpoint"
        )
    key_info = infos[0]
    found = {"rows": key_info.elements, "dim": dim if key_info.elements else entry.dim, "key_dtype": key_info.dtype}
    for name, value in found.items():
        if getattr(entry, name) != value:
            raise CheckpointError(
                f"{where} says table {table!r} has {name} {getattr(entry, name)!r} but its files have {value!r}: "
                f"the checkpoint is inconsistent"
            )
    for info in infos:
        if os.path.basename(info.path) not in entry.crc32:
            raise CheckpointError(f"{where} has no checksum for {info.path}: the checkpoint is inconsistent")
    return entry
