"""Online updates: files of changed rows written by training and applied to running tiers.

The original fed updates through Kafka (reference §3.9). Here the update source is a directory
(``update_source: {"type": "directory", "path": ...}``): training writes one file per table and
dump (:func:`write_update`, or :func:`dump_increment` around ``sok.incremental_model_dump``), and
each server's :class:`DirectoryUpdateSource` applies them.

File format (version :data:`FORMAT_VERSION`; all little-endian), after the Kafka payload's idea:

========  ==========================================================
u32       magic ``0x52544348`` (the bytes ``HCTR``, as the Kafka payload)
u32       value size in bytes (``4 * dim``)
u16       format version (2)
u16       key size in bytes (8: int64 keys; uint64 keys keep their bits)
u32       length of the tag in bytes (at most 248)
u64       sequence: :func:`time.time_ns` at the write, strictly increasing in the writing process
u64       writer: 8 random bytes (never 0) drawn once per writing thread (again in a forked child)
tag       UTF-8, ``hps_et.<model>.<table>``
u64       number of rows ``n``
n x       ``[key: 8 bytes][value: value size bytes of float32]``
u32       CRC-32 (zlib's) of every byte before it
========  ==========================================================

Version 1 (sok-hps before the sequence) has no sequence or writer field; it is still read, its
sequence is the time its name starts with (``<20 digits>-...``) and its writer is 0 (every
version-1 file, one writer).

Names are ``<sequence, 20 digits>-<pid>-<counter>.hpsu``. A file is written under a hidden
temporary name in the same directory and renamed into place (``os.replace``). Files stay after
they are applied: a new source replays the directory from the start, as a new Kafka consumer group
does; delete old files to compact it.

**Order.** The order is kept per writer: one thread of one process calling :func:`write_update`
(each rank dumping its shard of a table, or two threads, are several writers). The files found at
one poll apply in the order of their sequence (then name), never of their names; files of
different writers apply as they arrive, so writers of disjoint rows (the shards of a table) agree
live and on a replay, which applies every file in sequence order. One writer's order is kept: a
file whose sequence is older than that of an update of the same writer and table (tag) already
applied arrives late (copied in after its successors) and is refused, since applying it would undo
the newer rows and a replay would apply it before them. A duplicate is refused too (a file with the
writer, sequence and checksum of one applied, under another name; version 1: the same content).
A refused file is moved to ``<directory>/rejected/``, so a replay never sees it either. Writers of
the same rows in different threads or processes are not ordered against each other: write them
from one thread.

**Rejected files**: a file bad for every reader goes to ``<directory>/rejected/`` (with a suffix
``.1``, ``.2``, ... when the name is taken there) with one error line that names the file and why,
and the updates after it go on: a file that is not an update (bad magic, version, tag, checksum,
data after its end), anything named ``*.hpsu`` that is not a regular file (a directory, FIFO,
device, or any symbolic link: none is opened or followed), and a refused one (above).

**Updates this server cannot apply**: the ``apply`` callable refuses one by raising a
:class:`ValueError` (:class:`UpdateRejected`: rows of another width than this server's table, keys
its table cannot hold; nothing of it is applied). Its file is left in place for the other servers
reading the directory; this source logs one error line naming it and why, records it
(:attr:`DirectoryUpdateSource.unapplied`) and never tries it again (a new source, at a restart,
tries it once more). Any other error of ``apply`` (``tiers.TierUnavailable``: a database down) is
retried at every poll, it and the updates after it, with one warning.

**Incomplete files.** A file shorter than its header says (copied in with ``cp`` or ``scp``, not
renamed into place) is left where it is and read again at every poll until it is complete; it is
rejected only when its size and modification time have not changed for ``incomplete_timeout_s``
(default 300 s). A file is checked from its header first (a 32-byte read tells a junk file; the
size the header declares is compared with the file's before anything else is read) and the rows
are read in chunks of 8 MiB into the array that holds them. A poll reads the headers of the new
files to order them, then reads, checks and applies one file at a time: a replay of a large
directory holds one file's rows in memory, not all of them (:meth:`DirectoryUpdateSource.poll`,
which returns them all, holds them all).

Example::

    write_update("updates", "foo", "sparse_embedding0", keys, rows)    # 'updates/1760...-1-000000.hpsu'
    source = DirectoryUpdateSource("updates", poll_interval_s=0.5, model_filters=["foo"])
    source.start(lambda u: tier.insert(u.tag, u.keys, u.values))
    ...
    source.stop()
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import re
import stat
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from .config import NAME_PATTERN, UpdateSourceConfig

__all__ = [
    "DirectoryUpdateSource",
    "FORMAT_VERSION",
    "Update",
    "UpdateFileError",
    "UpdateIncomplete",
    "UpdateRejected",
    "dump_increment",
    "read_update",
    "write_update",
]

log = logging.getLogger(__name__)

MAGIC = 0x52544348
_MAGIC_BYTES = struct.pack("<I", MAGIC)
FORMAT_VERSION = 2
SUFFIX = ".hpsu"
REJECTED = "rejected"
_HEAD = struct.Struct("<IIHHI")  # magic, value size, version, key size, tag length (every version)
_ORDER = struct.Struct("<QQ")  # version 2, after _HEAD: sequence, writer
_COUNT = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_PROBE = _HEAD.size + _ORDER.size  # the first read of a file: the fixed header of every version
_MAX_TAG = len("hps_et..") + 2 * 120
_CHUNK = 8 << 20
_TAG = re.compile(rf"hps_et\.({NAME_PATTERN.pattern})\.({NAME_PATTERN.pattern})")
_NAME_TIME = re.compile(r"(\d{20})-")
_counter = itertools.count()
_sequence_lock = threading.Lock()
_last_sequence = 0
_writers = threading.local()


def _new_writers() -> None:
    """Every thread of a forked child draws a new writer id (its parent's thread keeps the old one)."""
    global _writers
    _writers = threading.local()


os.register_at_fork(after_in_child=_new_writers)


class UpdateFileError(ValueError):
    """An update file that cannot be applied: the message names the file and what is wrong."""


class UpdateIncomplete(UpdateFileError):
    """An update file shorter than its header says: truncated, or still being copied in."""


class UpdateRejected(ValueError):
    """An update this server can never apply (raised by the ``apply`` of :meth:`DirectoryUpdateSource.start`):
    its file stays for other readers, this source never tries it again, and the updates after it go on.

    Example::

        if update.values.shape[1] != dim:
            raise UpdateRejected(f"rows of width {update.values.shape[1]}, but the table's dim is {dim}")
    """


@dataclass(frozen=True)
class Update:
    """The rows of one update file.

    Attributes:
        tag: ``hps_et.<model>.<table>``.
        keys: int64 ``[n]``.
        values: float32 ``[n, dim]``.
        path: the file it came from.
        sequence: its place in the order of updates (the module docstring).
        version: the file's format version.
        checksum: the file's CRC-32.
        writer: the id of the thread that wrote it (0: version 1); the order is kept per writer.
    """

    tag: str
    keys: np.ndarray
    values: np.ndarray
    path: str = ""
    sequence: int = 0
    version: int = FORMAT_VERSION
    checksum: int = 0
    writer: int = 0

    @property
    def model(self) -> str:
        """The model name of the tag."""
        return self.tag.split(".")[1]

    @property
    def table(self) -> str:
        """The table name of the tag."""
        return self.tag.split(".")[2]


def _pairs(dim: int) -> np.dtype:
    return np.dtype([("key", "<i8"), ("value", "<f4", (dim,))])


def _next_sequence() -> int:
    """``time.time_ns()``, or one more than the last sequence of this process when that is not older."""
    global _last_sequence
    with _sequence_lock:
        _last_sequence = max(time.time_ns(), _last_sequence + 1)
        return _last_sequence


def _writer_id() -> int:
    """The writer id of this thread: 8 random bytes, never 0, drawn at its first write."""
    writer = getattr(_writers, "id", 0)
    while writer == 0:
        writer = _writers.id = int.from_bytes(os.urandom(_ORDER.size // 2), "little")
    return writer


def write_update(directory: str | os.PathLike, model: str, table: str, keys: np.ndarray, values: np.ndarray) -> str:
    """Write one update file atomically into ``directory`` (made when missing); returns its path.
    Its sequence is the time of the write, later than any this process wrote before; its writer is
    this thread's id (the order of updates is kept per writer: the module docstring).

    Args:
        model, table: the names of the ps_config (the tag is ``hps_et.<model>.<table>``).
        keys: integer ``[n]`` (uint64 keys keep their bits).
        values: ``[n, dim]`` rows, written as float32.

    Raises:
        ValueError: a name that is not a valid model or table name, or shapes that do not fit.

    Example::

        write_update("updates", "foo", "sparse_embedding0", np.array([3, 7]), np.ones((2, 16)))
    """
    for what, name in (("model", model), ("table", table)):
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise ValueError(f"{what} name {name!r} is not 1 to 120 letters, digits, '_' or '-'")
    keys, values = np.asarray(keys), np.asarray(values)
    if keys.ndim != 1 or keys.dtype.kind not in "iu" or values.ndim != 2 or len(values) != len(keys):
        raise ValueError(
            f"keys must be integer [n] and values [n, dim]; got {keys.dtype} {keys.shape} and {values.shape}"
        )
    if values.shape[1] < 1:
        raise ValueError(f"values must have dim >= 1, got shape {values.shape}")
    dim = values.shape[1]
    tag = f"hps_et.{model}.{table}".encode()
    pairs = np.empty(len(keys), _pairs(dim))
    pairs["key"] = keys.view(np.int64) if keys.dtype == np.uint64 else keys.astype(np.int64)
    pairs["value"] = values
    sequence = _next_sequence()
    body = _HEAD.pack(MAGIC, 4 * dim, FORMAT_VERSION, 8, len(tag)) + _ORDER.pack(sequence, _writer_id()) + tag
    body += _COUNT.pack(len(keys)) + pairs.tobytes()
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    name = f"{sequence:020d}-{os.getpid()}-{next(_counter):06d}{SUFFIX}"
    fd, temp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.write(_CRC.pack(zlib.crc32(body)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, os.path.join(directory, name))
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    log.debug("wrote update %s: %d rows of %s", name, len(keys), tag.decode())
    return os.path.join(directory, name)


def read_update(path: str | os.PathLike) -> Update:
    """Read and check one update file (version 1 or 2), its header first, its rows in chunks.

    Raises:
        UpdateIncomplete: the file is shorter than its header says (truncated, or still being
            copied in).
        UpdateFileError: not a regular file (a symbolic link is not followed, a FIFO not waited
            on), wrong magic or version, a bad tag, data after the end the header gives, a
            checksum mismatch (corrupt), or a version-1 file whose name holds no time.
        OSError: the file cannot be opened or read.

    Example::

        update = read_update("updates/01760000000000000000-1-000000.hpsu")
        update.tag, update.keys, update.values     # 'hps_et.foo.t', int64 [n], float32 [n, dim]
    """
    path = os.fspath(path)
    f, size = _open_regular(path)
    with f:
        head = _read_header(f, size, path)
        pairs = np.empty(head.count, _pairs(head.dim))
        crc = _read_into(f, pairs.view(np.uint8), head.crc, lambda what: _incomplete(path, size, what))
        if f.read(_CRC.size) != _CRC.pack(crc):
            raise UpdateFileError(f"update file {path}: checksum mismatch: the file is corrupt")
    keys, values = pairs["key"].copy(), np.ascontiguousarray(pairs["value"])
    return Update(head.tag, keys, values, path, head.sequence, head.version, crc, head.writer)


def _read_header_of(path: str) -> _Header:
    """The checked header of the update file at ``path`` (the errors of :func:`read_update` but
    a checksum mismatch); reads the header alone."""
    f, size = _open_regular(path)
    with f:
        return _read_header(f, size, path)


def _open_regular(path: str) -> tuple[BinaryIO, int]:
    """The regular file at ``path`` opened unbuffered, and its size; a symbolic link is not
    followed, a FIFO not waited on (both an :class:`UpdateFileError`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UpdateFileError(f"update file {path}: {_not_regular(stat.S_IFLNK)}") from error
        raise
    f = os.fdopen(fd, "rb", buffering=0)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        f.close()
        raise UpdateFileError(f"update file {path}: {_not_regular(info.st_mode)}")
    return f, info.st_size


def _not_regular(mode: int) -> str:
    kinds = {stat.S_IFLNK: "a symbolic link", stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO"}
    kind = kinds.get(stat.S_IFMT(mode), "a device or socket")
    return f"{kind}, not a regular file: an update is a file written with write_update, never followed or waited on"


def _incomplete(path: str, size: int, expected: str) -> UpdateIncomplete:
    return UpdateIncomplete(
        f"update file {path}: {size} bytes, but {expected}: incomplete (truncated, or still being copied in)"
    )


class _Header(NamedTuple):
    path: str
    version: int
    dim: int
    tag: str
    count: int
    crc: int  # CRC-32 of the header
    sequence: int  # version 1: the time its name starts with
    writer: int  # 0 in version 1


def _read_header(f: BinaryIO, size: int, path: str) -> _Header:
    """The checked header of ``f`` of ``size`` bytes (a 32-byte read, then the rest of the tag if
    it is longer), the size it declares checked against ``size``; leaves ``f`` at the first row."""

    def bad(what: str) -> UpdateFileError:
        return UpdateFileError(f"update file {path}: {what}")

    head = f.read(_PROBE)
    if len(head) < _HEAD.size:
        if not _MAGIC_BYTES.startswith(head[:4]):
            raise bad(f"it starts with {head[:4]!r}, not {_MAGIC_BYTES!r}: not an update file")
        raise _incomplete(path, size, f"the header alone is {_HEAD.size} bytes")
    magic, value_size, version, key_size, tag_len = _HEAD.unpack_from(head)
    if magic != MAGIC:
        raise bad(f"magic {magic:#010x} is not {MAGIC:#010x}: not an update file")
    if version not in (1, FORMAT_VERSION):
        raise bad(f"format version {version} is not 1 or {FORMAT_VERSION}; write it with this version of sok-hps")
    if key_size != 8 or value_size < 4 or value_size % 4:
        raise bad(f"key size {key_size} / value size {value_size}: expected 8-byte keys and float32 rows")
    if tag_len > _MAX_TAG:
        raise bad(f"tag length {tag_len} is over {_MAX_TAG}: not an update file")
    fixed = _HEAD.size + (_ORDER.size if version >= 2 else 0)
    header_size = fixed + tag_len + _COUNT.size
    if size < header_size:
        raise _incomplete(path, size, f"its header is {header_size} bytes")
    head = (head + f.read(max(0, header_size - len(head))))[:header_size]
    f.seek(header_size)
    tag = head[fixed : fixed + tag_len].decode(errors="replace")
    if not _TAG.fullmatch(tag):
        raise bad(f"tag {tag!r} is not hps_et.<model>.<table>")
    (count,) = _COUNT.unpack_from(head, fixed + tag_len)
    dim = value_size // 4
    expected = header_size + count * (8 + 4 * dim) + _CRC.size
    what = f"its header says {count} rows of dim {dim} ({expected} bytes)"
    if size < expected:
        raise _incomplete(path, size, what)
    if size > expected:
        raise bad(f"{size} bytes, but {what}: data after the end")
    sequence, writer = _ORDER.unpack_from(head, _HEAD.size) if version >= 2 else (_sequence_of_name(path), 0)
    return _Header(path, version, dim, tag, count, zlib.crc32(head), sequence, writer)


def _read_into(f: BinaryIO, buffer: np.ndarray, crc: int, incomplete: Callable[[str], Exception]) -> int:
    """Fill the bytes ``buffer`` from ``f`` in chunks of ``_CHUNK``; returns ``crc`` continued over them."""
    view = memoryview(buffer)
    done = 0
    while done < len(view):
        got = f.readinto(view[done : done + _CHUNK])
        if not got:
            raise incomplete("it ended while it was read")
        crc = zlib.crc32(view[done : done + got], crc)
        done += got
    return crc


def _sequence_of_name(path: str) -> int:
    """The sequence of a version-1 file: the time its name starts with."""
    name = os.path.basename(path)
    match = _NAME_TIME.match(name)
    if match is None:
        raise UpdateFileError(
            f"update file {path}: format version 1 orders a file by the time its name starts with "
            f"(<20 digits>-<pid>-<counter>{SUFFIX}), and {name!r} has none; give it back its name, or write "
            f"its rows again with write_update"
        )
    return int(match.group(1))


class DirectoryUpdateSource:
    """Update files of a directory, each applied once, in the order of their sequence per writer
    (the module docstring tells the rules: order, rejected, refused and incomplete files).

    Args:
        directory: where training writes the files (made when missing).
        poll_interval_s: pause between looks at the directory in the background thread.
        model_filters: regular expressions; an update applies when one matches its model name
            in full (``[".+"]``: every model).
        incomplete_timeout_s: how long a file shorter than its header says may keep the same
            size before it is rejected (it may still be being copied in until then).

    Example::

        source = DirectoryUpdateSource("updates", model_filters=["foo", "bar_.*"])
        for update in source.poll():
            tier.insert(update.tag, update.keys, update.values)
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        poll_interval_s: float = 1.0,
        model_filters: Sequence[str] = (".+",),
        incomplete_timeout_s: float = 300.0,
    ) -> None:
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s!r}")
        if incomplete_timeout_s < 0:
            raise ValueError(f"incomplete_timeout_s must be >= 0, got {incomplete_timeout_s!r}")
        self.directory = os.fspath(directory)
        self.poll_interval_s = poll_interval_s
        self.model_filters = tuple(model_filters)
        self.incomplete_timeout_s = incomplete_timeout_s
        self._filters = [re.compile(f) for f in self.model_filters]
        self._seen: set[str] = set()  # names applied (or returned), filtered out, rejected or unapplied
        self._unapplied: dict[str, str] = {}  # name -> why ``apply`` refused it (the file is left in place)
        self._waiting: dict[str, tuple[tuple[int, int], float]] = {}  # incomplete: (size, mtime), since
        self._newest: dict[tuple[int, str], int] = {}  # (writer, tag) -> the sequence of its newest update applied
        self._applied: dict[tuple[Any, ...], str] = {}  # fingerprint -> the name it was applied from
        self._warned: set[tuple[str, str]] = set()  # ("read" or "apply", path) that failed and is tried again
        self._unlisted = False
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        os.makedirs(self.directory, exist_ok=True)

    @classmethod
    def from_config(cls, cfg: UpdateSourceConfig, model_filters: Iterable[str] = (".+",)) -> DirectoryUpdateSource:
        """The source ``update_source`` describes (its type must be ``"directory"``)."""
        if cfg.type != "directory":
            raise ValueError(f"update_source.type is {cfg.type!r}; a DirectoryUpdateSource needs 'directory'")
        return cls(cfg.path, cfg.poll_interval_ms / 1000.0, tuple(model_filters))

    @property
    def unapplied(self) -> dict[str, str]:
        """The files the ``apply`` of :meth:`start` refused (left in the directory, never tried
        again by this source): name -> why."""
        with self._lock:
            return dict(self._unapplied)

    def _wanted(self, model: str) -> bool:
        return any(f.fullmatch(model) for f in self._filters)

    def poll(self) -> list[Update]:
        """The updates of files not seen before, in sequence order, each taken as applied. Files
        bad for every reader are moved to ``<directory>/rejected/`` with an error line; one whose
        model no filter matches is skipped; an incomplete one is read again at a later poll. The
        list holds every new file's rows: :meth:`start` holds one file's at a time."""
        with self._lock:
            ready = []
            for update in self._updates():
                if self._admit(update):
                    self._record(update)
                    ready.append(update)
            return ready

    # -- reading the directory ------------------------------------------------------------------
    def _updates(self) -> Iterator[Update]:
        """The complete, wanted updates of the files not seen before, in order: the headers of all
        are read to order them, then each file whole when its turn comes (one in memory at a time).
        A name joins the seen ones when its update is applied, rejected, refused or filtered out,
        never before: a file left when the caller stops (or an error stops the caller) is read again
        at the next poll."""
        heads = []
        for name in self._new_names():
            head = self._open(name, _read_header_of)
            if head is None:
                continue
            if self._wanted(head.tag.split(".")[1]):
                heads.append(head)
            else:
                log.debug("update %s of tag %s matches no filter %s", name, head.tag, self.model_filters)
                self._seen.add(name)
        for head in sorted(heads, key=_order):
            update = self._open(os.path.basename(head.path), read_update)
            if update is not None:
                yield update
                del update  # not held while the next file is read

    def _new_names(self) -> list[str]:
        try:
            names = os.listdir(self.directory)
        except OSError as error:
            if not self._unlisted:
                log.warning(
                    "the update directory %s cannot be listed (%s); trying again at every poll", self.directory, error
                )
            self._unlisted = True
            return []
        if self._unlisted:
            log.warning("the update directory %s can be listed again", self.directory)
            self._unlisted = False
        return sorted(n for n in names if n.endswith(SUFFIX) and n not in self._seen)

    def _open(self, name: str, read: Callable[[str], Any]) -> Any:
        """``read(path)`` of file ``name`` (its header or its update), or None: rejected, incomplete,
        gone, or unreadable for now."""
        path = os.path.join(self.directory, name)
        try:
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode):
                self._reject(path, f"update file {path}: {_not_regular(info.st_mode)}")
                return None
            result = read(path)
        except FileNotFoundError:  # another source moved it aside meanwhile
            self._waiting.pop(name, None)
            return None
        except UpdateIncomplete as error:
            self._wait(path, info, error)
            return None
        except UpdateFileError as error:
            self._reject(path, str(error))
            return None
        except OSError as error:
            self._warn_once(
                ("read", path), "update file %s cannot be read (%s); trying again at every poll", path, error
            )
            return None
        self._waiting.pop(name, None)
        self._warned.discard(("read", path))
        return result

    def _wait(self, path: str, info: os.stat_result, error: UpdateIncomplete) -> None:
        """Keep the incomplete file for a later poll; reject it once it has kept its size too long."""
        name, state, now = os.path.basename(path), (info.st_size, info.st_mtime_ns), time.monotonic()
        previous = self._waiting.get(name)
        if previous is None:
            log.info("%s; reading it again until it is complete", error)
        if previous is None or previous[0] != state:
            self._waiting[name] = previous = (state, now)
        if now - previous[1] >= self.incomplete_timeout_s:
            self._reject(path, f"{error}; its size has not changed for {self.incomplete_timeout_s:g} s")

    # -- order ------------------------------------------------------------------------------------
    def _admit(self, update: Update) -> bool:
        """Whether ``update`` may apply now: not a duplicate, not older than an update of its writer
        and table applied (otherwise its file is rejected)."""
        original = self._applied.get(_fingerprint(update))
        if original is not None:
            self._reject(
                update.path,
                f"update file {update.path}: a duplicate of {original}, applied already (the same writer "
                f"{update.writer:#018x}, sequence {update.sequence} and checksum {update.checksum:#010x}); write its "
                f"rows again to apply them again",
            )
            return False
        newest = self._newest.get((update.writer, update.tag), -1)
        if update.sequence < newest:
            self._reject(
                update.path,
                f"update file {update.path}: its sequence {update.sequence} is older than {newest}, that of the "
                f"newest update of {update.tag} by the same writer ({update.writer:#018x}) applied: it arrived "
                f"late; applied now it would undo newer rows (and a replay would apply it before them). Write its "
                f"rows again with write_update to apply them",
            )
            return False
        return True

    def _record(self, update: Update) -> None:
        """Take ``update`` as applied."""
        name = os.path.basename(update.path)
        key = (update.writer, update.tag)
        self._newest[key] = max(update.sequence, self._newest.get(key, -1))
        self._applied[_fingerprint(update)] = name
        self._seen.add(name)
        if ("apply", update.path) in self._warned:
            self._warned.discard(("apply", update.path))
            log.warning("update %s applied after it failed", update.path)

    def _reject(self, path: str, why: str) -> None:
        """Move the file at ``path`` to ``rejected/`` (never seen again; a suffix ``.1``, ``.2``, ...
        when its name is taken there), with one error line."""
        name = os.path.basename(path)
        self._seen.add(name)
        self._waiting.pop(name, None)
        self._warned -= {("read", path), ("apply", path)}
        folder = os.path.join(self.directory, REJECTED)
        try:
            os.makedirs(folder, exist_ok=True)
            target = os.path.join(folder, name)
            for suffix in itertools.count(1):
                if not os.path.lexists(target):
                    break
                target = os.path.join(folder, f"{name}.{suffix}")
            os.replace(path, target)
        except OSError as error:
            log.error("%s; skipped (moving it to %s failed: %s)", why, folder, error)
            return
        log.error("%s; moved it to %s", why, target)

    def _refuse(self, update: Update, error: ValueError) -> None:
        """``apply`` refused ``update``: leave its file for other readers and never try it again."""
        name = os.path.basename(update.path)
        self._seen.add(name)
        self._warned.discard(("apply", update.path))
        self._unapplied[name] = str(error)
        log.error(
            "update file %s cannot be applied by this server: %s; nothing of it applied, the file left in place for "
            "other readers and not tried again by this source (restart the server to try it again)",
            update.path,
            error,
        )

    def _warn_once(self, failure: tuple[str, str], message: str, *args: Any) -> None:
        """``message`` as a warning the first time ``failure`` (what, path) happens, then as a debug line."""
        first = failure not in self._warned
        self._warned.add(failure)
        log.log(logging.WARNING if first else logging.DEBUG, message, *args)

    # -- the background thread ----------------------------------------------------------------------
    def start(self, apply: Callable[[Update], Any]) -> None:
        """Poll in a background thread and call ``apply`` on each update, in order, reading one
        file at a time. ``apply`` raising a :class:`ValueError` (:class:`UpdateRejected`) refuses
        the update for this source (its file stays, one error line); any other error retries it
        (it and those after it) at the next poll, with one warning.

        Raises:
            RuntimeError: the source runs already.
        """
        if self._thread is not None:
            raise RuntimeError(f"the update source of {self.directory} runs already; stop() it first")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(apply,), name="hps-updates", daemon=True)
        self._thread.start()

    def _run(self, apply: Callable[[Update], Any]) -> None:
        while True:
            try:
                self._step(apply)
            except Exception:  # noqa: BLE001 -- logged; the thread must live on
                log.exception("the update source of %s failed; it goes on at the next poll", self.directory)
            if self._stop.wait(self.poll_interval_s):
                return

    def _step(self, apply: Callable[[Update], Any]) -> None:
        """One poll: the new updates are applied in order, until one fails or the source stops."""
        with self._lock:
            for update in self._updates():
                if self._stop.is_set() or not self._apply(update, apply):
                    return
                del update  # not held while the next file is read

    def _apply(self, update: Update, apply: Callable[[Update], Any]) -> bool:
        """Apply ``update``, or reject or refuse it; False when it is to be tried again at the next poll."""
        if not self._admit(update):
            return True
        try:
            apply(update)
        except ValueError as error:  # UpdateRejected and its like: this server can never apply it
            self._refuse(update, error)
            return True
        except Exception as error:  # noqa: BLE001 -- e.g. tiers.TierUnavailable: tried again later
            self._warn_once(
                ("apply", update.path),
                "applying update %s failed (%s: %s); trying it again at every poll",
                update.path,
                type(error).__name__,
                error,
            )
            return False
        self._record(update)
        return True

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the background thread (after the update it applies now), waiting at most
        ``timeout_s`` for it (an error line if it has not ended then); idempotent."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout_s)
        if thread.is_alive():
            log.error(
                "the update thread of %s did not stop within %g s (an apply still runs); left to end on its own",
                self.directory,
                timeout_s,
            )


