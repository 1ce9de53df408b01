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

The layering: what the tracing needs (the names above, the contexts, the registry of open servers)
is in :mod:`.graph_context`, below :mod:`.server`, and re-exported here; this module is above
:mod:`.server` and below :mod:`.init`, which imports it (so that ``hps.Init`` and the layers
register these functions before they trace a graph) and gives it the process's server
(:func:`serve_process_server`).

Example::

    model.export("/models/dlrm/1")                  # a Keras model with HPS layers
    # in another process:
    import hierarchical_parameter_server            # loads the ops the SavedModel names
    served = tf.saved_model.load("/models/dlrm/1")
    logits = served.serve(batch)                    # HPS starts from the baked ps_config file
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from sparse_operation_kit import python_ops

from hierarchical_parameter_server.graph_context import (
    CACHE_TABLE,
    FETCH,
    FILL,
    LOOKUP,
    SCHEDULE_FILL,
    VOLATILE_TABLE,
    TracedTableChangedError,
    check_traced,
    context_of,
    open_server,
    register,
    unregister,
)

if TYPE_CHECKING:
    from sparse_operation_kit.table_ref import TableRef

    from hierarchical_parameter_server.server import ParameterServer, ServedTable

__all__ = [
    "CACHE_TABLE",
    "COMPAT_LIBRARY",
    "DET_STORAGE_LIBRARY",
    "FETCH",
    "FILL",
    "LOOKUP",
    "SCHEDULE_FILL",
    "SERVING_LIBRARY",
    "VOLATILE_TABLE",
    "TracedTableChangedError",
    "check_traced",
    "compat_library",
    "context_of",
    "load_ops",
    "lookup",
    "nvidia_init",
    "nvidia_lookup",
    "register",
    "serve_process_server",
    "serving_libraries",
    "unregister",
]

logger = logging.getLogger(__name__)

#: ``init.get_server``, given by :mod:`.init` when it is imported (:func:`serve_process_server`).
_process_server: Callable[..., ParameterServer] | None = None

#: sok-hps's op library (csrc/hps_compat_ops.cc, built by its CMakeLists.txt): the ops of SavedModels
#: exported with NVIDIA's HPS plugin.
COMPAT_LIBRARY = "libsok_tf_hps_compat.so"
#: sok-hps's library of HPS's lookups where no Python runs (csrc/serving/native_calls.cc).
SERVING_LIBRARY = "libsok_hps_serving.so"
#: sok-backend-det's storage as a plain shared library (its csrc/sok_det_storage.h), in the package
#: directory of sok_backend_det: where the C++ server of :data:`SERVING_LIBRARY` keeps its rows.
DET_STORAGE_LIBRARY = "libsok_det_storage.so"
#: sok-backend-hkv's (its csrc/sok_hkv_storage.h), in the package directory of sok_backend_hkv:
#: where that server keeps its evicting caches (as :mod:`.cache` does).
HKV_STORAGE_LIBRARY = "libsok_hkv_storage.so"
_LIB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
_REBUILD = "pip install --no-build-isolation --force-reinstall --no-deps sok-hps (or: make setup in the repository)"


@functools.cache
def compat_library() -> Any:
    """The loaded library of the two ops of SavedModels exported with NVIDIA's HPS plugin (``Init``,
    ``Lookup``, with the plugin's signatures; their kernels call :func:`nvidia_init` and
    :func:`nvidia_lookup`): sok-hps's ``lib/libsok_tf_hps_compat.so``, after sok-core's op library.

    Raises:
        sparse_operation_kit.tf_ops.OpLibraryError: the library is missing (sok-hps was built where
            TensorFlow was not importable), was built for another TensorFlow, or does not load; the
            message names the file and how to rebuild sok-hps.
    """
    from sparse_operation_kit import tf_ops

    return tf_ops.load_op_library(os.path.join(_LIB_DIR, COMPAT_LIBRARY), package="sok-hps", rebuild=_REBUILD)


def serving_libraries() -> list[str]:
    """The op libraries a process with no Python (a C++ server on TensorFlow's C API, TensorFlow
    Serving) loads, in this order, to serve SavedModels with HPS's layers: sok-core's
    (:func:`sparse_operation_kit.tf_ops.serving_libraries`), then sok-backend-det's
    ``libsok_det_storage.so`` and sok-backend-hkv's ``libsok_hkv_storage.so`` (no ops: the storages
    the C++ server keeps its rows and its evicting caches in), then ``lib/libsok_hps_serving.so``,
    whose C++ server answers the lookups of layers traced while HPS was not running
    (docs/design/hps-serving.md says which ps_configs it serves).

    Raises:
        FileNotFoundError: sok-hps was built without its library (TensorFlow was not importable
            then), or a backend is not installed or has no storage library (built before it had
            one); the message says how to rebuild or reinstall.

    Example::

        $ python -c "from hierarchical_parameter_server import graph_calls; print(*graph_calls.serving_libraries())"
    """
    from sparse_operation_kit import tf_ops

    path = os.path.join(_LIB_DIR, SERVING_LIBRARY)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: sok-hps was built where TensorFlow was not importable; {_REBUILD}")
    det = _storage_library("sok_backend_det", DET_STORAGE_LIBRARY, "its tables' rows")
    hkv = _storage_library("sok_backend_hkv", HKV_STORAGE_LIBRARY, "its evicting caches")
    return [*tf_ops.serving_libraries(), det, hkv, path]


