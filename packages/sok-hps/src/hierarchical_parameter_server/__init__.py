"""Hierarchical Parameter Server (HPS): inference lookups of SparseOperationKit embeddings.

``import hierarchical_parameter_server as hps`` is the import of NVIDIA HPS's users:
``hps.Init(ps_config_file=..., global_batch_size=...)`` loads the tables of a ps_config into their
tiers (an embedding cache on the GPU or the CPU, a volatile database: in-process hash map or Redis
cluster, a persistent database: RocksDB), and ``hps.LookupLayer`` / ``hps.SparseLookupLayer``
return what ``tf.nn.embedding_lookup`` / ``tf.nn.embedding_lookup_sparse`` return on those tables.

TensorFlow is imported when one of those three is first used, so
:mod:`hierarchical_parameter_server.convert` (``sok ckpt convert``) works without it; where
TensorFlow is imported already, the layers are imported with the package, so that
``keras.models.load_model`` finds them, and the ops of the lookup graphs are loaded, so that
``tf.saved_model.load`` finds them (import TensorFlow or Keras first, then this package).

Example::

    import hierarchical_parameter_server as hps

    hps.Init(ps_config_file="ps.json", global_batch_size=1024)
    lookup = hps.LookupLayer(model_name="foo", table_id=0, emb_vec_size=16, emb_vec_dtype=tf.float32)
    emb = lookup(ids)
"""

from __future__ import annotations

import importlib
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


if "tensorflow" in sys.modules:
    importlib.import_module(f"{__name__}.layers")  # registers the layers with Keras for load_model
    # registers the ops of lookup graphs (SokResolveTable, SokPyCall) for tf.saved_model.load, and
    # those of SavedModels exported with NVIDIA's plugin (Init, Lookup)
    importlib.import_module(f"{__name__}.graph_calls").load_ops()
