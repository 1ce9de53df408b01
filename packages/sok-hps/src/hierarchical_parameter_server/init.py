"""``hps.Init``: the process's parameter server, made once from a ps_config.

Init is once per process and thread-safe: the first call that succeeds loads the tables
(:class:`~hierarchical_parameter_server.server.ParameterServer`); later calls, with any arguments,
return ``"OK"`` and change nothing. A call that fails (a missing or invalid config, an unreadable
model file) leaves nothing behind, so the next call tries again. The layers initialise implicitly
from their ``ps_config_file`` and ``global_batch_size`` on their first call.

To serve another ps_config (or new model files) under traffic, call :func:`reload`: it starts the
new server while the old one serves, swaps them, and closes the old one once the lookups in
flight on it are done; no lookup fails, and graphs traced before read the new tables.
:func:`shutdown` then :func:`Init` works too, but lookups that run between the two (or while the
old server closes) fail ("not initialised", "table not alive"): use it when nothing serves.

Where this differs from NVIDIA HPS: the checks of ``init_check`` (reference §1.6) raise
``ValueError`` instead of only being logged, and unknown keyword arguments raise ``TypeError``.
One cache per table and process: ``deployed_device_list`` is, as the original requires, the devices
0 .. n-1 of n replicas (any order), and the process's one cache, on the first GPU TensorFlow sees or
on the CPU, serves every replica (the original kept a full copy on each device; the rows are the
same, a replica on another GPU reads them across devices).

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
from sparse_operation_kit.validate import is_positive_int

from hierarchical_parameter_server import graph_calls
from hierarchical_parameter_server.config import PSConfig, load_config
from hierarchical_parameter_server.server import ParameterServer

logger = logging.getLogger(__name__)

__all__ = ["Init", "get_server", "is_initialized", "reload", "shutdown"]

_lock = threading.Lock()
_server: ParameterServer | None = None
_ARGS = ("ps_config_file", "global_batch_size")
#: How long the storages of a replaced server outlive it, for the lookup ops that read them then.
_GRACE_S = 5.0


def _arguments(name: str, kwargs: dict[str, Any]) -> tuple[str, Any]:
    """``(ps_config_file, global_batch_size)`` of a call of ``name``, or TypeError."""
    unknown = sorted(set(kwargs) - set(_ARGS))
    missing = [arg for arg in _ARGS if arg not in kwargs]
    if unknown or missing:
        raise TypeError(
            f"{name} takes the keyword arguments ps_config_file and global_batch_size; "
            f"{'missing: ' + ', '.join(missing) if missing else ''}{'; ' if unknown and missing else ''}"
            f"{'unknown: ' + ', '.join(unknown) if unknown else ''}. Example: "
            f"{name}(ps_config_file='ps.json', global_batch_size=1024)"
        )
    return kwargs["ps_config_file"], kwargs["global_batch_size"]


def _start(path: Any, batch: Any, predecessor: ParameterServer | None = None) -> ParameterServer:
    config = load_config(os.fspath(path))
    _check(config, batch)
    # eagerly, also where a graph is being built: a layer's implicit initialisation may run inside
    # one (tf_keras calls layers on symbolic inputs in a graph), whose ops would never load the tables
    with tf.init_scope():
        return ParameterServer(config, origin=(os.path.abspath(path), batch), predecessor=predecessor)


def Init(**kwargs: Any) -> tf.Tensor:  # noqa: N802 (the seed API's name)
    """Initialise HPS for this process from a ps_config JSON file; returns the string tensor ``"OK"``.

    Once per process: to serve another ps_config under traffic, use :func:`reload` (not
    :func:`shutdown` then ``Init``, which fails the lookups that run in between).

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
    path, batch = _arguments("hps.Init", kwargs)
    with _lock:
        if _server is None:
            _server = _start(path, batch)
            logger.info("HPS initialised from %s", os.path.abspath(path))
        else:
            logger.debug("hps.Init: HPS is initialised already; this call changes nothing")
    return tf.constant("OK")


