"""Where a checkpoint lives: which directories ``sok.dump`` may replace, its staging directory, and the
swap that puts a finished checkpoint in place. One source of truth for these names and rules.

Rules:

* ``sok.dump(path)`` replaces only a previous SOK checkpoint: a directory that is empty or holds
  nothing but ``manifest.json`` and files with SOK's 296-byte header (ours or NVIDIA SOK's). Any
  other content (a file of the user's, a sub-directory), or ``path`` being a regular file, is refused
  with :class:`~sparse_operation_kit.checkpoint.format.CheckpointError` naming what is there; dump
  never deletes or hides a file it did not write.
* A dump writes into a staging directory beside ``path`` (beside its target when it is a symbolic
  link; missing parent directories are made) (``.<name>.sok-tmp-<random>``, holding the
  marker file :data:`STAGING_MARK` until it is complete), created with the permissions the umask
  gives (not mkdtemp's 0700), and locked (``flock``) while its dump runs.
* The finished staging directory takes ``path``'s place with one atomic exchange
  (``renameat2(RENAME_EXCHANGE)``), so ``path`` always holds the old or the new checkpoint; the old one
  is then deleted, once the dump lock is released. Where the file system cannot exchange, two
  renames are used (a crash between them leaves ``path`` missing and both checkpoints beside it:
  :func:`leftovers` names them; a reader that comes between them reads again, see below).
* Leftovers of crashed dumps (staging directories and old checkpoints set aside) are deleted by the
  next dump of the same path; one that is locked belongs to a dump still running and is kept. The
  next dump locks the others under the dump lock (:func:`claim_leftovers`) and deletes them after
  releasing it (:func:`delete_claimed`), so a slow deletion never keeps another dump waiting.
  Nothing ever renames a leftover back into place: a reader never resurrects a checkpoint.
* Several dumps of one path may run at once (processes or threads): each writes its own staging
  directory, and they take turns, through the path's dump lock (:func:`dump_lock`: ``flock`` of
  the regular file ``.<name>.sok-lock`` beside ``path``, made by the first dump and kept), to check
  ``path``, claim leftovers and create their staging directory, and to swap. So a dump deletes only staging
  directories whose dump is gone, and the last dump to swap wins. A dump waits at most
  :data:`LOCK_WAIT_S` seconds for its turn, then raises CheckpointError naming the process that
  holds the lock.
* A reader (``sok.load``, ``sok ckpt inspect``, ``sok ckpt convert``) opens the checkpoint directory
  once (:func:`open_for_reading`) and every file relative to it, so a dump that replaces ``path``
  meanwhile cannot mix the files of two checkpoints. When that dump deletes the directory being
  read, the reader raises :class:`~sparse_operation_kit.checkpoint.format.CheckpointChanged`
  ("changed while it was read"), never "corrupt"; :func:`read_consistently` then reads again, at
  most :data:`READ_ATTEMPTS` times. So does a reader that finds ``path`` missing with dumps' leftovers
  beside it (a swap by two renames may be under way); after the last attempt, the leftovers are
  named (with the advice to rename a complete one into place) only when no dump of ``path`` is
  running (its dump lock and the staging directories' locks are free). Staging directories are
  refused, and so are symbolic links and other non-regular files inside a checkpoint; a reader
  never renames, deletes or writes.

Example::

    with Staging("ckpt") as staging:     # under the dump lock: check "ckpt", claim leftovers, create
        ...                               # .ckpt.sok-tmp-xxxx (locked); then delete the leftovers; write
        staging.swap_into_place()         # the files, the manifest last; swap (under the dump lock again)

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
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from sparse_operation_kit.checkpoint import format as fmt

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
    "claim_leftovers",
    "delete_claimed",
    "open_for_reading",
    "read_consistently",
    "same_checkpoint",
]

T = TypeVar("T")

#: A file in a staging directory until its checkpoint is complete (removed just before the swap).
STAGING_MARK = ".sok-staging"
#: The infix of staging directories' names: ``.<name>.sok-tmp-<random>`` (``.old`` appended to the
#: previous checkpoint while it is deleted after a swap by two renames).
STAGING_INFIX = ".sok-tmp-"
#: The suffix of a path's dump lock file: ``.<name>.sok-lock`` beside it (made by the first dump, never deleted).
LOCK_SUFFIX = ".sok-lock"
#: Seconds a dump waits for its turn at the dump lock (held only while a dump of the same path
#: deletes leftovers, creates its staging directory, or swaps) before it raises CheckpointError.
LOCK_WAIT_S = 60.0
#: Seconds between the first two tries of a dump lock held by another dump (doubling each time up
#: to :data:`_LOCK_POLL_MAX_S`); also between a reader's attempts when ``path`` is missing.
_LOCK_POLL_S = 0.005
_LOCK_POLL_MAX_S = 0.2
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
    when missing and kept after release, as deleting it would race with a waiter on NFS; the parent
    directory must exist), held by one dump at a time across processes and threads. A waiter tries
    again after 5 ms, doubling the wait up to 200 ms.

    Args:
        path: the checkpoint path.
        wait_s: seconds to wait for a dump that holds it (default :data:`LOCK_WAIT_S`).

    Raises:
        CheckpointError: another dump held it for ``wait_s`` seconds (names the path and that
            process); ``.<name>.sok-lock`` is a symbolic link, a directory or another non-regular
            file (names it; it is neither followed nor changed).

    Example::

        with dump_lock("ckpt"):
            claimed = claim_leftovers("ckpt")
        delete_claimed(claimed, "ckpt")
    """
    lock_path = _lock_path(path)
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    fd = _acquire(path, lock_path, time.monotonic() + wait_s, wait_s)
    try:
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays


