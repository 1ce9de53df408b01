"""Type stub of sok-hps's binding of the C++ server's readers (csrc/serving/module.cpp,
py_ps_config.cpp, py_model_files.cpp, py_update_source.cpp): the ps_config reader, which
config.load_config calls; the online updates' files and directory source, which updates.py calls;
the JSON and model-file readers, for the tests that hold them against the Python ones."""

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_PARTITIONS",
    "MAX_POLL_INTERVAL_MS",
    "MAX_THREAD_POOL_SIZE",
    "MIRRORED_CONSTANTS",
    "NO_OVERFLOW_LIMIT",
    "OVERFLOW_POLICIES",
    "ConfigError",
    "JsonParseError",
    "ModelFileError",
    "TableChunks",
    "TableSource",
    "UPDATE_CHUNK_BYTES",
    "UPDATE_FORMAT_VERSION",
    "UPDATE_MAGIC",
    "UPDATE_MAX_TAG_BYTES",
    "UPDATE_REJECTED_FOLDER",
    "UPDATE_SUFFIX",
    "UpdateFileError",
    "UpdateIncomplete",
    "UpdateSource",
    "capacity_of",
    "check_update_name",
    "hkv_cache_options",
    "open_table",
    "parse_json",
    "parse_ps_config",
    "read_ps_config",
    "read_update",
    "stage_update",
    "write_update",
]

#: The C++ constants that mirror Python ones, under the Python names ("format.HEADER_BYTES", ...).
MIRRORED_CONSTANTS: dict[str, Any]

class JsonParseError(ValueError):
    """A text that is not JSON; the message is json.JSONDecodeError's."""

#: The ps_config reader's limits and values (csrc/serving/ps_config.hpp, csrc/tiers/limits.hpp),
#: which config.py exports under the same names.
MAX_CONFIG_BYTES: int
MAX_PARTITIONS: int
MAX_POLL_INTERVAL_MS: int
MAX_THREAD_POOL_SIZE: int
NO_OVERFLOW_LIMIT: int
OVERFLOW_POLICIES: dict[str, tuple[str, ...]]

class ConfigError(ValueError):
    """A ps_config the reader refuses; config.load_config raises it again as config.ConfigError."""

def read_ps_config(
    path: str | bytes, warn: Callable[[str], None] | None = None, max_bytes: int = ...
) -> dict[str, Any]:
    """The ps_config file at path (at most max_bytes of it read) as dataclasses.asdict(config.load_config(path))
    gives it; warn(message) for each warning. Runs without the GIL but for warn."""

