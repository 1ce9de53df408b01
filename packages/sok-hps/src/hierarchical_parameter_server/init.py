"""``hps.Init``: the process's parameter server, made once from a ps_config.

Init is once per process and thread-safe: the first call that succeeds loads the tables
(:class:`~hierarchical_parameter_server.server.ParameterServer`); later calls, with any arguments,
return ``"OK"`` and change nothing. A call that fails (a missing or invalid config, an unreadable
model file) leaves nothing behind, so the next call tries again. The layers initialise implicitly
from their ``ps_config_file`` and ``global_batch_size`` on their first call.

Where this differs from NVIDIA HPS: the checks of ``init_check`` (reference §1.6) raise
``ValueError`` instead of only being logged, and unknown keyword arguments raise ``TypeError``.
One replica per process: ``deployed_device_list`` must be ``[0]`` (the caches live on the first GPU
TensorFlow sees, or on the CPU).

Example::

    >>> import hierarchical_parameter_server as hps
    >>> hps.Init(ps_config_file="ps.json", global_batch_size=1024)  # doctest: +SKIP
    <tf.Tensor: shape=(), dtype=string, numpy=b'OK'>
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import tensorflow as tf

from hierarchical_parameter_server.config import PSConfig, load_config
from hierarchical_parameter_server.server import ParameterServer

logger = logging.getLogger(__name__)

__all__ = ["Init", "get_server", "is_initialized", "shutdown"]

_lock = threading.Lock()
_server: ParameterServer | None = None
_ARGS = ("ps_config_file", "global_batch_size")


def Init(**kwargs: Any) -> tf.Tensor:  # noqa: N802 (the seed API's name)
    """Initialise HPS for this process from a ps_config JSON file; returns the string tensor ``"OK"``.

    Keyword Args:
        ps_config_file (str): path of the ps_config JSON (relative paths are relative to the working
            directory).
        global_batch_size (int): the largest batch the lookups serve; at most every model's
            ``max_batch_size``.

    Raises:
        TypeError: an argument is missing or unknown.
        ValueError: ``global_batch_size`` or ``deployed_device_list`` is not valid for this process.
        hierarchical_parameter_server.config.ConfigError: the ps_config is not valid.

    Example::

        status = hps.Init(ps_config_file="ps.json", global_batch_size=1024)
        assert status.numpy() == b"OK"
    """
    global _server
    unknown = sorted(set(kwargs) - set(_ARGS))
    missing = [name for name in _ARGS if name not in kwargs]
    if unknown or missing:
        raise TypeError(
            f"hps.Init takes the keyword arguments ps_config_file and global_batch_size; "
            f"{'missing: ' + ', '.join(missing) if missing else ''}{'; ' if unknown and missing else ''}"
            f"{'unknown: ' + ', '.join(unknown) if unknown else ''}. Example: "
            f"hps.Init(ps_config_file='ps.json', global_batch_size=1024)"
        )
    with _lock:
        if _server is None:
            path, batch = kwargs["ps_config_file"], kwargs["global_batch_size"]
            config = load_config(os.fspath(path))
            _check(config, batch)
            _server = ParameterServer(config, origin=(os.path.abspath(path), batch))
            logger.info("HPS initialised from %s", os.path.abspath(path))
        else:
            logger.debug("hps.Init: HPS is initialised already; this call changes nothing")
    return tf.constant("OK")


def _check(config: PSConfig, global_batch_size: Any) -> None:
    """The checks of the original's ``init_check``, raised (one replica per process)."""
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size <= 0:
        raise ValueError(f"global_batch_size must be an integer > 0, got {global_batch_size!r}")
    for i, model in enumerate(config.models):
        devices = sorted(int(d) for d in model.deployed_device_list)
        if devices != [0]:
            raise ValueError(
                f"models[{i}].deployed_device_list is {list(model.deployed_device_list)!r}; valid: [0] (HPS "
                f"serves one replica per process, on the first GPU TensorFlow sees or the CPU)"
            )
        if global_batch_size > int(model.max_batch_size):
            raise ValueError(
                f"global_batch_size {global_batch_size} is larger than models[{i}].max_batch_size "
                f"{model.max_batch_size} of model {model.model!r}; raise max_batch_size in the ps_config or "
                f"pass a smaller global_batch_size"
            )


def is_initialized() -> bool:
    """Whether :func:`Init` has succeeded in this process."""
    return _server is not None


def get_server(ps_config_file: str = "", global_batch_size: int = 1) -> ParameterServer:
    """The process's parameter server, initialising it from ``ps_config_file`` if :func:`Init` has
    not run (the layers' implicit initialisation).

    Raises:
        RuntimeError: HPS is not initialised and no ``ps_config_file`` is given.
    """
    if _server is None:
        if not ps_config_file:
            raise RuntimeError(
                "HPS is not initialised: call hps.Init(ps_config_file=..., global_batch_size=...) first, or "
                "give the layer ps_config_file (and global_batch_size) for implicit initialisation"
            )
        Init(ps_config_file=ps_config_file, global_batch_size=global_batch_size)
    assert _server is not None
    return _server


def shutdown() -> None:
    """Close the process's parameter server (stop its update source, close its databases); the next
    :func:`Init` (or a layer's implicit one) loads a ps_config afresh.

    Example::

        hps.init.shutdown()
        hps.Init(ps_config_file="ps_v2.json", global_batch_size=1024)   # serves the new config
    """
    global _server
    with _lock:
        if _server is not None:
            _server.close()
        _server = None
