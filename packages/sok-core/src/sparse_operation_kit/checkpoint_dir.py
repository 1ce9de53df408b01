"""Where a checkpoint lives: which directories ``sok.dump`` may replace, its staging directory, and the
swap that puts a finished checkpoint in place. One source of truth for these names and rules.

Rules:

* ``sok.dump(path)`` replaces only a previous SOK checkpoint: a directory that is empty or holds
  nothing but ``manifest.json`` and files with SOK's 296-byte header (ours or NVIDIA SOK's). Any
  other content (a file of the user's, a sub-directory), or ``path`` being a regular file, is refused
  with :class:`~sparse_operation_kit.checkpoint_format.CheckpointError` naming what is there; dump
  never deletes or hides a file it did not write.
* A dump writes into a staging directory beside ``path`` (beside its target when it is a symbolic
  link; missing parent directories are made) (``.<name>.sok-tmp-<random>``, holding the
  marker file :data:`STAGING_MARK` until it is complete), created with the permissions the umask
  gives (not mkdtemp's 0700), and locked (``flock``) while its dump runs.
* The finished staging directory takes ``path``'s place with one atomic exchange
  (``renameat2(RENAME_EXCHANGE)``), so ``path`` always holds the old or the new checkpoint; the old one
  is then deleted. Where the file system cannot exchange, two renames are used (a crash between them
  leaves ``path`` missing and both checkpoints beside it: :func:`leftovers` names them).
* Leftovers of crashed dumps (staging directories and old checkpoints set aside) are deleted by the
  next dump of the same path; one that is locked belongs to a dump still running and is kept.
  Nothing ever renames a leftover back into place: a reader never resurrects a checkpoint.
* Several dumps of one path may run at once (processes or threads): each writes its own staging
  directory, and they take turns, through the path's dump lock (:func:`dump_lock`: ``flock`` of
  ``.<name>.sok-lock`` beside ``path``, present only while held), to check ``path``, delete
  leftovers and create their staging directory, and to swap. So a dump deletes only staging
  directories whose dump is gone, and the last dump to swap wins. A dump waits at most
  :data:`LOCK_WAIT_S` seconds for its turn, then raises CheckpointError naming the process that
  holds the lock.
* A reader (``sok.load``, ``sok ckpt inspect``, ``sok ckpt convert``) opens the checkpoint directory
  once (:func:`open_for_reading`) and every file relative to it, so a dump that replaces ``path``
  meanwhile cannot mix the files of two checkpoints. When that dump deletes the directory being
  read, the reader raises :class:`~sparse_operation_kit.checkpoint_format.CheckpointChanged`
  ("changed while it was read"), never "corrupt"; :func:`read_consistently` then reads again, at
  most :data:`READ_ATTEMPTS` times. Staging directories are refused, and the leftovers named when
  ``path`` is missing; a reader never renames, deletes or writes.

Example::

    with Staging("ckpt") as staging:     # under the dump lock: check "ckpt", delete leftovers,
        ...                               # create .ckpt.sok-tmp-xxxx (locked); write the files, the
        staging.swap_into_place()         # manifest last; swap (under the dump lock again)

    manifest = read_consistently("ckpt", lambda ckpt: ckpt.manifest)
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from sparse_operation_kit import checkpoint_format as fmt

logger = logging.getLogger(__name__)

__all__ = [
    "LOCK_WAIT_S",
    "READ_ATTEMPTS",
    "STAGING_MARK",
    "OpenCheckpoint",
    "Staging",
    "check_replaceable",
    "dump_lock",
    "is_complete",
    "is_staging",
    "leftovers",
    "open_checkpoint",
    "open_for_reading",
    "read_consistently",
    "remove_leftovers",
]

T = TypeVar("T")

#: A file in a staging directory until its checkpoint is complete (removed just before the swap).
STAGING_MARK = ".sok-staging"
#: The infix of staging directories' names: ``.<name>.sok-tmp-<random>`` (``.old`` appended to the
#: previous checkpoint while it is deleted after a swap by two renames).
STAGING_INFIX = ".sok-tmp-"
#: The suffix of a path's dump lock file: ``.<name>.sok-lock`` beside it, present while a dump holds it.
LOCK_SUFFIX = ".sok-lock"
#: Seconds a dump waits for its turn at the dump lock (held only while a dump of the same path
#: deletes leftovers, creates its staging directory, or swaps) before it raises CheckpointError.
LOCK_WAIT_S = 60.0
#: Seconds between two tries of a dump lock held by another dump.
_LOCK_POLL_S = 0.005
#: Times a reader opens a checkpoint that other dumps keep replacing before it gives up.
READ_ATTEMPTS = 5
#: How many unexpected entries an error message lists.
_LISTED = 5


def _staging_prefix(path: str) -> str:
    return f".{os.path.basename(path)}{STAGING_INFIX}"


def _lock_path(path: str) -> str:
    """The dump lock file of ``path`` (of its target when it is a symbolic link)."""
    path = os.path.realpath(path)
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}{LOCK_SUFFIX}")


@contextlib.contextmanager
def dump_lock(path: str, wait_s: float | None = None) -> Iterator[None]:
    """Hold ``path``'s dump lock: an exclusive ``flock`` of ``.<name>.sok-lock`` beside it (made
    when missing, deleted when released; the parent directory must exist), held by one dump at a
    time across processes and threads.

    Args:
        path: the checkpoint path.
        wait_s: seconds to wait for a dump that holds it (default :data:`LOCK_WAIT_S`).

    Raises:
        CheckpointError: another dump held it for ``wait_s`` seconds; names the path and that process.

    Example::

        with dump_lock("ckpt"):
            remove_leftovers("ckpt")
    """
    lock_path = _lock_path(path)
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    fd = _acquire(path, lock_path, time.monotonic() + wait_s, wait_s)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):  # deleted while held: a waiter that locked the
            os.unlink(lock_path)  # unlinked file sees it (_is_at) and tries again
        os.close(fd)


def _acquire(path: str, lock_path: str, deadline: float, wait_s: float) -> int:
    """Lock ``lock_path`` (the file that is at that path once locked); its fd, holding the lock."""
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            while not _try_lock(fd):
                if time.monotonic() > deadline:
                    raise fmt.CheckpointError(
                        f"sok.dump of {path}: another sok.dump of it ({_holder(lock_path)}) has held its lock "
                        f"{lock_path} for more than {wait_s:g} s; wait until that dump ends, or dump to another path"
                    )
                time.sleep(_LOCK_POLL_S)
            if _is_at(fd, lock_path):
                os.ftruncate(fd, 0)
                os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder deleted it when it released it: lock the one at lock_path now


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _is_at(fd: int, path: str) -> bool:
    """Whether the open file ``fd`` is the entry at ``path`` (not one deleted or replaced since)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    opened = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (opened.st_dev, opened.st_ino)