def _open_lock_file(path: str, lock_path: str, flags: int) -> int:
    """Open the lock file ``lock_path`` of ``path`` with ``flags``, never through a symbolic link; it
    must be a regular file.

    Raises:
        FileNotFoundError: it is missing (without ``O_CREAT``).
        CheckpointError: it is a symbolic link, a directory or another non-regular file; names it.
    """
    refusal = (
        f"{lock_path}, the dump lock file of {path}, is not a regular file (a symbolic link, a directory or "
        f"a special file); sok.dump neither follows nor changes it. Remove it (a dump makes a new one)"
    )
    try:
        fd = os.open(lock_path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except (IsADirectoryError, NotADirectoryError) as error:
        raise fmt.CheckpointError(refusal) from error
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise fmt.CheckpointError(refusal) from error
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise fmt.CheckpointError(refusal)
    return fd


def _acquire(path: str, lock_path: str, deadline: float, wait_s: float) -> int:
    """Lock ``lock_path`` (the file that is at that path once locked: someone may have deleted it by
    hand meanwhile); its fd, holding the lock."""
    while True:
        fd = _open_lock_file(path, lock_path, os.O_RDWR | os.O_CREAT)
        try:
            delay = _LOCK_POLL_S
            while not _try_lock(fd):
                if time.monotonic() > deadline:
                    raise fmt.CheckpointError(
                        f"sok.dump of {path}: another sok.dump of it ({_holder(lock_path)}) has held its lock "
                        f"{lock_path} for more than {wait_s:g} s; wait until that dump ends, or dump to another path"
                    )
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(2 * delay, _LOCK_POLL_MAX_S)
            if _is_at(fd, lock_path):
                os.ftruncate(fd, 0)
                os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # deleted (by hand) while we waited: lock the one at lock_path now


def _try_lock(fd: int, operation: int = fcntl.LOCK_EX) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
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
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, errors="replace") as f:
            text = f.read(200).strip()
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


class _MissingDuringDump(fmt.CheckpointChanged):
    """``path`` is missing and dumps' leftovers lie beside it: a dump may be between the two renames
    of its swap, so :func:`read_consistently` reads again (and then decides, :func:`_missing_error`)."""


