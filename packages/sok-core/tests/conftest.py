"""Fixtures of sok-core's tests: the pydict plugin backend, registered for the tests that ask."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# --import-mode=importlib leaves sys.path alone: make this folder's helper modules importable.
sys.path.insert(0, str(Path(__file__).parent))

import pydict_backend  # noqa: E402
from sparse_operation_kit.plugins import get_registry  # noqa: E402


@pytest.fixture
def pydict_plugin() -> Iterator[object]:
    """The pydict backend, registered through the plugin hook for one test, then removed."""
    registry = get_registry()
    registry.register_plugin(pydict_backend, name="pydict")
    try:
        yield pydict_backend
    finally:
        registry.unregister(pydict_backend.SPEC.name)
        registry.plugin_manager.unregister(pydict_backend)