def _storage_library(package: str, library: str, role: str) -> str:
    """The path of the storage ``library`` of the backend ``package`` (an import name), found
    without importing the backend; ``role``: what the C++ server keeps in it, for messages."""
    distribution = package.replace("_", "-")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"{distribution} is not installed: the C++ server keeps {role} in its {library}; pip install {distribution}"
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], library)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} is missing: this {distribution} was built before it shipped its storage as a library of its "
            f"own; pip install --no-build-isolation --force-reinstall --no-deps {distribution}"
        )
    return path


def load_ops() -> None:
    """Load the ops that lookup graphs name (``SokResolveTable``, ``SokPyCall``) and those of
    SavedModels exported with NVIDIA's plugin (``Init``, ``Lookup``, :func:`compat_library`). Where
    these two cannot load (another library holds ops of their generic names, or sok-hps was built
    without them), they are left out with a warning."""
    from sparse_operation_kit import tf_ops

    tf_ops.python_library()
    try:
        compat_library()
    except tf_ops.OpLibraryError as error:
        logger.warning("SavedModels exported with NVIDIA's HPS plugin (ops Init, Lookup) will not load: %s", error)


def serve_process_server(get_server: Callable[..., ParameterServer]) -> None:
    """Make ``get_server`` (:func:`hierarchical_parameter_server.init.get_server`, which :mod:`.init`
    gives here when it is imported) what :func:`process_server` calls: the server of the graphs
    whose own is closed, and of the ops of NVIDIA's plugin."""
    global _process_server
    _process_server = get_server


def process_server(ps_config_file: str = "", global_batch_size: int = 1) -> ParameterServer:
    """This process's server, initialised from ``ps_config_file`` if nothing has yet
    (:func:`hierarchical_parameter_server.init.get_server`).

    Raises:
        RuntimeError: HPS is not initialised and no ``ps_config_file`` is given, or
            :mod:`hierarchical_parameter_server.init` is not imported.
    """
    get_server = _process_server
    if get_server is None:
        raise RuntimeError(
            "HPS's lookup graphs find the process's parameter server through hierarchical_parameter_server.init, "
            "which this process has not imported: import hierarchical_parameter_server after TensorFlow (or "
            "import hierarchical_parameter_server.init) before the graph runs"
        )
    return get_server(ps_config_file, global_batch_size)


def served_table(context: str) -> ServedTable:
    """The table a context names (see the module's docstring for where it is found).

    Raises:
        RuntimeError: no server is open and the context names no ps_config file (the server that
            traced the graph was not started by ``hps.Init``): call ``hps.Init`` first.
        ValueError: the server has no such model or table.
        TracedTableChangedError: the table's width or key dtype is not the one the context records
            (contexts that record none are not checked).
    """
    fields = json.loads(context)
    server: ParameterServer | None = open_server(fields["server"])
    if server is None:
        server = process_server(fields["ps_config_file"], fields["global_batch_size"])
    table = server.table(fields["model"], fields["table_id"])
    check_traced(fields, table, server)
    return table


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


@python_ops.register
def lookup(context: str, keys: np.ndarray) -> np.ndarray:
    """The rows of the 1-D ``keys`` in the table (:meth:`.server.ServedTable.lookup`, eager): the
    lookup of a graph traced while HPS was not running, which starts it on its first run."""
    return _rows(served_table(context), keys)


def _rows(served: ServedTable, keys: np.ndarray) -> np.ndarray:
    """``served``'s rows of ``keys`` (any shape): ``keys.shape + [dim]``."""
    import tensorflow as tf

    rows = served.lookup(tf.constant(keys.reshape(-1)))
    return rows.numpy().reshape(keys.shape + (served.dim,))


# -- the ops of SavedModels exported with NVIDIA's HPS plugin (hps_compat_ops.cc) -------------------
@python_ops.register
def nvidia_init(context: str) -> None:
    """``Init``: HPS initialised from the op's ``ps_config_file`` and ``global_batch_size``, unless it
    is already (then nothing changes, as the plugin's Init)."""
    fields = json.loads(context)
    process_server(fields["ps_config_file"], fields["global_batch_size"])


@python_ops.register
def nvidia_lookup(context: str, keys: np.ndarray) -> np.ndarray:
    """``Lookup``: the rows of ``keys`` (any shape) in the context's table: ``keys.shape + [dim]``.

    Raises:
        RuntimeError: HPS is not initialised.
        ValueError: no such model or table, a width other than the table's, or keys of the dtype
            ``supportlonglong`` does not say.
    """
    import tensorflow as tf

    fields = json.loads(context)
    served = process_server().table(fields["model_name"], fields["table_id"])
    served.check_call(fields["emb_vec_size"], tf.as_dtype(keys.dtype), "Lookup (NVIDIA HPS)")
    return _rows(served, keys)
