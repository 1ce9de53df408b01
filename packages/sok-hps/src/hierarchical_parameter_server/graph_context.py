"""What a lookup graph records of its tables when it is traced, and the servers open to it.

:meth:`.server.ServedTable.lookup` traces ``SokResolveTable`` and ``SokPyCall`` ops that name the
functions of :mod:`hierarchical_parameter_server.graph_calls` (:data:`CACHE_TABLE`, :data:`FETCH`,
...) and the table's context (:func:`context_of`); a :class:`~.server.ParameterServer` is open to
its graphs from its start (:func:`register`) to its close (:func:`unregister`). This module sits
below both :mod:`.server` and :mod:`.graph_calls`: it imports neither, and knows a server and a
table only by the attributes it reads (:class:`TracingServer`, :class:`TracedTable`).

The names are the ones saved graphs hold: they never change, or SavedModels exported before would
no longer serve.

Example::

    context = graph_context.context_of(server, "foo", 0, dim=16, key_dtype="int64")
    (rows,) = python_ops.py_call(graph_context.FETCH, context, [keys], [tf.float32])
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = [
    "CACHE_TABLE",
    "FETCH",
    "FILL",
    "LOOKUP",
    "SCHEDULE_FILL",
    "VOLATILE_TABLE",
    "TracedTable",
    "TracedTableChangedError",
    "TracingServer",
    "check_traced",
    "context_of",
    "open_server",
    "register",
    "unregister",
    "untraced_context",
]

#: The functions of :mod:`.graph_calls` that a lookup graph names (``module:qualname``).
CACHE_TABLE = "hierarchical_parameter_server.graph_calls:cache_table"
VOLATILE_TABLE = "hierarchical_parameter_server.graph_calls:volatile_table"
FETCH = "hierarchical_parameter_server.graph_calls:fetch"
FILL = "hierarchical_parameter_server.graph_calls:fill"
SCHEDULE_FILL = "hierarchical_parameter_server.graph_calls:schedule_fill"
#: The whole lookup of a graph traced while HPS was not running (:func:`untraced_context`).
LOOKUP = "hierarchical_parameter_server.graph_calls:lookup"


class TracingServer(Protocol):
    """What this module reads of a :class:`~.server.ParameterServer`."""

    @property
    def id(self) -> str:
        """Unique to the server in the process."""

    @property
    def origin(self) -> tuple[str, int] | None:
        """``(ps_config_file, global_batch_size)`` the server was initialised from, if any."""


class TracedTable(Protocol):
    """What this module reads of a :class:`~.server.ServedTable`."""

    @property
    def model(self) -> str: ...

    @property
    def table_id(self) -> int: ...

    @property
    def dim(self) -> int: ...

    @property
    def key_dtype(self) -> tf.DType: ...


class TracedTableChangedError(ValueError):
    """A lookup graph's table is served at another width or key dtype than the graph was traced for."""


_servers: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_servers_lock = threading.Lock()


def register(server: TracingServer) -> None:
    """Make ``server`` (open) the one the graphs it traces resolve to."""
    with _servers_lock:
        _servers[server.id] = server


def unregister(server: TracingServer) -> None:
    """``server`` is closed: its graphs resolve to the process's server from now on."""
    with _servers_lock:
        _servers.pop(server.id, None)


def open_server(server_id: str) -> Any:
    """The registered server of id ``server_id`` (the one given to :func:`register`), or None when
    it is closed or was never open in this process."""
    with _servers_lock:
        return _servers.get(server_id)


def context_of(server: TracingServer, model: str, table_id: int, dim: int, key_dtype: str) -> str:
    """The context string of table ``table_id`` of ``model`` served by ``server``, whose width is
    ``dim`` and keys of dtype ``key_dtype`` (``"int64"`` or ``"int32"``) as the graph is traced."""
    path, batch = server.origin if server.origin is not None else ("", 1)
    return _context(server.id, path, batch, model, table_id, dim, key_dtype)


def untraced_context(ps_config_file: str, global_batch_size: int, model: str, table_id: int, dim: int,
                     key_dtype: str) -> str:  # fmt: skip
    """The context of a table traced while no server runs (NVIDIA's flow saves the model before it
    writes the ps_config): the graph's functions find it in the process's server, which they start
    from ``ps_config_file`` if nothing has yet."""
    return _context("", ps_config_file, global_batch_size, model, table_id, dim, key_dtype)


def _context(server: str, path: str, batch: int, model: str, table_id: int, dim: int, key_dtype: str) -> str:
    fields = {"server": server, "ps_config_file": path, "global_batch_size": batch, "model": model}
    return json.dumps({**fields, "table_id": table_id, "dim": dim, "key_dtype": key_dtype})


def check_traced(fields: dict[str, Any], table: TracedTable, server: TracingServer) -> None:
    """Raises :class:`TracedTableChangedError` where ``table`` is not of the width and key dtype
    the context ``fields`` records (a context without them passes)."""
    traced = (fields.get("dim", table.dim), fields.get("key_dtype", table.key_dtype.name))
    if traced == (table.dim, table.key_dtype.name):
        return
    origin = f"the ps_config {server.origin[0]!r}" if server.origin is not None else "the parameter server"
    raise TracedTableChangedError(
        f"model {table.model!r} table {table.table_id} was traced for width {traced[0]} and keys of {traced[1]}, "
        f"and {origin} serves it at width {table.dim} with keys of {table.key_dtype.name}: the graph would read "
        "the wrong columns. Re-export the model (trace it again) against the table as it is now, or serve it "
        "with the ps_config and model files it was exported with"
    )