def _order(head: _Header) -> tuple[int, str]:
    return head.sequence, os.path.basename(head.path)


def _fingerprint(update: Update) -> tuple[Any, ...]:
    """What makes two files the same update: tag, writer, sequence and checksum (version 1: its content)."""
    sequence = update.sequence if update.version >= 2 else None
    return update.tag, update.writer, sequence, update.checksum, len(update.keys)


def dump_increment(
    directory: str | os.PathLike,
    model: str,
    table_names: Sequence[str],
    variables: Sequence[Any],
    time_threshold: Any,
) -> list[str]:
    """Write the rows of ``sok.DynamicVariable`` s changed since ``time_threshold`` as update files,
    one per table with changed rows (``sok.incremental_model_dump``; imports TensorFlow).

    Args:
        directory: the update source's directory.
        model: the model name of the ps_config.
        table_names: the ps_config's ``embedding_table_names``, one per variable.
        variables: the DynamicVariables, in the order of ``table_names``.
        time_threshold: a ``datetime.datetime`` (or one per variable), as
            ``sok.incremental_model_dump`` takes it.

    Returns:
        The paths written.

    Example::

        since = datetime.datetime.now(datetime.timezone.utc)
        ...  # train
        dump_increment("updates", "foo", ["sparse_embedding0"], [emb], since)
    """
    if len(table_names) != len(variables):
        raise ValueError(f"{len(table_names)} table names for {len(variables)} variables; give one per variable")
    import sparse_operation_kit as sok

    keys_list, values_list = sok.incremental_model_dump(list(variables), time_threshold)
    paths = []
    for table, keys, values in zip(table_names, keys_list, values_list):
        keys, values = np.asarray(keys), np.asarray(values)
        if len(keys):
            paths.append(write_update(directory, model, table, keys, values.reshape(len(keys), -1)))
    return paths
