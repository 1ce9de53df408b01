"""Every hook a SparseOperationKit plugin can implement: storage backends, and additions to the
``sok`` command (:mod:`.commands`).

A storage backend is a Python distribution that declares an entry point in the group
``sok.backends`` pointing at a module (or object) with ``@hookimpl`` functions. sok-core loads the
entry points when a registry is first needed, but imports a backend's native code only when a
``var_type`` asks for it.

A native backend implements the C ABI of ``sok/storage_api.h`` (plain C; the only header it
needs, in ``sparse_operation_kit.get_include()``) and hands sok-core its function table as a
PyCapsule named ``"sok_storage_api"``; sok-core's own binding makes its tables and its TensorFlow ops
drive them. A backend written in Python gives a ``factory`` instead.

Example (a third-party native backend's ``pyproject.toml`` and plugin module)::

    [project.entry-points."sok.backends"]
    mybackend = "my_sok_backend.plugin"

    # my_sok_backend/plugin.py
    from sparse_operation_kit.plugins import BackendSpec, Capabilities, hookimpl

    @hookimpl
    def sok_register_backends(registry):
        registry.register(BackendSpec(
            name="mybackend", var_types=("mine",), c_api="my_sok_backend._core:storage_api",
            capabilities=Capabilities(eviction=False, export_if=True, devices=("cpu",)),
            package="my-sok-backend", version="1.0"))
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, Protocol

import pluggy

from sparse_operation_kit.plugins.spec import BackendSpec

#: The pluggy project name of SparseOperationKit's hooks.
PROJECT_NAME = "sok"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)


class BackendRegistrar(Protocol):
    """What a ``sok_register_backends`` implementation may call on the registry it is given
    (:class:`~sparse_operation_kit.plugins.BackendRegistry` is one).

    Example::

        @hookimpl
        def sok_register_backends(registry: BackendRegistrar) -> None:
            registry.register(BackendSpec(name="mine", var_types=("mine",), c_api="my_sok_backend._core:storage_api"))
    """

    def register(self, spec: BackendSpec) -> None:
        """Add a backend; a spec whose name or var_types are taken, or that is malformed, is refused (ValueError,
        BackendLoadError for another ``api_version``)."""


@hookspec
def sok_register_backends(registry: BackendRegistrar) -> None:
    """Register the storage backends this plugin provides.

    Called once per registry, when the registry is built. Call ``registry.register(spec)`` for
    each backend; the spec names the ``var_type`` strings it serves, its C ABI capsule (a native
    backend) or table factory (a Python backend), imported only when one of them is used, its
    capabilities and the storage API version it was built for.

    :param registry: the registry to add :class:`~sparse_operation_kit.plugins.BackendSpec` s to.

    .. versionadded:: 0.1
    """


@hookspec
def sok_ckpt_commands(commands: argparse._SubParsersAction) -> None:
    """Add subcommands to ``sok ckpt`` (sok-hps adds ``convert``).

    Called once when the ``sok`` command builds its parser, for plugins of the entry-point group
    ``sok.commands`` (:mod:`.commands`). Each subcommand is ``commands.add_parser(name, help=...)``
    with its arguments and ``set_defaults(run=function)``: ``function(args)`` runs it and returns
    the exit status.

    :param commands: the sub-parsers of ``sok ckpt``.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def sok_demo_server() -> Callable[[str], Any] | None:
    """The function that serves a trained demo run (``sok demo --part serve``; sok-hps serves it
    through HPS), or None: ``serve(output)`` serves the run written to ``output`` in this process.

    .. versionadded:: 0.1
    """
