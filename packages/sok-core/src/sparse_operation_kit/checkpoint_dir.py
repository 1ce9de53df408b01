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
* A reader (``sok.load``, ``sok ckpt inspect``) opens a checkpoint with :func:`open_checkpoint`,
  which refuses staging directories and names the leftovers when ``path`` is missing; it only reads.

Example::

    check_replaceable("ckpt")            # raises when "ckpt" holds files that are not SOK's
    with Staging("ckpt") as staging:     # .ckpt.sok-tmp-xxxx, locked
        ...                               # write the files, the manifest last
        staging.swap_into_place()
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import logging
import os
import shutil
import tempfile

from sparse_operation_kit import checkpoint_format as fmt

logger = logging.getLogger(__name__)

__all__ = [
    "STAGING_MARK",
    "Staging",
    "check_replaceable",
    "is_complete",
    "is_staging",
    "leftovers",
    "open_checkpoint",
    "remove_leftovers",
]

#: A file in a staging directory until its checkpoint is complete (removed just before the swap).
STAGING_MARK = ".sok-staging"
#: The infix of staging directories' names: ``.<name>.sok-tmp-<random>`` (``.old`` appended to the
#: previous checkpoint while it is deleted after a swap by two renames).
STAGING_INFIX = ".sok-tmp-"
#: How many unexpected entries an error message lists.
_LISTED = 5


def _staging_prefix(path: str) -> str:
    return f".{os.path.basename(path)}{STAGING_INFIX}"


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


def open_checkpoint(path: str) -> fmt.Manifest | None:
    """Check that ``path`` is a checkpoint to read (not a dump's staging directory) and return its
    validated manifest (None: NVIDIA SOK's layout, whose files carry no checksums; a warning says
    so). Reads only: nothing is renamed, deleted or written.

    Raises:
        CheckpointError: ``path`` is missing (naming what interrupted dumps left beside it, which
            are never put back by themselves), is a staging directory, or its manifest is corrupt.
    """
    if is_staging(path):
        complete = is_complete(path)
        raise fmt.CheckpointError(
            f"{path} is the staging directory of a sok.dump that did not finish "
            f"({'its files are all written' if complete else 'it is incomplete'}); "
            f"{'rename it to a name of your own to load it' if complete else 'it cannot be loaded'}"
        )
    if not os.path.isdir(path):
        left = leftovers(path)
        hint = ""
        if left:
            whole = [p for p in left if is_complete(p)]
            hint = f"; interrupted dumps of it left {', '.join(left)}"
            if whole:
                hint += f" ({', '.join(whole)} holds a complete checkpoint: rename it to {path} to load it)"
        raise fmt.CheckpointError(f"no checkpoint directory at {path}{hint}")
    manifest = fmt.read_manifest(path)
    if manifest is None:
        logger.warning(
            "%s has no %s (NVIDIA SOK's layout): its files' headers, sizes and row counts are checked, but "
            "no checksums are available to detect corrupt contents",
            path,
            fmt.MANIFEST,
        )
    return manifest


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
    dump holds locked."""
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
    and the marker file, locked until closed; removed on close unless swapped into place."""

    def __init__(self, path: str) -> None:
        self.path = os.path.realpath(path)  # a symbolic link's target is replaced, not the link
        parent = os.path.dirname(self.path)
        os.makedirs(parent, exist_ok=True)
        self.directory = tempfile.mkdtemp(prefix=_staging_prefix(self.path), dir=parent)
        os.chmod(self.directory, 0o777 & ~_umask())
        self._lock = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        with open(os.path.join(self.directory, STAGING_MARK), "w") as mark:
            mark.write(f"incomplete sok.dump of {self.path} (pid {os.getpid()})\n")
        self._swapped = False

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the lock; delete the directory unless it was swapped into place."""
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1
        if not self._swapped:
            shutil.rmtree(self.directory, ignore_errors=True)

    def swap_into_place(self) -> None:
        """Make the (complete) staging directory the checkpoint at ``path``; delete the old one.

        Checks again that ``path`` holds only a SOK checkpoint (it may have changed while the dump
        ran), removes the marker, syncs, and exchanges the two directories atomically."""
        check_replaceable(self.path)
        os.remove(os.path.join(self.directory, STAGING_MARK))
        _fsync_directory(self.directory)
        parent = os.path.dirname(self.path)
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
        _fsync_directory(parent)


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
