"""tf_ops.load_op_library: another package's op library, built with sok-core's CMake package, loads
with sok-core's checks; each refusal names the package, the file and the package's rebuild command.
"""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from sparse_operation_kit import tf_ops  # noqa: E402

REBUILD = "pip install --no-build-isolation --force-reinstall --no-deps my-ops"


def _load(path):
    return tf_ops.load_op_library(str(path), package="my-ops", rebuild=REBUILD)


def test_a_missing_library_names_the_package_the_file_and_the_rebuild(tmp_path):
    with pytest.raises(tf_ops.OpLibraryError, match="my-ops was built without") as error:
        _load(tmp_path / "libmy_ops.so")
    assert str(tmp_path / "libmy_ops.so") in str(error.value)
    assert str(error.value).endswith(REBUILD)


def test_a_library_without_its_tensorflow_stamp_is_refused(tmp_path):
    (tmp_path / "libmy_ops.so").write_bytes(b"never loaded")
    with pytest.raises(tf_ops.OpLibraryError, match="the TensorFlow version it was built for") as error:
        _load(tmp_path / "libmy_ops.so")
    assert str(tmp_path / "tf_build.txt") in str(error.value)
    assert str(error.value).endswith(REBUILD)


def test_a_library_built_for_another_tensorflow_names_both_versions(tmp_path):
    (tmp_path / "libmy_ops.so").write_bytes(b"never loaded")
    (tmp_path / "tf_build.txt").write_text("2.0.0\n")
    with pytest.raises(tf_ops.OpLibraryError, match=f"built for TensorFlow 2.0.0 but TensorFlow {tf.__version__}"):
        _load(tmp_path / "libmy_ops.so")


def test_a_library_the_loader_refuses_keeps_the_loaders_message(tmp_path):
    (tmp_path / "libmy_ops.so").write_bytes(b"not a shared library")
    (tmp_path / "tf_build.txt").write_text(f"{tf.__version__}\n")
    with pytest.raises(tf_ops.OpLibraryError, match=f"loading {tmp_path / 'libmy_ops.so'} failed: ") as error:
        _load(tmp_path / "libmy_ops.so")
    assert str(error.value).endswith(REBUILD)