class OpenCheckpoint:
    """A checkpoint directory opened once for reading (``O_DIRECTORY``), with its validated manifest
    (a CheckpointError or OSError while it is read becomes CheckpointChanged once ``path`` names
    another directory: a dump replaced it and deleted the manifest).

    Every file is opened relative to :attr:`fd` (``dir_fd``), so the files read all belong to the
    directory opened, even when a dump swaps another checkpoint into ``path`` meanwhile. Valid until
    :meth:`close` (:func:`open_for_reading` closes it).

    Attributes:
        path: the checkpoint path, as given (in messages).
        fd: the directory's file descriptor.
        manifest: its manifest (None: NVIDIA SOK's layout).
        identity: which directory was opened, for ranks to check that they all read the same one
            (:func:`same_checkpoint`): ``"<host> <st_dev> <st_ino> <manifest CRC-32 or none>"``.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError) as error:
            if os.path.lexists(path) or not leftovers(path):
                raise fmt.CheckpointError(f"no checkpoint directory at {path}") from error
            raise _MissingDuringDump(
                f"no checkpoint directory at {path}, and sok.dump staging directories lie beside it: a dump may be "
                f"swapping a new checkpoint in; read it again"
            ) from error
        try:
            _refuse_staging(path, fmt.exists(STAGING_MARK, self.fd))
            raw = fmt.read_manifest_bytes(path, self.fd)  # read once: parsed here, checksummed for identity
            self.manifest = None if raw is None else fmt.Manifest.from_json(raw, os.path.join(path, fmt.MANIFEST))
            opened = os.fstat(self.fd)
            crc = "none" if raw is None else f"{fmt.update_crc32(raw):08x}"
            self.identity = f"{socket.gethostname()} {opened.st_dev} {opened.st_ino} {crc}"
        except (fmt.CheckpointError, OSError) as error:
            replaced = self.replaced()
            self.close()
            if not replaced:
                raise
            raise _changed(path, error) from error
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the directory (the :class:`~sparse_operation_kit.checkpoint.format.FileInfo` read
        through it become unusable)."""
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
        """The path of the file ``name`` (checked by
        :func:`~sparse_operation_kit.checkpoint.format.check_name`), for messages and
        :class:`~sparse_operation_kit.checkpoint.format.FileInfo`."""
        return os.path.join(self.path, fmt.check_name(name, "file", self.path))

    def exists(self, name: str) -> bool:
        """Whether the directory opened holds an entry ``name``."""
        return fmt.exists(self.file(name), self.fd)

    def read_header(self, name: str) -> fmt.FileInfo:
        """:func:`~sparse_operation_kit.checkpoint.format.read_header` of the file ``name`` of the directory opened."""
        return fmt.read_header(self.file(name), self.fd)

    def table_files(self, table: str) -> tuple[fmt.FileInfo, fmt.FileInfo, int]:
        """:func:`~sparse_operation_kit.checkpoint.format.table_files` of ``table`` in the directory opened."""
        return fmt.table_files(self.path, table, self.fd)

    def crc32(self, name: str) -> str:
        """The CRC-32 of the file ``name`` of the directory opened (8 hex digits)."""
        return fmt.crc32(self.file(name), dir_fd=self.fd)


def same_checkpoint(identities: list[str]) -> bool:
    """Whether the :attr:`OpenCheckpoint.identity` of every rank names one directory: the same inode
    and manifest everywhere, and the same device among the ranks of one host (a network file
    system's device numbers differ from host to host)."""
    fields = [identity.split(" ") for identity in identities]
    if len({(inode, crc) for _, _, inode, crc in fields}) > 1:
        return False
    devices: dict[str, set[str]] = {}
    for host, device, _, _ in fields:
        devices.setdefault(host, set()).add(device)
    return all(len(found) == 1 for found in devices.values())


@contextlib.contextmanager
def open_for_reading(path: str) -> Iterator[OpenCheckpoint]:
    """Open the checkpoint at ``path`` to read it (:class:`OpenCheckpoint`); closed on exit. A
    CheckpointError or OSError raised inside, once ``path`` names another directory, becomes
    :class:`~sparse_operation_kit.checkpoint.format.CheckpointChanged` (a dump replaced the checkpoint and deleted the
    files being read).

    Raises:
        CheckpointError: ``path`` is missing (and no dump left anything beside it), is a staging
            directory, or its manifest is corrupt.
        CheckpointChanged: as above; or ``path`` is missing with dumps' leftovers beside it (a dump
            may be between the two renames of its swap: :func:`read_consistently` reads again).

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
        raise _changed(path, error) from error
    finally:
        ckpt.close()


def _changed(path: str, error: BaseException) -> fmt.CheckpointChanged:
    """CheckpointChanged for ``error``, raised reading ``path`` once a dump replaced it."""
    return fmt.CheckpointChanged(
        f"{path} changed while it was read: another sok.dump replaced it and deleted the files being read "
        f"({error}); read it again"
    )


def read_consistently(path: str, read: Callable[[OpenCheckpoint], T], attempts: int = READ_ATTEMPTS) -> T:
    """``read(checkpoint)`` on the checkpoint at ``path`` (:func:`open_for_reading`), opened again
    and read again when another dump replaced it meanwhile, at most ``attempts`` times.

    ``read`` must leave nothing changed when it raises (it may be called again). When ``path`` is
    missing with dumps' leftovers beside it, it waits a little (5 ms, doubling) before the next
    attempt; if it is still missing after the last one, see below.

    Raises:
        CheckpointChanged: dumps replaced it during each of the ``attempts`` reads; or ``path`` is
            missing while a dump of it is running (its dump lock or a staging directory is locked).
        CheckpointError: as :func:`open_for_reading`, or raised by ``read``; ``path`` is missing and
            no dump of it runs: names what interrupted dumps left beside it (never put back by
            themselves), and which one holds a complete checkpoint to rename into place.

    Example::

        manifest = read_consistently("ckpt", lambda ckpt: ckpt.manifest)
    """
    attempt, delay = 1, _LOCK_POLL_S
    while True:
        try:
            with open_for_reading(path) as ckpt:
                return read(ckpt)
        except _MissingDuringDump as error:
            if attempt >= attempts:
                raise _missing_error(path) from error
            attempt += 1
            logger.info("%s (attempt %d of %d)", error, attempt, attempts)
            time.sleep(delay)
            delay = min(2 * delay, _LOCK_POLL_MAX_S)
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
        CheckpointError: as :func:`read_consistently`.
        CheckpointChanged: as :func:`read_consistently`.
    """
    return read_consistently(path, lambda ckpt: ckpt.manifest)


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


