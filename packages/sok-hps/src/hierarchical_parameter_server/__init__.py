"""Hierarchical Parameter Server (HPS): inference lookups of SparseOperationKit embeddings.

``import hierarchical_parameter_server as hps`` is the import of NVIDIA HPS's users. This release
ships the package, its version and the conversion of SOK checkpoints to HPS's sparse-model layout
(:func:`hierarchical_parameter_server.convert.convert_to_hps`, ``sok ckpt convert``);
``hps.Init``, ``hps.LookupLayer`` and ``hps.SparseLookupLayer`` arrive with the HPS issue (see the
project README's status table).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sok-hps")
except PackageNotFoundError:  # a source tree
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
