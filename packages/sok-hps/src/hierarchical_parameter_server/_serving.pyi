"""Type stub of sok-hps's binding of the C++ server's readers (csrc/serving/module.cpp,
py_ps_config.cpp, py_model_files.cpp): the ps_config reader, which config.load_config calls, and
the JSON and model-file readers, for the tests that hold them against the Python ones."""

import os
from collections.abc import Callable, Iterator
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
    "open_table",
    "parse_json",
    "parse_ps_config",
    "read_ps_config",
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
