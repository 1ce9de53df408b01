"""The conformance suite on pydict, a pure-Python backend added as a plugin at run time.

That the whole suite passes on a backend registered only through ``sok_register_backends`` is the
proof that third-party plugins work.
"""

from __future__ import annotations

import pydict_backend
import pytest
from sparse_operation_kit.plugins import UnknownVarTypeError, get_registry
from sparse_operation_kit.storage import create_storage
from sparse_operation_kit.testing import StorageConformance


class TestPyDictConformance(StorageConformance):
    @pytest.fixture
    def var_type(self, pydict_plugin: object) -> str:
        return pydict_backend.VAR_TYPE


def test_plugin_registers_and_unregisters_its_backend() -> None:
    registry = get_registry()
    assert "pydict" not in registry.var_types()
    registry.register_plugin(pydict_backend, name="pydict")
    try:
        assert registry.spec("pydict") is pydict_backend.SPEC
        assert create_storage("pydict", row_width=2).describe().startswith("pydict")
    finally:
        registry.unregister("pydict")
        registry.plugin_manager.unregister(pydict_backend)
    with pytest.raises(UnknownVarTypeError, match="pydict"):
        create_storage("pydict", row_width=2)


def test_plugin_tables_follow_the_table_protocol(pydict_plugin: object) -> None:
    from sparse_operation_kit.storage import Table

    table = pydict_backend.PyDictTable("int64", 3, {})
    missing = [name for name in vars(Table) if not name.startswith("_") and not hasattr(table, name)]
    assert missing == []


def test_an_empty_python_list_of_keys_is_an_empty_batch(pydict_plugin: object) -> None:
    storage = create_storage("pydict", row_width=2)
    values, found = storage.find([])
    assert values.shape == (0, 2) and found.shape == (0,)
