"""Online updates: files of changed rows written by training and applied to running tiers.

The original fed updates through Kafka (reference §3.9). Here the update source is a directory
(``update_source: {"type": "directory", "path": ...}``): training writes one file per table and
dump (:func:`write_update`, or :func:`dump_increment` around ``sok.incremental_model_dump``), and
each server's :class:`DirectoryUpdateSource` applies the files in name order, which is time
order.

File format (version :data:`FORMAT_VERSION`; all little-endian), after the Kafka payload's idea:

========  ==========================================================
u32       magic ``0x52544348`` (the bytes ``HCTR``, as the Kafka payload)
u32       value size in bytes (``4 * dim``)
u16       format version
u16       key size in bytes (8: int64 keys; uint64 keys keep their bits)
u32       length of the tag in bytes, then the tag (UTF-8): ``hps_et.<model>.<table>``
u64       number of rows ``n``
n x       ``[key: 8 bytes][value: value size bytes of float32]``
u32       CRC-32 (zlib's) of every byte before it
========  ==========================================================

Names are ``<ns since the epoch, 20 digits>-<pid>-<counter>.hpsu``. A file is written under a
hidden temporary name in the same directory and renamed into place (``os.replace``), so a reader
never sees part of one. Files stay after they are applied: a new source replays the directory from
the start, as a new Kafka consumer group does; delete old files to compact it.

Example::

    write_update("updates", "foo", "sparse_embedding0", keys, rows)    # 'updates/0000...-1-000000.hpsu'
    source = DirectoryUpdateSource("updates", poll_interval_s=0.5, model_filters=["foo"])
    source.start(lambda u: tier.insert(u.tag, u.keys, u.values))
    ...
    source.stop()
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import NAME_PATTERN, UpdateSourceConfig

__all__ = [
    "DirectoryUpdateSource",
    "FORMAT_VERSION",
    "Update",
    "UpdateFileError",
    "dump_increment",
    "read_update",
    "write_update",
]

log = logging.getLogger(__name__)

MAGIC = 0x52544348
FORMAT_VERSION = 1
SUFFIX = ".hpsu"
REJECTED = "rejected"
_HEAD = struct.Struct("<IIHHI")  # magic, value size, version, key size, tag length
_COUNT = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_TAG = re.compile(rf"hps_et\.({NAME_PATTERN.pattern})\.({NAME_PATTERN.pattern})")
_counter = itertools.count()


class UpdateFileError(ValueError):
    """An update file that cannot be applied: the message names the file and what is wrong."""


@dataclass(frozen=True)
class Update:
    """The rows of one update file.

    Attributes:
        tag: ``hps_et.<model>.<table>``.
        keys: int64 ``[n]``.
        values: float32 ``[n, dim]``.
        path: the file it came from.
    """

    tag: str
    keys: np.ndarray
    values: np.ndarray
    path: str = ""

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


def write_update(directory: str | os.PathLike, model: str, table: str, keys: np.ndarray, values: np.ndarray) -> str:
    """Write one update file atomically into ``directory`` (made when missing); returns its path.

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
    body = _HEAD.pack(MAGIC, 4 * dim, FORMAT_VERSION, 8, len(tag)) + tag + _COUNT.pack(len(keys)) + pairs.tobytes()
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}-{next(_counter):06d}{SUFFIX}"
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
    """Read and check one update file.

    Raises:
        UpdateFileError: wrong magic or version, a bad tag, a size that does not fit the header
            (truncated), or a checksum mismatch (corrupt).
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()

    def bad(what: str) -> UpdateFileError:
        return UpdateFileError(f"update file {path}: {what}")

    if len(data) < _HEAD.size + _COUNT.size + _CRC.size:
        raise bad(f"{len(data)} bytes is shorter than any update file: truncated")
    magic, value_size, version, key_size, tag_len = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise bad(f"magic {magic:#010x} is not {MAGIC:#010x}: not an update file")
    if version != FORMAT_VERSION:
        raise bad(f"format version {version} is not {FORMAT_VERSION}; write it with this version of sok-hps")
    if key_size != 8 or value_size < 4 or value_size % 4:
        raise bad(f"key size {key_size} / value size {value_size}: expected 8-byte keys and float32 rows")
    end_tag = _HEAD.size + tag_len
    tag = data[_HEAD.size : end_tag].decode(errors="replace")
    if not _TAG.fullmatch(tag):
        raise bad(f"tag {tag!r} is not hps_et.<model>.<table>")
    (count,) = _COUNT.unpack_from(data, end_tag)
    start = end_tag + _COUNT.size
    dim = value_size // 4
    expected = start + count * (8 + value_size) + _CRC.size
    if len(data) != expected:
        raise bad(f"{len(data)} bytes, but its header says {count} rows of dim {dim} ({expected} bytes): truncated")
    (crc,) = _CRC.unpack_from(data, expected - _CRC.size)
    if zlib.crc32(memoryview(data)[: expected - _CRC.size]) != crc:
        raise bad("checksum mismatch: the file is corrupt")
    pairs = np.frombuffer(data, _pairs(dim), count=count, offset=start)
    return Update(tag, pairs["key"].copy(), np.ascontiguousarray(pairs["value"]), path)


class DirectoryUpdateSource:
    """Update files of a directory, each applied once, in name order.

    Args:
        directory: where training writes the files (made when missing).
        poll_interval_s: pause between looks at the directory in the background thread.
        model_filters: regular expressions; an update applies when one matches its model name
            in full (``[".+"]``: every model).

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
    ) -> None:
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s!r}")
        self.directory = os.fspath(directory)
        self.poll_interval_s = poll_interval_s
        self.model_filters = tuple(model_filters)
        self._filters = [re.compile(f) for f in self.model_filters]
        self._seen: set[str] = set()
        self._lock = threading.Lock()
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
        """The updates of files not seen before, in name order. A file that is not a valid update
        is moved to ``<directory>/rejected/`` with a warning; one whose model no filter matches
        is skipped."""
        with self._lock:
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(SUFFIX) and n not in self._seen)
            updates = []
            for name in names:
                self._seen.add(name)
                path = os.path.join(self.directory, name)
                try:
                    update = read_update(path)
                except FileNotFoundError:  # another source moved it aside meanwhile
                    continue
                except UpdateFileError as e:
                    self._reject(path, e)
                    continue
                if self._wanted(update.model):
                    updates.append(update)
                else:
                    log.debug("update %s of model %s matches no filter %s", name, update.model, self.model_filters)
            return updates

    def _reject(self, path: str, error: Exception) -> None:
        target = os.path.join(self.directory, REJECTED)
        os.makedirs(target, exist_ok=True)
        try:
            os.replace(path, os.path.join(target, os.path.basename(path)))
        except FileNotFoundError:
            return
        log.warning("%s; moved it to %s", error, target)

    def start(self, apply: Callable[[Update], Any]) -> None:
        """Poll in a background thread and call ``apply`` on each update, in order. An update
        whose ``apply`` raises is retried (it and those after it) at the next poll, with a warning.

        Raises:
            RuntimeError: the source runs already.
        """
        if self._thread is not None:
            raise RuntimeError(f"the update source of {self.directory} runs already; stop() it first")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(apply,), name="hps-updates", daemon=True)
        self._thread.start()

    def _run(self, apply: Callable[[Update], Any]) -> None:
        pending: list[Update] = []
        while True:
            pending += self.poll()
            while pending:
                try:
                    apply(pending[0])
                except Exception as e:  # noqa: BLE001 -- retried at the next poll; the thread must live on
                    log.warning("applying update %s failed (%s: %s); retrying", pending[0].path, type(e).__name__, e)
                    break
                pending.pop(0)
            if self._stop.wait(self.poll_interval_s):
                return

    def stop(self) -> None:
        """Stop the background thread (after the update it applies now); idempotent."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()


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