def _missing_error(path: str) -> fmt.CheckpointError:
    """The error for ``path`` found missing, with leftovers beside it, at a reader's last attempt:
    CheckpointChanged while a dump of it runs (its dump lock or a staging directory is locked),
    else CheckpointError naming the leftovers of interrupted dumps (checked for a running dump
    before ``path`` again, so a swap that ends meanwhile is not taken for a crash)."""
    running = [p for p in leftovers(path) if _locked(p)]
    if _locked(_lock_path(path)):
        running.append(_lock_path(path))
    if running:
        return fmt.CheckpointChanged(
            f"no checkpoint directory at {path} yet: a sok.dump of it is running ({', '.join(running)} locked); "
            f"read it once that dump has ended"
        )
    if os.path.lexists(path):
        return fmt.CheckpointChanged(f"{path} was missing and reappeared (a sok.dump swapped it in); read it again")
    left = leftovers(path)
    whole = [p for p in left if is_complete(p)]
    hint = f"; interrupted dumps of it left {', '.join(left)}" if left else ""
    if whole:
        hint += f" ({', '.join(whole)} holds a complete checkpoint: rename it to {path} to load it)"
    return fmt.CheckpointError(f"no checkpoint directory at {path}{hint}")


def _locked(path: str) -> bool:
    """Whether a process holds a ``flock`` of ``path`` (a dump lock file, or a staging directory):
    tried with a shared lock, released at once; False when it is missing or cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return not _try_lock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


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


def claim_leftovers(path: str) -> list[tuple[str, int]]:
    """Lock what crashed dumps of ``path`` left beside it, for :func:`delete_claimed`: every leftover
    but the staging directories that a running dump holds locked. Call it holding ``path``'s
    :func:`dump_lock`: a dump creates and locks its staging directory under it, so an unlocked one
    belongs to a dump that is gone. Returns ``(leftover, fd holding its lock)`` pairs."""
    claimed = []
    for leftover in leftovers(path):
        try:
            fd = os.open(leftover, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # gone meanwhile, or not a directory we made
        if _try_lock(fd):
            claimed.append((leftover, fd))
        else:
            os.close(fd)
            logger.info("kept %s: a sok.dump that is still running holds it", leftover)
    return claimed


def delete_claimed(claimed: list[tuple[str, int]], path: str) -> None:
    """Delete the leftovers of dumps of ``path`` that :func:`claim_leftovers` locked (after releasing
    the dump lock: another dump finds them locked meanwhile and keeps them), then release them."""
    for leftover, fd in claimed:
        try:
            shutil.rmtree(leftover, ignore_errors=True)
            logger.warning("deleted %s, left by an interrupted sok.dump of %s", leftover, path)
        finally:
            os.close(fd)


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
    (:func:`check_replaceable`) and claiming the leftovers of dumps that are gone
    (:func:`claim_leftovers`), which are deleted once the lock is released.

    Raises:
        CheckpointError: ``path`` may not be replaced, or another dump held the lock too long.
    """

    def __init__(self, path: str) -> None:
        self.path = os.path.realpath(path)  # a symbolic link's target is replaced, not the link
        self._lock = -1
        self._swapped = False
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        claimed: list[tuple[str, int]] = []
        try:
            with dump_lock(self.path):
                check_replaceable(path)
                claimed = claim_leftovers(self.path)
                self._create()
        finally:
            delete_claimed(claimed, self.path)

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
        atomically. The old checkpoint is deleted after the lock is released."""
        with dump_lock(self.path):
            check_replaceable(self.path)
            os.remove(os.path.join(self.directory, STAGING_MARK))
            _fsync_directory(self.directory)
            previous = self._swap()
            _fsync_directory(os.path.dirname(self.path))
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)

    def _swap(self) -> str | None:
        """Put the staging directory at ``path``; the previous checkpoint's new path (None: none)."""
        if os.path.lexists(self.path) and _exchange(self.directory, self.path):
            self._swapped = True
            return self.directory  # now the previous checkpoint
        if os.path.lexists(self.path):
            old = f"{self.directory}.old"
            os.rename(self.path, old)
            try:
                os.rename(self.directory, self.path)
            except BaseException:
                os.rename(old, self.path)  # undo this dump's own first rename
                raise
            self._swapped = True
            return old
        os.rename(self.directory, self.path)
        self._swapped = True
        return None


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