def _check(config: PSConfig, global_batch_size: Any) -> None:
    """The checks of the original's ``init_check``, raised."""
    if not is_positive_int(global_batch_size, numpy=False):
        raise ValueError(f"global_batch_size must be an integer > 0, got {global_batch_size!r}")
    for i, model in enumerate(config.models):
        devices = sorted(int(d) for d in model.deployed_device_list)
        replicas = len(devices)
        if devices != list(range(replicas)):
            raise ValueError(
                f"models[{i}].deployed_device_list is {list(model.deployed_device_list)!r}; valid: the devices "
                f"0 .. n-1 of n replicas (e.g. [0], or [0, 1, 2, 3] for four), as NVIDIA HPS requires"
            )
        if replicas > 1:
            logger.info(
                "HPS model %r: deployed on %d devices; one cache per table serves every replica (the "
                "process's first GPU, or the CPU)",
                model.model,
                replicas,
            )
        if global_batch_size % replicas:
            raise ValueError(
                f"global_batch_size {global_batch_size} does not divide among the {replicas} replicas of "
                f"models[{i}].deployed_device_list; pass a multiple of {replicas}"
            )
        if global_batch_size // replicas > int(model.max_batch_size):
            per = "" if replicas == 1 else f" / {replicas} replicas = {global_batch_size // replicas}"
            raise ValueError(
                f"global_batch_size {global_batch_size}{per} is larger than models[{i}].max_batch_size "
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


# Lookup graphs whose server is closed, and the ops of NVIDIA's plugin, serve this process's server.
graph_calls.serve_process_server(get_server)


def reload(**kwargs: Any) -> tf.Tensor:
    """Serve a ps_config afresh with no failed lookup; returns the string tensor ``"OK"``.

    The new parameter server loads while the old one serves (sharing its persistent DB when both
    configs give the same ``persistent_db`` type and path; the open database keeps its other
    settings, such as ``num_threads``, until the process restarts, with a warning; ``read_only``
    and ``update_filters`` are the new config's), then becomes the process's server in one step; the
    old one hands over (:meth:`.server.ParameterServer.hand_over`): graphs traced on it read the
    new tables from then on, and it closes once the lookups in flight on it are done. Lookups that
    run during the reload get the old model's rows or the new one's; after it, the new one's. While
    the new server loads a shared database the old one reads on a cache miss, a key gets the row
    of either model, and a key the new model lacks the default value. A graph whose table changes
    width, key dtype or cache kind resolves it again (a width it was not traced for fails: trace it
    again). Without a server yet, it is :func:`Init`. A failed reload raises and leaves the old
    server serving. When it fails before the first database write (an invalid config, an
    ``update_source.path`` that cannot be a directory, a corrupt model file, another width in a
    database) the databases are as they were. When it fails after it (a database going down
    mid-load), the shared databases (Redis, RocksDB) are partly re-deployed: the old server then
    serves a mix of both models' rows, and keys the new model lacks may read the default value;
    an error line says so, and a reload that succeeds (of either config) serves one model again.

    Keyword Args:
        ps_config_file (str), global_batch_size (int): as :func:`Init`'s.

    Raises:
        TypeError: an argument is missing or unknown (as :func:`Init`).
        ValueError: ``global_batch_size`` or ``deployed_device_list`` is not valid for this process.
        hierarchical_parameter_server.config.ConfigError: the ps_config is not valid, a database
            holds another width for a table, or ``update_source.path`` cannot be a directory.
        hierarchical_parameter_server.tiers.TierUnavailable: a database failed mid-load (see above).

    Example::

        hps.init.reload(ps_config_file="ps_v2.json", global_batch_size=1024)   # under traffic
    """
    global _server
    path, batch = _arguments("hps.init.reload", kwargs)
    with _lock:
        old = _server
        new = _start(path, batch, predecessor=old)
        _server = new
        if old is not None:
            old.hand_over(new, grace_s=_GRACE_S)
    logger.info("HPS reloaded from %s", os.path.abspath(path))
    return tf.constant("OK")


def shutdown() -> None:
    """Close the process's parameter server (stop its update source, close its databases); the next
    :func:`Init` (or a layer's implicit one) loads a ps_config afresh. Lookups that run meanwhile
    fail: to change what is served under traffic, use :func:`reload`.

    Example::

        hps.init.shutdown()
        hps.Init(ps_config_file="ps_v2.json", global_batch_size=1024)   # serves the new config
    """
    global _server
    with _lock:
        if _server is not None:
            _server.close()
        _server = None