def parse_ps_config(json_text: str, warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The ps_config json_text holds, as read_ps_config (integers beyond 64 bits kept, as json.loads
    keeps them); JsonParseError where the text is not JSON."""

class ModelFileError(ValueError):
    """A table's files cannot be served (model_files.ModelFileError, the same messages)."""

def parse_json(text: str) -> Any:
    """The value of the JSON text, as json.loads makes it (sok::hps::json::parse)."""

def capacity_of(rows: int, fraction: float) -> int:
    """The C++ server's evicting cache capacity (storage_options.hpp), cache.capacity_of's."""

def hkv_cache_options(capacity: int) -> list[tuple[str, str]]:
    """The options the C++ server creates an evicting cache of ``capacity`` rows with, cache.hkv_options's."""

class TableChunks(Iterator[tuple[np.ndarray, np.ndarray]]):
    """A table's rows in file order: (int64 [n], float32 [n, dim]) fresh arrays per chunk."""

    def __next__(self) -> tuple[np.ndarray, np.ndarray]: ...

class TableSource:
    """sok::hps::TableSource (csrc/serving/model_files.hpp), as model_files.TableSource."""

    @property
    def path(self) -> str: ...
    @property
    def rows(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def format(self) -> str:
        """``"hps"`` (a sparse-model directory) or ``"sok"`` (a checkpoint table)."""
    @property
    def keys(self) -> np.ndarray:
        """Every key, int64 [rows] in file order (read-only)."""
    def verify(self) -> None:
        """Check a checkpoint's weight file against the manifest's checksum (ModelFileError if not)."""
    def chunks(self, chunk_rows: int) -> TableChunks:
        """The rows in file order, chunk_rows at a time; ValueError when chunk_rows is below 1."""

def open_table(path: str | bytes | os.PathLike[str], dim: int) -> TableSource:
    """Open one table of sparse_files and check its files (model_files.open_table)."""

#: The update files' format (csrc/serving/update_files.hpp), which updates.py exports: the magic
#: (``HCTR``), the version written, the file names' suffix, the folder of rejected files, the
#: longest tag and the bytes of rows read at a time.
UPDATE_MAGIC: int
UPDATE_FORMAT_VERSION: int
UPDATE_SUFFIX: str
UPDATE_REJECTED_FOLDER: str
UPDATE_MAX_TAG_BYTES: int
UPDATE_CHUNK_BYTES: int

class UpdateFileError(ValueError):
    """An update file that cannot be applied: the message names the file and what is wrong."""

class UpdateIncomplete(UpdateFileError):
    """An update file shorter than its header says: truncated, or still being copied in."""

#: updates.Update's fields: (tag, keys int64 [n], values float32 [n, dim], path, sequence,
#: version, checksum, writer).
UpdateFields = tuple[str, np.ndarray, np.ndarray, str, int, int, int, int]
#: The arrays an update's rows are read into: read_into(count, dim) -> (keys, values).
ReadInto = Callable[[int, int], tuple[np.ndarray, np.ndarray]]

def check_update_name(what: str, name: object) -> None:
    """ValueError where name (of a "model" or "table") is not a str of NAME_PATTERN."""

def read_update(path: str | bytes | os.PathLike[str], read_into: ReadInto) -> UpdateFields:
    """The update file at path, its rows read into read_into's arrays without the GIL;
    UpdateIncomplete, UpdateFileError or OSError where it cannot be read."""

def stage_update(
    directory: str | bytes | os.PathLike[str], model: str, table: str, keys: np.ndarray, values: np.ndarray
) -> tuple[str, str]:
    """The update of keys (int64 [n]) and values (float32 [n, dim], both C-contiguous) written
    without the GIL under a temporary name in directory (made when missing): (temporary, path),
    to be renamed into place."""

def write_update(
    directory: str | bytes | os.PathLike[str], model: str, table: str, keys: np.ndarray, values: np.ndarray
) -> str:
    """The C++ writer's whole write (stage_update, then the rename), as a C++ process writes an
    update: its path."""

class UpdateSource:
    """sok::hps::DirectoryUpdateSource (csrc/serving/update_source.hpp), what
    updates.DirectoryUpdateSource runs on."""

    def __init__(
        self,
        directory: str | bytes | os.PathLike[str],
        poll_interval_s: float,
        model_filters: Iterable[str],
        incomplete_timeout_s: float,
        log: Callable[[int, str, BaseException | None], None] | None,
        clock: Callable[[], float] | None,
        read_into: ReadInto,
    ) -> None:
        """log(level, message, error) gets each line (None: stderr), clock() the time in seconds
        (None: a steady clock); re.error (or the exception re.compile raises) for a bad filter."""
    def poll(self) -> list[UpdateFields]:
        """The new updates, in order, each taken as applied."""
    @property
    def unapplied(self) -> dict[str, str]:
        """The files apply refused: name -> why."""
    def start(
        self,
        apply: Callable[[UpdateFields], Any],
        launch: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        """Apply each update in a loop that launch(loop) runs in a thread it makes (None: a C++
        thread of the source's own); RuntimeError where the source runs already."""
    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the loop, waiting at most timeout_s; False (and an error line) where it has not
        ended then."""
