"""sok-hps's op library, ``libsok_tf_hps_compat.so`` (the ops of NVIDIA's HPS plugin): built by
sok-hps's CMakeLists.txt into ``hierarchical_parameter_server/lib/`` beside the TensorFlow version
it was built against, and loaded with sok-core's checks (tf_ops.load_op_library, tested there);
where it cannot load, the error names the file and how to rebuild sok-hps, and importing the
package only warns.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")
from hierarchical_parameter_server import graph_calls  # noqa: E402
from sparse_operation_kit import tf_ops  # noqa: E402

REBUILD = "pip install --no-build-isolation --force-reinstall --no-deps sok-hps"


def test_the_library_is_installed_with_the_package_beside_its_tensorflow_version():
    lib_dir = Path(graph_calls.__file__).parent / "lib"
    assert (lib_dir / graph_calls.COMPAT_LIBRARY).is_file()
    assert (lib_dir / "tf_build.txt").read_text().strip() == tf.__version__


def test_a_missing_library_names_the_file_and_how_to_rebuild_sok_hps(tmp_path, monkeypatch):
    monkeypatch.setattr(graph_calls, "_LIB_DIR", str(tmp_path))
    with pytest.raises(tf_ops.OpLibraryError, match="sok-hps was built without") as error:
        graph_calls.compat_library.__wrapped__()  # the uncached call
    assert str(tmp_path / graph_calls.COMPAT_LIBRARY) in str(error.value)
    assert REBUILD in str(error.value)


def test_load_ops_warns_where_the_library_cannot_load(monkeypatch, caplog):
    def missing():
        raise tf_ops.OpLibraryError("sok-hps was built without lib/x.so; rebuild it: ...")

    monkeypatch.setattr(graph_calls, "compat_library", missing)
    with caplog.at_level(logging.WARNING, logger=graph_calls.__name__):
        graph_calls.load_ops()
    assert "exported with NVIDIA's HPS plugin (ops Init, Lookup) will not load" in caplog.text
    assert "sok-hps was built without lib/x.so" in caplog.text
