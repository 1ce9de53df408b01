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
tag       UTF-8, ``hps_et.<model>.<table>``
u64       number of rows ``n``
n x       ``[key: 8 bytes][value: value size bytes of float32]``
u32       CRC-32 (zlib's) of every byte before it
========  ==========================================================

Version 1 (sok-hps before the sequence) has no sequence field; it is still read, and its sequence
is the time its name starts with (``<20 digits>-...``).

Names are ``<sequence, 20 digits>-<pid>-<counter>.hpsu``. A file is written under a hidden
temporary name in the same directory and renamed into place (``os.replace``). Files stay after
they are applied: a new source replays the directory from the start, as a new Kafka consumer group
does; delete old files to compact it.

**Order.** Updates apply in the order of their sequence (then name), never of their names or of
their arrival, and the same live as on a replay: an update whose sequence is older than the newest
one already applied to its table (tag) is refused, and so is a duplicate (a file with the sequence
and checksum of one applied, under another name; version 1: the same content). A refused file is
moved to ``<directory>/rejected/``, so a replay never sees it either.

**Rejected files** go to ``<directory>/rejected/`` with one error line that names the file and
why, and the updates after them go on: a file that is not an update (bad magic, version, tag,
checksum, data after its end), anything named ``*.hpsu`` that is not a regular file (a directory,
FIFO, device, or any symbolic link: none is opened or followed), a refused one (above), and one
that the ``apply`` callable refuses by raising a :class:`ValueError` (:class:`UpdateRejected`:
rows of the wrong width, keys the table cannot hold; nothing of it is applied). Any other error of
``apply`` (``tiers.TierUnavailable``: a database down) is retried at every poll, it and the
updates after it, with one warning.

**Incomplete files.** A file shorter than its header says (copied in with ``cp`` or ``scp``, not
renamed into place) is left where it is and read again at every poll until it is complete; it is
rejected only when its size and modification time have not changed for ``incomplete_timeout_s``
(default 300 s). A file is checked from its header first (a 32-byte read tells a junk file; the
size the header declares is compared with the file's before anything else is read) and the rows
are read in chunks of 8 MiB into the array that holds them.

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
from collections.abc import Callable, Iterable, Sequence
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
_SEQUENCE = struct.Struct("<Q")  # version 2: after _HEAD
_COUNT = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_PROBE = 32  # the first read of a file: the fixed header of every version
_MAX_TAG = len("hps_et..") + 2 * 120
_CHUNK = 8 << 20
_TAG = re.compile(rf"hps_et\.({NAME_PATTERN.pattern})\.({NAME_PATTERN.pattern})")
_NAME_TIME = re.compile(r"(\d{20})-")
_counter = itertools.count()
_sequence_lock = threading.Lock()
_last_sequence = 0


class UpdateFileError(ValueError):
    """An update file that cannot be applied: the message names the file and what is wrong."""


class UpdateIncomplete(UpdateFileError):
    """An update file shorter than its header says: truncated, or still being copied in."""


class UpdateRejected(ValueError):
    """An update that can never apply (raised by the ``apply`` of :meth:`DirectoryUpdateSource.start`):
    its file goes to ``rejected/`` and the updates after it go on.

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
    """

    tag: str
    keys: np.ndarray
    values: np.ndarray
    path: str = ""
    sequence: int = 0
    version: int = FORMAT_VERSION
    checksum: int = 0

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


def write_update(directory: str | os.PathLike, model: str, table: str, keys: np.ndarray, values: np.ndarray) -> str:
    """Write one update file atomically into ``directory`` (made when missing); returns its path.
    Its sequence is the time of the write, later than any this process wrote before.

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
    body = _HEAD.pack(MAGIC, 4 * dim, FORMAT_VERSION, 8, len(tag)) + _SEQUENCE.pack(sequence) + tag
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
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UpdateFileError(f"update file {path}: {_not_regular(stat.S_IFLNK)}") from error
        raise
    with os.fdopen(fd, "rb", buffering=0) as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UpdateFileError(f"update file {path}: {_not_regular(info.st_mode)}")
        return _read(f, info.st_size, path)


def _not_regular(mode: int) -> str:
    kinds = {stat.S_IFLNK: "a symbolic link", stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO"}
    kind = kinds.get(stat.S_IFMT(mode), "a device or socket")
    return f"{kind}, not a regular file: an update is a file written with write_update, never followed or waited on"


class _Header(NamedTuple):
    version: int
    dim: int
    tag: str
    count: int
    size: int  # of the header, in bytes
    crc: int  # CRC-32 of the header
    sequence: int  # version 2; 0 in version 1


def _read(f: BinaryIO, size: int, path: str) -> Update:
    """The update in the open regular file ``f`` of ``size`` bytes."""

    def incomplete(expected: str) -> UpdateIncomplete:
        return UpdateIncomplete(
            f"update file {path}: {size} bytes, but {expected}: incomplete (truncated, or still being copied in)"
        )

    head = _read_header(f, size, path, incomplete)
    expected = head.size + head.count * (8 + 4 * head.dim) + _CRC.size
    what = f"its header says {head.count} rows of dim {head.dim} ({expected} bytes)"
    if size < expected:
        raise incomplete(what)
    if size > expected:
        raise UpdateFileError(f"update file {path}: {size} bytes, but {what}: data after the end")
    sequence = head.sequence if head.version >= 2 else _sequence_of_name(path)
    pairs = np.empty(head.count, _pairs(head.dim))
    crc = _read_into(f, pairs.view(np.uint8), head.crc, incomplete)
    if f.read(_CRC.size) != _CRC.pack(crc):
        raise UpdateFileError(f"update file {path}: checksum mismatch: the file is corrupt")
    keys, values = pairs["key"].copy(), np.ascontiguousarray(pairs["value"])
    return Update(head.tag, keys, values, path, sequence=sequence, version=head.version, checksum=crc)


def _read_header(f: BinaryIO, size: int, path: str, incomplete: Callable[[str], Exception]) -> _Header:
    """The checked header of ``f`` (a 32-byte read, then the rest of the tag if it is longer);
    leaves ``f`` at the first row."""

    def bad(what: str) -> UpdateFileError:
        return UpdateFileError(f"update file {path}: {what}")

    head = f.read(_PROBE)
    if len(head) < _HEAD.size:
        if not _MAGIC_BYTES.startswith(head[:4]):
            raise bad(f"it starts with {head[:4]!r}, not {_MAGIC_BYTES!r}: not an update file")
        raise incomplete(f"the header alone is {_HEAD.size} bytes")
    magic, value_size, version, key_size, tag_len = _HEAD.unpack_from(head)
    if magic != MAGIC:
        raise bad(f"magic {magic:#010x} is not {MAGIC:#010x}: not an update file")
    if version not in (1, FORMAT_VERSION):
        raise bad(f"format version {version} is not 1 or {FORMAT_VERSION}; write it with this version of sok-hps")
    if key_size != 8 or value_size < 4 or value_size % 4:
        raise bad(f"key size {key_size} / value size {value_size}: expected 8-byte keys and float32 rows")
    if tag_len > _MAX_TAG:
        raise bad(f"tag length {tag_len} is over {_MAX_TAG}: not an update file")
    fixed = _HEAD.size + (_SEQUENCE.size if version >= 2 else 0)
    header_size = fixed + tag_len + _COUNT.size
    if size < header_size:
        raise incomplete(f"its header is {header_size} bytes")
    head = (head + f.read(max(0, header_size - len(head))))[:header_size]
    f.seek(header_size)
    tag = head[fixed : fixed + tag_len].decode(errors="replace")
    if not _TAG.fullmatch(tag):
        raise bad(f"tag {tag!r} is not hps_et.<model>.<table>")
    (count,) = _COUNT.unpack_from(head, fixed + tag_len)
    (sequence,) = _SEQUENCE.unpack_from(head, _HEAD.size) if version >= 2 else (0,)
    return _Header(version, value_size // 4, tag, count, header_size, zlib.crc32(head), sequence)


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
    """Update files of a directory, each applied once, in the order of their sequence (the module
    docstring tells the rules: order, rejected and incomplete files).

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
        self._seen: set[str] = set()  # names read (returned or filtered out) or rejected
        self._waiting: dict[str, tuple[tuple[int, int], float]] = {}  # incomplete: (size, mtime), since
        self._newest: dict[str, int] = {}  # tag -> the sequence of its newest update applied
        self._applied: dict[tuple[Any, ...], str] = {}  # fingerprint -> the name it was applied from
        self._warned: set[str] = set()  # paths that failed (read or apply) and are tried again
        self._unlisted = False
        self._pending: list[Update] = []
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

    def _wanted(self, model: str) -> bool:
        return any(f.fullmatch(model) for f in self._filters)

    def poll(self) -> list[Update]:
        """The updates of files not seen before, in sequence order, each taken as applied. Files
        that cannot apply are moved to ``<directory>/rejected/`` with an error line; one whose
        model no filter matches is skipped; an incomplete one is read again at a later poll."""
        with self._lock:
            ready = []
            for update in self._collect():
                if self._admit(update):
                    self._record(update)
                    ready.append(update)
            return ready

    # -- reading the directory ------------------------------------------------------------------
    def _collect(self) -> list[Update]:
        """The complete, wanted updates of the files not seen before, in order."""
        updates = (self._take(name) for name in self._new_names())
        return sorted((u for u in updates if u is not None), key=_order)

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

    def _take(self, name: str) -> Update | None:
        """The update of file ``name``, or None: rejected, incomplete, unreadable for now, or not wanted."""
        path = os.path.join(self.directory, name)
        try:
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode):
                self._reject(path, f"update file {path}: {_not_regular(info.st_mode)}")
                return None
            update = read_update(path)
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
            self._warn_once(path, "update file %s cannot be read (%s); trying again at every poll", path, error)
            return None
        self._seen.add(name)
        self._waiting.pop(name, None)
        self._warned.discard(path)
        if self._wanted(update.model):
            return update
        log.debug("update %s of model %s matches no filter %s", name, update.model, self.model_filters)
        return None

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
        """Whether ``update`` may apply now: not a duplicate, not older than its table's newest
        update applied (otherwise its file is rejected)."""
        original = self._applied.get(_fingerprint(update))
        if original is not None:
            self._reject(
                update.path,
                f"update file {update.path}: a duplicate of {original}, applied already (the same sequence "
                f"{update.sequence} and checksum {update.checksum:#010x}); write its rows again to apply them again",
            )
            return False
        newest = self._newest.get(update.tag, -1)
        if update.sequence < newest:
            self._reject(
                update.path,
                f"update file {update.path}: its sequence {update.sequence} is older than {newest}, that of the "
                f"newest update of {update.tag} applied; applied now it would undo newer rows (and a replay would "
                f"apply it before them). Write its rows again with write_update to apply them",
            )
            return False
        return True

    def _record(self, update: Update) -> None:
        self._newest[update.tag] = max(update.sequence, self._newest.get(update.tag, -1))
        self._applied[_fingerprint(update)] = os.path.basename(update.path)

    def _reject(self, path: str, why: str) -> None:
        """Move the file at ``path`` to ``rejected/`` (never seen again), with one error line."""
        name = os.path.basename(path)
        self._seen.add(name)
        self._waiting.pop(name, None)
        self._warned.discard(path)
        target = os.path.join(self.directory, REJECTED)
        try:
            os.makedirs(target, exist_ok=True)
            os.replace(path, os.path.join(target, name))
        except OSError as error:
            log.error("%s; skipped (moving it to %s failed: %s)", why, target, error)
            return
        log.error("%s; moved it to %s", why, target)

    def _warn_once(self, path: str, message: str, *args: Any) -> None:
        """``message`` as a warning the first time ``path`` fails, then as a debug line."""
        first = path not in self._warned
        self._warned.add(path)
        log.log(logging.WARNING if first else logging.DEBUG, message, *args)

    # -- the background thread ----------------------------------------------------------------------
    def start(self, apply: Callable[[Update], Any]) -> None:
        """Poll in a background thread and call ``apply`` on each update, in order. ``apply``
        raising a :class:`ValueError` (:class:`UpdateRejected`) rejects the update for good; any
        other error retries it (it and those after it) at the next poll, with one warning.

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
        """One poll: the new updates join those waiting, in order, and are applied until one fails."""
        with self._lock:
            self._pending = sorted(self._pending + self._collect(), key=_order)
        while self._pending and not self._stop.is_set():
            if not self._apply(self._pending[0], apply):
                return
            self._pending.pop(0)

    def _apply(self, update: Update, apply: Callable[[Update], Any]) -> bool:
        """Apply ``update``, or reject it; False when it is to be tried again at the next poll."""
        with self._lock:
            if not self._admit(update):
                return True
        try:
            apply(update)
        except ValueError as error:  # UpdateRejected and its like: it can never apply
            with self._lock:
                self._reject(update.path, f"update file {update.path} cannot be applied: {error}")
            return True
        except Exception as error:  # noqa: BLE001 -- e.g. tiers.TierUnavailable: tried again later
            self._warn_once(
                update.path,
                "applying update %s failed (%s: %s); trying it again at every poll",
                update.path,
                type(error).__name__,
                error,
            )
            return False
        with self._lock:
            self._record(update)
            if update.path in self._warned:
                self._warned.discard(update.path)
                log.warning("update %s applied after it failed", update.path)
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


def _order(update: Update) -> tuple[int, str]:
    return update.sequence, os.path.basename(update.path)


def _fingerprint(update: Update) -> tuple[Any, ...]:
    """What makes two files the same update: tag, sequence and checksum (version 1: its content)."""
    sequence = update.sequence if update.version >= 2 else None
    return update.tag, sequence, update.checksum, len(update.keys)


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
