"""The Python that HPS's lookup graphs call by name: what lets a SavedModel with HPS layers serve.

A lookup graph (:meth:`.server.ServedTable.lookup`) holds nothing of the process that traced it:
its tables are ``SokResolveTable`` ops and its fetches from the databases ``SokPyCall`` ops
(:mod:`sparse_operation_kit.python_ops`), each naming a function of this module and the table's
context, a JSON string (:func:`context_of`): the id of the server that traced the graph, the
ps_config file and ``global_batch_size`` that server was initialised from, the model, the table,
and the table's width and key dtype when the graph was traced. Importing this module registers
those functions (:func:`sparse_operation_kit.python_ops.register`), the only ones a graph may call.

A function finds its table in the server that traced the graph while that server is open, else in
this process's server (:func:`hierarchical_parameter_server.init.get_server`), which it initialises
from the context's ps_config file if nothing has yet (the implicit initialisation of a layer's
first call). So a SavedModel loaded in a fresh process initialises HPS on its first lookup, as the
original's did, and a graph traced before ``init.shutdown()`` serves the server started after it.
Where that table's width or key dtype is no longer the one the graph was traced for (the ps_config
and model files changed), the graph fails (:class:`TracedTableChangedError`) rather than read the
wrong columns; contexts of graphs saved before they recorded the width are served unchecked.

Example::

    model.export("/models/dlrm/1")                  # a Keras model with HPS layers
    # in another process:
    import hierarchical_parameter_server            # loads the ops the SavedModel names
    served = tf.saved_model.load("/models/dlrm/1")
    logits = served.serve(batch)                    # HPS starts from the baked ps_config file
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
from sparse_operation_kit import python_ops

if TYPE_CHECKING:
    from sparse_operation_kit.table_ref import TableRef

    from hierarchical_parameter_server.server import ParameterServer, ServedTable

__all__ = [
    "CACHE_TABLE",
    "FETCH",
    "FILL",
    "SCHEDULE_FILL",
    "VOLATILE_TABLE",
    "TracedTableChangedError",
    "check_traced",
    "context_of",
    "load_ops",
    "nvidia_init",
    "nvidia_lookup",
    "register",
    "unregister",
]

logger = logging.getLogger(__name__)

_PREFIX = __name__ + ":"
#: The functions a lookup graph names (``module:qualname``).
CACHE_TABLE = _PREFIX + "cache_table"
VOLATILE_TABLE = _PREFIX + "volatile_table"
FETCH = _PREFIX + "fetch"
FILL = _PREFIX + "fill"
SCHEDULE_FILL = _PREFIX + "schedule_fill"


class TracedTableChangedError(ValueError):
    """A lookup graph's table is served at another width or key dtype than the graph was traced for."""


_servers: weakref.WeakValueDictionary[str, ParameterServer] = weakref.WeakValueDictionary()
_servers_lock = threading.Lock()


def load_ops() -> None:
    """Load the ops that lookup graphs name (``SokResolveTable``, ``SokPyCall``) and those of
    SavedModels exported with NVIDIA's plugin (``Init``, ``Lookup``). Where another library holds
    ops of those two generic names, the latter are left out with a warning."""
    from sparse_operation_kit import tf_ops

    tf_ops.python_library()
    try:
        tf_ops.hps_compat_library()
    except tf_ops.OpLibraryError as error:
        logger.warning("SavedModels exported with NVIDIA's HPS plugin (ops Init, Lookup) will not load: %s", error)


def register(server: ParameterServer) -> None:
    """Make ``server`` (open) the one the graphs it traces resolve to."""
    with _servers_lock:
        _servers[server.id] = server


def unregister(server: ParameterServer) -> None:
    """``server`` is closed: its graphs resolve to the process's server from now on."""
    with _servers_lock:
        _servers.pop(server.id, None)


def context_of(server: ParameterServer, model: str, table_id: int, dim: int, key_dtype: str) -> str:
    """The context string of table ``table_id`` of ``model`` served by ``server``, whose width is
    ``dim`` and keys of dtype ``key_dtype`` (``"int64"`` or ``"int32"``) as the graph is traced."""
    path, batch = server.origin if server.origin is not None else ("", 1)
    fields = {"server": server.id, "ps_config_file": path, "global_batch_size": batch, "model": model}
    return json.dumps({**fields, "table_id": table_id, "dim": dim, "key_dtype": key_dtype})


def served_table(context: str) -> ServedTable:
    """The table a context names (see the module's docstring for where it is found).

    Raises:
        RuntimeError: no server is open and the context names no ps_config file (the server that
            traced the graph was not started by ``hps.Init``): call ``hps.Init`` first.
        ValueError: the server has no such model or table.
        TracedTableChangedError: the table's width or key dtype is not the one the context records
            (contexts that record none are not checked).
    """
    from hierarchical_parameter_server import init

    fields = json.loads(context)
    with _servers_lock:
        server = _servers.get(fields["server"])
    if server is None:
        server = init.get_server(fields["ps_config_file"], fields["global_batch_size"])
    table = server.table(fields["model"], fields["table_id"])
    check_traced(fields, table, server)
    return table


def check_traced(fields: dict[str, Any], table: ServedTable, server: ParameterServer) -> None:
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


@python_ops.register
def cache_table(context: str) -> TableRef:
    """The reference of the table's cache."""
    return served_table(context).table_ref("cache")


@python_ops.register
def volatile_table(context: str) -> TableRef:
    """The reference of the table's rows in a hash map volatile DB that the graph reads."""
    return served_table(context).table_ref("volatile")


@python_ops.register
def fetch(context: str, keys: np.ndarray) -> np.ndarray:
    """:meth:`.server.ServedTable.fetch` of the table."""
    return served_table(context).fetch(keys)


@python_ops.register
def fill(context: str, keys: np.ndarray) -> np.ndarray:
    """:meth:`.server.ServedTable.fill` of the table."""
    return served_table(context).fill(keys)


@python_ops.register
def schedule_fill(context: str, keys: np.ndarray) -> np.ndarray:
    """:meth:`.server.ServedTable.fill` of the table in the server's background pool; ``True``."""
    served_table(context).schedule_fill(keys)
    return np.array(True)


# -- the ops of SavedModels exported with NVIDIA's HPS plugin (hps_compat_ops.cc) -------------------
@python_ops.register
def nvidia_init(context: str) -> None:
    """``Init``: HPS initialised from the op's ``ps_config_file`` and ``global_batch_size``, unless it
    is already (then nothing changes, as the plugin's Init)."""
    from hierarchical_parameter_server import init

    fields = json.loads(context)
    init.get_server(fields["ps_config_file"], fields["global_batch_size"])


@python_ops.register
def nvidia_lookup(context: str, keys: np.ndarray) -> np.ndarray:
    """``Lookup``: the rows of ``keys`` (any shape) in the context's table: ``keys.shape + [dim]``.

    Raises:
        RuntimeError: HPS is not initialised.
        ValueError: no such model or table, a width other than the table's, or keys of the dtype
            ``supportlonglong`` does not say.
    """
    import tensorflow as tf

    from hierarchical_parameter_server import init

    fields = json.loads(context)
    served = init.get_server().table(fields["model_name"], fields["table_id"])
    served.check_call(fields["emb_vec_size"], tf.as_dtype(keys.dtype), "Lookup (NVIDIA HPS)")
    rows = served.lookup(tf.constant(keys.reshape(-1)))
    return rows.numpy().reshape(keys.shape + (served.dim,))
