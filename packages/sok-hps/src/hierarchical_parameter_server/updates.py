"""Online updates: files of changed rows written by training and applied to running tiers.

The original fed updates through Kafka (reference §3.9). Here the update source is a directory
(``update_source: {"type": "directory", "path": ...}``): training writes one file per table and
dump (:func:`write_update`, or :func:`dump_increment` around ``sok.incremental_model_dump``), and
each server's :class:`DirectoryUpdateSource` applies them.

The work is C++ (``csrc/serving/update_files.cpp``: the format, reading and writing;
``csrc/serving/update_source.cpp``: the source), called through
``hierarchical_parameter_server._serving``: the C++ server reads the same files with the same code,
so the two cannot disagree. This module is a thin layer over it: the :class:`Update` dataclass,
NumPy's arrays for the rows (the C++ reader fills them without the GIL), the logging (the C++
source's lines go to this module's logger), the background thread (a daemon
:class:`threading.Thread` whose body is the C++ loop, run without the GIL) and
:func:`dump_increment`.

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
temporary name in the same directory (by C++, without the GIL) and renamed into place
(``os.replace``). Files stay after
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

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _serving
from .config import UpdateSourceConfig

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

# The format's constants, from the C++ implementation (update_files.hpp):
#: The first 4 bytes of every update file (``HCTR``, little-endian).
MAGIC: int = _serving.UPDATE_MAGIC
#: The format version :func:`write_update` writes (version 1 is read too).
FORMAT_VERSION: int = _serving.UPDATE_FORMAT_VERSION
#: The suffix of an update file's name; other names in the directory are not updates.
SUFFIX: str = _serving.UPDATE_SUFFIX
#: The folder of the update directory that files bad for every reader are moved to.
REJECTED: str = _serving.UPDATE_REJECTED_FOLDER

#: An update file that cannot be applied: the message names the file and what is wrong (a
#: ``ValueError``; raised by the C++ reader).
UpdateFileError = _serving.UpdateFileError
#: An update file shorter than its header says: truncated, or still being copied in (an
#: :class:`UpdateFileError`).
UpdateIncomplete = _serving.UpdateIncomplete


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


def _read_into(count: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The arrays the C++ reader reads the rows of an update of ``count`` rows of ``dim`` into
    (without the GIL): keys int64 ``[count]``, values float32 ``[count, dim]``."""
    return np.empty(count, np.int64), np.empty((count, dim), np.float32)


def _rows(count: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_read_into`, looked up at each call (a test may replace it)."""
    return _read_into(count, dim)


def _monotonic() -> float:
    """:func:`time.monotonic`, looked up at each call (a test may replace it): the clock of the
    incomplete files' timeout."""
    return time.monotonic()


def _log(level: int, message: str, error: BaseException | None) -> None:
    """A line of the C++ source, on this module's logger (``error``: the exception a poll failed with)."""
    log.log(level, message, exc_info=error)


def write_update(directory: str | os.PathLike, model: str, table: str, keys: np.ndarray, values: np.ndarray) -> str:
    """Write one update file atomically into ``directory`` (made when missing); returns its path.
    Its sequence is the time of the write, later than any this process wrote before; its writer is
    this thread's id (the order of updates is kept per writer: the module docstring). C++ writes
    the file under a temporary name, without the GIL; it is renamed into place with
    :func:`os.replace`.

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
        _serving.check_update_name(what, name)
    keys, values = np.asarray(keys), np.asarray(values)
    if keys.ndim != 1 or keys.dtype.kind not in "iu" or values.ndim != 2 or len(values) != len(keys):
        raise ValueError(
            f"keys must be integer [n] and values [n, dim]; got {keys.dtype} {keys.shape} and {values.shape}"
        )
    if values.shape[1] < 1:
        raise ValueError(f"values must have dim >= 1, got shape {values.shape}")
    keys = np.ascontiguousarray(keys.view(np.int64) if keys.dtype == np.uint64 else keys, dtype=np.int64)
    values = np.ascontiguousarray(values, dtype=np.float32)
    temporary, path = _serving.stage_update(os.fspath(directory), model, table, keys, values)
    try:
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    log.debug("wrote update %s: %d rows of hps_et.%s.%s", os.path.basename(path), len(keys), model, table)
    return path


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
    return Update(*_serving.read_update(os.fspath(path), _rows))


class DirectoryUpdateSource:
    """Update files of a directory, each applied once, in the order of their sequence per writer
    (the module docstring tells the rules: order, rejected, refused and incomplete files). The
    source is C++ (``_serving.UpdateSource``); this class gives it its callbacks and its thread.

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
        self.directory = os.fspath(directory)
        self.poll_interval_s = poll_interval_s
        self.model_filters = tuple(model_filters)
        self.incomplete_timeout_s = incomplete_timeout_s
        self._native = _serving.UpdateSource(
            self.directory, poll_interval_s, self.model_filters, incomplete_timeout_s, _log, _monotonic, _rows
        )
        self._thread: threading.Thread | None = None

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
        return self._native.unapplied

    def poll(self) -> list[Update]:
        """The updates of files not seen before, in sequence order, each taken as applied. Files
        bad for every reader are moved to ``<directory>/rejected/`` with an error line; one whose
        model no filter matches is skipped; an incomplete one is read again at a later poll. The
        list holds every new file's rows: :meth:`start` holds one file's at a time."""
        return [Update(*fields) for fields in self._native.poll()]

    def start(self, apply: Callable[[Update], Any]) -> None:
        """Poll in a background thread and call ``apply`` on each update, in order, reading one
        file at a time. ``apply`` raising a :class:`ValueError` (:class:`UpdateRejected`) refuses
        the update for this source (its file stays, one error line); any other error retries it
        (it and those after it) at the next poll, with one warning. The thread is a daemon
        :class:`threading.Thread` (``hps-updates``) running the C++ loop without the GIL.

        Raises:
            RuntimeError: the source runs already.
        """

        def launch(loop: Callable[[], None]) -> None:
            self._thread = threading.Thread(target=loop, name="hps-updates", daemon=True)
            self._thread.start()

        self._native.start(lambda fields: apply(Update(*fields)), launch)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the background thread (after the update it applies now), waiting at most
        ``timeout_s`` for it (an error line if it has not ended then); idempotent."""
        thread, self._thread = self._thread, None
        if self._native.stop(timeout_s) and thread is not None:
            thread.join(timeout_s)


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