def _holder(lock_path: str) -> str:
    """Who holds a dump lock, as its file says (``pid N on host``)."""
    try:
        with open(lock_path) as f:
            text = f.read().strip()
    except OSError:
        text = ""
    return text or "a process that has not yet written its pid"


def is_staging(path: str) -> bool:
    """Whether ``path`` is (or was) a dump's staging directory: by its name or its marker file."""
    path = os.path.abspath(path)
    return STAGING_INFIX in os.path.basename(path) or os.path.exists(os.path.join(path, STAGING_MARK))


def is_complete(path: str) -> bool:
    """Whether a (staging or set-aside) directory holds a whole checkpoint: its manifest is written
    and its marker is gone."""
    return os.path.isfile(os.path.join(path, fmt.MANIFEST)) and not os.path.exists(os.path.join(path, STAGING_MARK))


def leftovers(path: str) -> list[str]:
    """Staging directories and set-aside checkpoints that dumps of ``path`` left beside it (beside
    its target when ``path`` is a symbolic link)."""
    path = os.path.realpath(path)
    parent, prefix = os.path.dirname(path), _staging_prefix(path)
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    return sorted(os.path.join(parent, n) for n in names if n.startswith(prefix))


class OpenCheckpoint:
    """A checkpoint directory opened once for reading (``O_DIRECTORY``), with its validated manifest.

    Every file is opened relative to :attr:`fd` (``dir_fd``), so the files read all belong to the
    directory opened, even when a dump swaps another checkpoint into ``path`` meanwhile. Valid until
    :meth:`close` (:func:`open_for_reading` closes it).

    Attributes:
        path: the checkpoint path, as given (in messages).
        fd: the directory's file descriptor.
        manifest: its manifest (None: NVIDIA SOK's layout).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError) as error:
            raise fmt.CheckpointError(f"no checkpoint directory at {path}{_leftovers_hint(path)}") from error
        try:
            _refuse_staging(path, fmt.exists(STAGING_MARK, self.fd))
            self.manifest = fmt.read_manifest(path, self.fd)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the directory (the :class:`~checkpoint_format.FileInfo` read through it become unusable)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def replaced(self) -> bool:
        """Whether ``path`` no longer names the directory opened (a dump swapped another one in)."""
        return not _is_at(self.fd, self.path)

    def listdir(self) -> list[str]:
        """The names in the directory opened."""
        return os.listdir(self.fd)

    def file(self, name: str) -> str:
        """The path of the file ``name`` (checked by :func:`~checkpoint_format.check_name`), for messages and
        :class:`~checkpoint_format.FileInfo`."""
        return os.path.join(self.path, fmt.check_name(name, "file", self.path))

    def exists(self, name: str) -> bool:
        """Whether the directory opened holds an entry ``name``."""
        return fmt.exists(self.file(name), self.fd)

    def read_header(self, name: str) -> fmt.FileInfo:
        """:func:`~checkpoint_format.read_header` of the file ``name`` of the directory opened."""
        return fmt.read_header(self.file(name), self.fd)

    def table_files(self, table: str) -> tuple[fmt.FileInfo, fmt.FileInfo, int]:
        """:func:`~checkpoint_format.table_files` of ``table`` in the directory opened."""
        return fmt.table_files(self.path, table, self.fd)

    def crc32(self, name: str) -> str:
        """The CRC-32 of the file ``name`` of the directory opened (8 hex digits)."""
        return fmt.crc32(self.file(name), dir_fd=self.fd)


@contextlib.contextmanager
def open_for_reading(path: str) -> Iterator[OpenCheckpoint]:
    """Open the checkpoint at ``path`` to read it (:class:`OpenCheckpoint`); closed on exit. A
    CheckpointError or OSError raised inside, once ``path`` names another directory, becomes
    :class:`~checkpoint_format.CheckpointChanged` (a dump replaced the checkpoint and deleted the
    files being read).

    Raises:
        CheckpointError: ``path`` is missing (naming what interrupted dumps left beside it, which
            are never put back by themselves), is a staging directory, or its manifest is corrupt.
        CheckpointChanged: as above.

    Example::

        with open_for_reading("ckpt") as ckpt:
            key_info, weight_info, rows = ckpt.table_files("emb_0")
    """
    ckpt = OpenCheckpoint(path)
    if ckpt.manifest is None:
        logger.warning(
            "%s has no %s (NVIDIA SOK's layout): its files' headers, sizes and row counts are checked, but "
            "no checksums are available to detect corrupt contents",
            path,
            fmt.MANIFEST,
        )
    try:
        yield ckpt
    except (fmt.CheckpointError, OSError) as error:
        if isinstance(error, fmt.CheckpointChanged) or not ckpt.replaced():
            raise
        raise fmt.CheckpointChanged(
            f"{path} changed while it was read: another sok.dump replaced it and deleted the files being read "
            f"({error}); read it again"
        ) from error
    finally:
        ckpt.close()


def read_consistently(path: str, read: Callable[[OpenCheckpoint], T], attempts: int = READ_ATTEMPTS) -> T:
    """``read(checkpoint)`` on the checkpoint at ``path`` (:func:`open_for_reading`), opened again
    and read again when another dump replaced it meanwhile, at most ``attempts`` times.

    ``read`` must leave nothing changed when it raises (it may be called again).

    Raises:
        CheckpointChanged: dumps replaced it during each of the ``attempts`` reads.
        CheckpointError: as :func:`open_for_reading`, or raised by ``read``.

    Example::

        manifest = read_consistently("ckpt", lambda ckpt: ckpt.manifest)
    """
    attempt = 1
    while True:
        try:
            with open_for_reading(path) as ckpt:
                return read(ckpt)
        except fmt.CheckpointChanged as error:
            if attempt >= attempts:
                raise fmt.CheckpointChanged(
                    f"{path} changed while it was read, {attempts} times in a row: other sok.dump calls keep "
                    f"replacing it; read it while no dump of it runs"
                ) from error
            attempt += 1
            logger.info("%s; reading it again (attempt %d of %d)", error, attempt, attempts)


def open_checkpoint(path: str) -> fmt.Manifest | None:
    """Check that ``path`` is a checkpoint to read (not a dump's staging directory) and return its
    validated manifest (None: NVIDIA SOK's layout, whose files carry no checksums; a warning says
    so). Reads only: nothing is renamed, deleted or written. The files read afterwards by path may
    belong to a checkpoint that a dump swapped in since: read through :func:`open_for_reading` to
    rule that out.

    Raises:
        CheckpointError: ``path`` is missing (naming what interrupted dumps left beside it, which
            are never put back by themselves), is a staging directory, or its manifest is corrupt.
    """
    with open_for_reading(path) as ckpt:
        return ckpt.manifest


def _refuse_staging(path: str, marked: bool) -> None:
    """Raise when ``path`` is a dump's staging directory (by its name, or ``marked``: it holds the marker)."""
    if STAGING_INFIX not in os.path.basename(os.path.abspath(path)) and not marked:
        return
    complete = not marked and os.path.isfile(os.path.join(path, fmt.MANIFEST))
    raise fmt.CheckpointError(
        f"{path} is the staging directory of a sok.dump that did not finish "
        f"({'its files are all written' if complete else 'it is incomplete'}); "
        f"{'rename it to a name of your own to load it' if complete else 'it cannot be loaded'}"
    )


def _leftovers_hint(path: str) -> str:
    """What interrupted dumps of a missing ``path`` left beside it, for its error message."""
    left = leftovers(path)
    if not left:
        return ""
    whole = [p for p in left if is_complete(p)]
    hint = f"; interrupted dumps of it left {', '.join(left)}"
    if whole:
        hint += f" ({', '.join(whole)} holds a complete checkpoint: rename it to {path} to load it)"
    return hint


def _is_sok_file(path: str) -> bool:
    """A file this project (or NVIDIA SOK) writes into a checkpoint: the manifest or a headed file."""
    if not os.path.isfile(path) or os.path.islink(path):
        return False
    if os.path.basename(path) == fmt.MANIFEST:
        try:
            fmt.read_manifest(os.path.dirname(path))
        except fmt.CheckpointError:
            return False
        return True
    if "-" not in os.path.basename(path):
        return False
    try:
        fmt.read_header(path)
    except fmt.CheckpointError:
        return False
    return True


def check_replaceable(path: str) -> None:
    """Raise unless ``path`` is missing, an empty directory, or a SOK checkpoint (only SOK files).

    Raises:
        CheckpointError: ``path`` is a file, or a directory holding anything else; names what.
    """
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path):
        raise fmt.CheckpointError(
            f"sok.dump will not replace {path}: it is a file, not a checkpoint directory; dump to a new or "
            f"checkpoint directory path"
        )
    if is_staging(path):
        raise fmt.CheckpointError(
            f"{path} is the staging directory of a sok.dump; dump to the checkpoint's own path instead"
        )
    foreign = sorted(n for n in os.listdir(path) if not _is_sok_file(os.path.join(path, n)))
    if foreign:
        shown = ", ".join(repr(n) for n in foreign[:_LISTED]) + (
            f" and {len(foreign) - _LISTED} more" if len(foreign) > _LISTED else ""
        )
        raise fmt.CheckpointError(
            f"sok.dump will not replace {path}: it holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} "
            f"that sok.dump did not write ({shown}); sok.dump replaces only a previous SOK checkpoint. Dump "
            f"to a directory of its own (e.g. {os.path.join(path, 'sok')}), or move those files away"
        )


