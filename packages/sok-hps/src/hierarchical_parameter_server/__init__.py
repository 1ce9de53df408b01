"""Hierarchical Parameter Server (HPS): inference lookups of SparseOperationKit embeddings.

``import hierarchical_parameter_server as hps`` is the import of NVIDIA HPS's users:
``hps.Init(ps_config_file=..., global_batch_size=...)`` loads the tables of a ps_config into their
tiers (an embedding cache on the GPU or the CPU, a volatile database: in-process hash map or Redis
cluster, a persistent database: RocksDB), and ``hps.LookupLayer`` / ``hps.SparseLookupLayer``
return what ``tf.nn.embedding_lookup`` / ``tf.nn.embedding_lookup_sparse`` return on those tables.

TensorFlow is imported when one of those three is first used, so
:mod:`hierarchical_parameter_server.convert` (``sok ckpt convert``) works without it. Once
TensorFlow is imported (before this package or after it: the order does not matter), the layers
are imported, so that ``keras.models.load_model`` finds them, and the ops of the lookup graphs are
loaded, so that ``tf.saved_model.load`` finds them.

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


class _AfterTensorFlow(importlib.abc.MetaPathFinder):
    """Runs :func:`_with_tensorflow` right after the first ``import tensorflow`` of the process
    (NVIDIA's notebooks import this package first); once, then it leaves ``sys.meta_path``."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            try:
                _with_tensorflow()
            except Exception as error:  # noqa: BLE001 - TensorFlow's import must not fail for HPS
                logging.getLogger(__name__).warning(
                    "HPS could not load its layers and ops after TensorFlow's import (%s: %s): saved "
                    "models of HPS layers will not load in this process",
                    type(error).__name__,
                    error,
                )

        spec.loader.exec_module = exec_module
        return spec


if "tensorflow" in sys.modules:
    _with_tensorflow()
elif importlib.util.find_spec("tensorflow") is not None:
    sys.meta_path.insert(0, _AfterTensorFlow())
