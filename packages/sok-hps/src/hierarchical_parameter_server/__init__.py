"""Hierarchical Parameter Server (HPS): inference lookups of SparseOperationKit embeddings.

``import hierarchical_parameter_server as hps`` is the import of NVIDIA HPS's users:
``hps.Init(ps_config_file=..., global_batch_size=...)`` loads the tables of a ps_config into their
tiers (an embedding cache on the GPU or the CPU, a volatile database: in-process hash map or Redis
cluster, a persistent database: RocksDB), and ``hps.LookupLayer`` / ``hps.SparseLookupLayer``
return what ``tf.nn.embedding_lookup`` / ``tf.nn.embedding_lookup_sparse`` return on those tables.

TensorFlow is imported when one of those three is first used, so
:mod:`hierarchical_parameter_server.convert` (``sok ckpt convert``) works without it. Once
TensorFlow is imported (before this package or after it, itself or through ``import keras``: the
order does not matter), the layers are imported, so that ``keras.models.load_model`` finds them,
and the ops of the lookup graphs are loaded, so that ``tf.saved_model.load`` finds them.

Example::

    import hierarchical_parameter_server as hps

    hps.Init(ps_config_file="ps.json", global_batch_size=1024)
    lookup = hps.LookupLayer(model_name="foo", table_id=0, emb_vec_size=16, emb_vec_dtype=tf.float32)
    emb = lookup(ids)
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import sys
import threading
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("sok-hps")
except PackageNotFoundError:  # a source tree
    __version__ = "0.0.0+unknown"

__all__ = ["Init", "LookupLayer", "SparseLookupLayer", "__version__"]

#: The public names that need TensorFlow → their module.
_LAZY = {"Init": "init", "LookupLayer": "layers", "SparseLookupLayer": "layers"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _with_tensorflow() -> None:
    """What a process with TensorFlow needs before it loads a saved model of HPS layers."""
    importlib.import_module(f"{__name__}.layers")  # registers the layers with Keras for load_model
    # registers the ops of lookup graphs (SokResolveTable, SokPyCall) for tf.saved_model.load, and
    # those of SavedModels exported with NVIDIA's plugin (Init, Lookup)
    importlib.import_module(f"{__name__}.graph_calls").load_ops()


#: The packages whose import may import TensorFlow in its midst (Keras 3 and tf_keras do, with
#: TensorFlow's backend): the layers are ``tf.keras`` layers, so they are registered only once the
#: outermost of these imports is done (inside ``import keras``, ``tf.keras`` is a half-made module).
#: This package's own modules are watched too: one that imports TensorFlow first (``import
#: hierarchical_parameter_server.tiers.hash_map`` as a process's first import) is half made when
#: TensorFlow's import ends, and the layers import it.
_WATCHED = frozenset({"tensorflow", "keras", "tf_keras"})


def _watched(fullname: str) -> bool:
    return fullname in _WATCHED or fullname.startswith(f"{__name__}.")


class _AfterTensorFlow(importlib.abc.MetaPathFinder):
    """Runs :func:`_with_tensorflow` once TensorFlow is imported (NVIDIA's notebooks import this
    package first), when the outermost import of :data:`_WATCHED` that brought it in is done
    (``import keras`` imports TensorFlow halfway through its own import); once, then it leaves
    ``sys.meta_path``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._finding = threading.local()  # find_spec below asks the other finders, not this one
        self._importing = 0  # watched imports begun and not yet done

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not _watched(fullname) or getattr(self._finding, "active", False):
            return None
        self._finding.active = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding.active = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            with self._lock:
                self._importing += 1
            try:
                run(module)
            finally:
                with self._lock:
                    self._importing -= 1
            if self._leave_when_done():
                self._register()

        spec.loader.exec_module = exec_module
        return spec

    def _leave_when_done(self) -> bool:
        """Whether TensorFlow is imported and no watched import is under way, for the first caller
        that finds so (this finder then leaves ``sys.meta_path``)."""
        with self._lock:
            if self._importing or "tensorflow" not in sys.modules or self not in sys.meta_path:
                return False
            sys.meta_path.remove(self)
            return True

    @staticmethod
    def _register() -> None:
        try:
            _with_tensorflow()
        except Exception as error:  # noqa: BLE001 - TensorFlow's import must not fail for HPS
            logging.getLogger(__name__).warning(
                "HPS could not load its layers and ops after TensorFlow's import (%s: %s): saved "
                "models of HPS layers will not load in this process",
                type(error).__name__,
                error,
            )


if "tensorflow" in sys.modules:
    _with_tensorflow()
elif importlib.util.find_spec("tensorflow") is not None:
    sys.meta_path.insert(0, _AfterTensorFlow())