def remove_leftovers(path: str) -> None:
    """Delete what crashed dumps of ``path`` left beside it, except staging directories that a running
    dump holds locked. Call it holding ``path``'s :func:`dump_lock`: a dump creates and locks its
    staging directory under it, so an unlocked one belongs to a dump that is gone."""
    for leftover in leftovers(path):
        try:
            fd = os.open(leftover, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue  # gone meanwhile, or not a directory we made
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            logger.info("kept %s: a sok.dump that is still running holds it", leftover)
            continue
        finally:
            os.close(fd)
        shutil.rmtree(leftover, ignore_errors=True)
        logger.warning("deleted %s, left by an interrupted sok.dump of %s", leftover, path)


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc), else set and reset."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class Staging:
    """The staging directory of one dump of ``path``: created beside it with the umask's permissions
    and the marker file, locked until closed; removed on close unless swapped into place.

    Made under ``path``'s dump lock (:func:`dump_lock`), after checking that ``path`` may be replaced
    (:func:`check_replaceable`) and deleting the leftovers of dumps that are gone
    (:func:`remove_leftovers`).

    Raises:
        CheckpointError: ``path`` may not be replaced, or another dump held the lock too long.
    """

    def __init__(self, path: str) -> None:
        self.path = os.path.realpath(path)  # a symbolic link's target is replaced, not the link
        self._lock = -1
        self._swapped = False
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with dump_lock(self.path):
            check_replaceable(path)
            remove_leftovers(self.path)
            self._create()

    def _create(self) -> None:
        self.directory = tempfile.mkdtemp(prefix=_staging_prefix(self.path), dir=os.path.dirname(self.path))
        self._lock = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        os.chmod(self.directory, 0o777 & ~_umask())
        with open(os.path.join(self.directory, STAGING_MARK), "w") as mark:
            mark.write(f"incomplete sok.dump of {self.path} (pid {os.getpid()})\n")

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Delete the directory unless it was swapped into place (while still locked, so no other
        dump's cleanup deletes it at the same time); release the lock."""
        if not self._swapped:
            shutil.rmtree(self.directory, ignore_errors=True)
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1

    def swap_into_place(self) -> None:
        """Make the (complete) staging directory the checkpoint at ``path``; delete the old one.

        Under the dump lock: checks again that ``path`` holds only a SOK checkpoint (it may have
        changed while the dump ran), removes the marker, syncs, and exchanges the two directories
        atomically."""
        with dump_lock(self.path):
            check_replaceable(self.path)
            os.remove(os.path.join(self.directory, STAGING_MARK))
            _fsync_directory(self.directory)
            self._swap()
            _fsync_directory(os.path.dirname(self.path))

    def _swap(self) -> None:
        if os.path.lexists(self.path) and _exchange(self.directory, self.path):
            self._swapped = True
            shutil.rmtree(self.directory, ignore_errors=True)  # now the previous checkpoint
        elif os.path.lexists(self.path):
            old = f"{self.directory}.old"
            os.rename(self.path, old)
            try:
                os.rename(self.directory, self.path)
            except BaseException:
                os.rename(old, self.path)  # undo this dump's own first rename
                raise
            self._swapped = True
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(self.directory, self.path)
            self._swapped = True


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, f"could not exchange {a} and {b}: {os.strerror(code)}")
