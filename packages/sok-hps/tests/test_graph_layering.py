"""The layering of the lookup graphs' modules, and what saved graphs name.

From the bottom: :mod:`.graph_context` (the names, contexts and open servers a traced graph needs)
imports no module of HPS; :mod:`.server` traces through it and imports neither
:mod:`.graph_calls` nor :mod:`.init`; :mod:`.graph_calls` (the functions graphs call) does not
import :mod:`.init`, which imports it. Every import counts, also one inside a function or under
``TYPE_CHECKING``. The functions keep the names that SavedModels exported before hold, and a
process that imports the package before TensorFlow still registers them before a layer traces.
:mod:`.init` gives :mod:`.graph_calls` the process's server; without it, a graph call says so.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")
sys.path.insert(0, str(Path(__file__).parent))
import hierarchical_parameter_server as hps  # noqa: E402
import serve_support as support  # noqa: E402
from hierarchical_parameter_server import graph_calls, graph_context  # noqa: E402
from sparse_operation_kit import python_ops  # noqa: E402

PACKAGE = "hierarchical_parameter_server"


def hps_imports(module: str) -> set[str]:
    """The modules of the package that ``module``'s source imports anywhere (``"graph_calls"``)."""
    tree = ast.parse((Path(hps.__file__).parent / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == PACKAGE:
                found.update(alias.name for alias in node.names)
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found.update([node.module.split(".")[0]] if node.module else [alias.name for alias in node.names])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith(PACKAGE + "."))
    return found


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("graph_context", {"server", "graph_calls", "init", "layers"}),
        ("server", {"graph_calls", "init", "layers"}),
        ("graph_calls", {"init", "layers"}),
    ],
)
def test_a_lower_module_imports_none_above_it(module, forbidden):
    assert not hps_imports(module) & forbidden, f"{module}.py imports {sorted(hps_imports(module) & forbidden)}"


def test_the_import_parser_sees_imports_inside_functions_and_type_checking(tmp_path, monkeypatch):
    source = textwrap.dedent(
        """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from hierarchical_parameter_server.server import ServedTable
        def f():
            from hierarchical_parameter_server import init
            import hierarchical_parameter_server.layers
        """
    )
    (tmp_path / "probe.py").write_text(source)
    monkeypatch.setattr(hps, "__file__", str(tmp_path / "__init__.py"))
    assert hps_imports("probe") == {"server", "init", "layers"}


@pytest.mark.parametrize("name", ["CACHE_TABLE", "VOLATILE_TABLE", "FETCH", "FILL", "SCHEDULE_FILL"])
def test_the_names_saved_graphs_hold_are_the_registered_functions_of_graph_calls(name):
    function = name.lower()
    assert getattr(graph_context, name) == f"hierarchical_parameter_server.graph_calls:{function}"
    assert getattr(graph_calls, name) == getattr(graph_context, name)
    assert python_ops._function(getattr(graph_context, name)) is getattr(graph_calls, function)


def test_graph_calls_still_offers_the_names_that_moved_below_it():
    for name in ("TracedTableChangedError", "check_traced", "context_of", "register", "unregister"):
        assert getattr(graph_calls, name) is getattr(graph_context, name)


IMPORTED_BEFORE_TENSORFLOW = textwrap.dedent(
    """
    import sys
    import hierarchical_parameter_server as hps
    assert "tensorflow" not in sys.modules
    import tensorflow as tf

    hps.Init(ps_config_file=sys.argv[1], global_batch_size=8)
    layer = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=4, emb_vec_dtype=tf.float32)
    print(layer(tf.constant([1, 2], tf.int64)).shape)
    """
)


def test_a_layer_traces_where_the_package_was_imported_before_tensorflow(tmp_path):
    folder, _ = support.write_table(tmp_path / "t", 10, 4)
    config = support.ps_config([support.model_entry("m", [folder], [4])], **support.DISABLED_DBS)
    path = support.write_config(tmp_path / "ps.json", config)
    run = subprocess.run(
        [sys.executable, "-c", IMPORTED_BEFORE_TENSORFLOW, path], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith("(2, 4)")


def test_init_gives_graph_calls_the_process_server():
    from hierarchical_parameter_server import init

    assert graph_calls._process_server is init.get_server


def test_a_graph_call_without_init_imported_says_to_import_it(monkeypatch):
    monkeypatch.setattr(graph_calls, "_process_server", None)
    with pytest.raises(RuntimeError, match="has not imported: import hierarchical_parameter_server after TensorFlow"):
        graph_calls.nvidia_init('{"ps_config_file": "ps.json", "global_batch_size": 8}')
