"""Additions to the ``sok`` command from other distributions: ``sok ckpt`` subcommands and the
demo's serving part (:mod:`.hookspecs`: ``sok_ckpt_commands``, ``sok_demo_server``).

A distribution adds to the command through an entry point in the group ``sok.commands`` pointing at
a module with ``@hookimpl`` functions. sok-core depends on none of them: without sok-hps there is
no ``sok ckpt convert`` and the demo skips serving, saying what to install.

Example (sok-hps's ``pyproject.toml``)::

    [project.entry-points."sok.commands"]
    hps = "hierarchical_parameter_server.sok_commands"
"""

from __future__ import annotations

import functools
import logging

import pluggy

from sparse_operation_kit.plugins import hookspecs

__all__ = ["COMMANDS_ENTRY_POINT_GROUP", "MISSING", "plugin_manager"]

logger = logging.getLogger(__name__)

#: The entry-point group of the plugins of the ``sok`` command.
COMMANDS_ENTRY_POINT_GROUP = "sok.commands"

#: What to install for a part of the command that a plugin provides, by the name users type.
MISSING = {
    "sok ckpt convert": "sok-hps (pip install 'sok-core[hps]')",
    "sok demo --part serve": "sok-hps (pip install 'sok-core[hps]')",
}


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """The plugins of the ``sok`` command, loaded once from their entry points."""
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    count = manager.load_setuptools_entrypoints(COMMANDS_ENTRY_POINT_GROUP)
    logger.debug("loaded %d plugin(s) of the sok command from entry points %r", count, COMMANDS_ENTRY_POINT_GROUP)
    return manager
