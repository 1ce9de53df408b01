"""The conformance suite on tiny, a backend written in plain C99 against ``sok/storage_api.h`` alone.

The C file is compiled here with nothing but that header on the include path, loaded with ctypes
and registered at run time through the plugin hook; sok-core's binding of the C ABI drives it.
That the whole suite passes is the proof that a third party needs only the contract headers.
Skipped (with the reason) where no C compiler is found.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import tiny_c_backend
from sparse_operation_kit import _table
from sparse_operation_kit.plugins import get_registry
from sparse_operation_kit.storage import create_storage
from sparse_operation_kit.testing import StorageConformance

if tiny_c_backend.compiler() is None:
    pytest.skip("no C compiler (cc, gcc or clang) to build the C backend", allow_module_level=True)


@pytest.fixture(scope="module")
def tiny_plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The C backend, built and loaded, registered through the plugin hook for this module's tests."""
    tiny_c_backend.load(tiny_c_backend.build(tmp_path_factory.mktemp("tiny")))
    registry = get_registry()
    registry.register_plugin(tiny_c_backend, name="tiny")
    yield tiny_c_backend
    registry.unregister(tiny_c_backend.SPEC.name)
    registry.plugin_manager.unregister(tiny_c_backend)


class TestCBackendConformance(StorageConformance):
    @pytest.fixture
    def var_type(self, tiny_plugin: object) -> str:
        return tiny_c_backend.VAR_TYPE


def test_the_build_sees_only_the_contract_header(tmp_path: Path) -> None:
    """The include directory of the build holds storage_api.h and nothing else."""
    tiny_c_backend.build(tmp_path)
    headers = sorted(str(p.relative_to(tmp_path / "include")) for p in (tmp_path / "include").rglob("*") if p.is_file())
    assert headers == ["sok/storage_api.h"]


def test_the_source_includes_only_the_contract_and_the_c_library() -> None:
    included = re.findall(r'#include [<"]([^>"]+)[>"]', tiny_c_backend.SOURCE.read_text())
    assert [name for name in included if name.startswith("sok/")] == ["sok/storage_api.h"]
    assert all(name == "sok/storage_api.h" or "/" not in name for name in included), included


def test_tables_are_the_binding_of_sok_core(tiny_plugin: object) -> None:
    storage = create_storage("tiny", row_width=2)
    assert type(storage.table) is _table.Table
    assert storage.describe().startswith("tiny (C99)")
    loaded = get_registry().load("tiny")
    assert loaded.api_address is not None and loaded.api is not None
