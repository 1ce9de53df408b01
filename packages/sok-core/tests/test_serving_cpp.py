"""A SavedModel with SOK lookups served from C++ with no Python in the process (issue 39).

``sparse_operation_kit.testing.serving_cpp`` builds its C++ server against the TensorFlow wheel's C
API (``libtensorflow_cc.so.2``); it loads SOK's op library (``libsok_tf_ops.so``, which needs no
Python), the SavedModel's ``serve`` graph and variables, and serves one batch. Its outputs must equal
Python's bit for bit, and libpython must never have been mapped into it. Two models: one of
``sok.Variable`` tables (``sok.lookup_sparse`` then a dense layer), and one that mixes two
``sok.DynamicVariable`` tables with a static one, whose SavedModel holds the dynamic tables' serving
copies (``serving_table``): keys the tables held when saved read their rows, the others the tables'
default rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import python_ops, tf_ops  # noqa: E402
from sparse_operation_kit.testing import serving_cpp  # noqa: E402

BATCH, HOTNESS, ROWS, DIM = 6, 3, 50, 8


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Path:
    """The C++ server, compiled against this TensorFlow's headers and libraries."""
    program, why_not = serving_cpp.build(tmp_path_factory.mktemp("serve"))
    if program is None:
        pytest.skip(why_not)
    return program


class Model(tf.Module):
    """Two ``sok.Variable`` tables (one per feature column), pooled by one ``sok.lookup_sparse``
    (sum and mean), concatenated, then a dense layer: a recommender's serving function in small."""

    def __init__(self, row_dtype: str = "float32") -> None:
        rng = np.random.default_rng(3)
        self.tables = [sok.Variable(rng.normal(size=(ROWS, DIM)).astype(np.float32), dtype=row_dtype) for _ in range(2)]
        self.kernel = tf.Variable(rng.normal(size=(2 * DIM, 1)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 2 * HOTNESS], tf.int64)])
    def serve(self, ids: tf.Tensor) -> dict[str, tf.Tensor]:
        bags = [tf.RaggedTensor.from_tensor(part) for part in tf.split(ids, 2, axis=1)]
        pooled = sok.lookup_sparse(self.tables, bags, combiners=["sum", "mean"])
        return {"score": tf.sigmoid(tf.concat(pooled, axis=1) @ self.kernel)}


@pytest.mark.parametrize("row_dtype", ["float32", "bfloat16"])
def test_a_saved_model_of_sok_tables_serves_from_cpp_without_python(server, tmp_path, row_dtype):
    """float32 tables, and tables of bfloat16 rows (the saved lookup op's T attribute)."""
    model = Model(row_dtype)
    path = tmp_path / "model"
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})
    ids = np.random.default_rng(4).integers(0, ROWS, size=(BATCH, 2 * HOTNESS))
    expected = model.serve(tf.constant(ids))["score"].numpy()
    done = serving_cpp.serve(server, path, ids, tmp_path, tf_ops.serving_libraries())
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert f"output: {BATCH} 1" in done.stdout
    assert "libpython: absent" in done.stdout
    served = np.fromfile(tmp_path / "out.bin", np.float32).reshape(BATCH, 1)
    np.testing.assert_array_equal(served, expected)  # bit for bit


def test_without_sok_op_library_the_cpp_server_names_the_missing_op(server, tmp_path):
    model = Model()
    path = tmp_path / "model"
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})
    done = serving_cpp.serve(server, path, np.zeros((1, 2 * HOTNESS), np.int64), tmp_path, [])
    assert done.returncode == 1
    assert "SokPooledLookup" in done.stderr


@python_ops.register
def doubled(context: str, ids: np.ndarray) -> np.ndarray:
    """What the graph of the next test calls by name: in Python, this function."""
    return (2 * ids).astype(np.float32)


def test_a_function_named_by_the_graph_and_implemented_nowhere_in_cpp_is_refused_by_name(server, tmp_path):
    """A SokPyCall in a process with no Python and no native implementation of its function: the
    op loads (it is libsok_tf_ops.so's), and its run fails with a message naming the function, the
    native implementations loaded (none) and what to load, not a crash or 'Op type not registered'."""
    module = tf.Module()
    name = f"{__name__}:doubled"
    module.serve = tf.function(
        lambda ids: {"score": python_ops.py_call(name, "", [ids], [tf.float32])[0]},
        input_signature=[tf.TensorSpec([None, 2], tf.int64)],
    )
    path = tmp_path / "model"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    np.testing.assert_array_equal(module.serve(tf.constant([[1, 2]], tf.int64))["score"].numpy(), [[2, 4]])
    done = serving_cpp.serve(server, path, np.ones((1, 2), np.int64), tmp_path, tf_ops.serving_libraries())
    assert done.returncode == 1
    assert f"SokPyCall of {name}: this process has no Python interpreter" in done.stderr
    assert "(native implementations: none)" in done.stderr
    assert "libsok_hps_serving.so" in done.stderr


class DynamicModel(tf.Module):
    """Two ``sok.DynamicVariable`` tables (a constant initializer of 0.25, and random rows) and a
    ``sok.Variable``, pooled by one ``sok.lookup_sparse`` (sum, mean, sum), then a dense layer."""

    def __init__(self) -> None:
        rng = np.random.default_rng(5)
        self.tables = [
            sok.DynamicVariable(dimension=DIM, initializer=0.25, name="constant_rows"),
            sok.DynamicVariable(dimension=DIM, name="random_rows"),
            sok.Variable(rng.normal(size=(ROWS, DIM)).astype(np.float32)),
        ]
        keys = tf.range(ROWS, dtype=tf.int64)
        for table in self.tables[:2]:
            sok.assign(table, keys, rng.normal(size=(ROWS, DIM)).astype(np.float32))
        self.kernel = tf.Variable(rng.normal(size=(3 * DIM, 1)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 3 * HOTNESS], tf.int64)])
    def serve(self, ids: tf.Tensor) -> dict[str, tf.Tensor]:
        bags = [tf.RaggedTensor.from_tensor(part) for part in tf.split(ids, 3, axis=1)]
        pooled = sok.lookup_sparse(self.tables, bags, combiners=["sum", "mean", "sum"])
        return {"score": tf.sigmoid(tf.concat(pooled, axis=1) @ self.kernel)}


def test_a_saved_model_of_dynamic_tables_serves_their_rows_from_cpp_without_python(server, tmp_path):
    model = DynamicModel()
    held = np.random.default_rng(6).integers(0, ROWS, size=(BATCH, 3 * HOTNESS))
    expected = model.serve(tf.constant(held))["score"].numpy()  # every key held: nothing inserted
    sizes = [table.storage.size() for table in model.tables[:2]]
    path = tmp_path / "model"
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})
    assert [table.storage.size() for table in model.tables[:2]] == sizes  # saving inserts nothing
    done = serving_cpp.serve(server, path, held, tmp_path, tf_ops.serving_libraries())
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "libpython: absent" in done.stdout
    served = np.fromfile(tmp_path / "out.bin", np.float32).reshape(BATCH, 1)
    np.testing.assert_array_equal(served, expected)  # bit for bit


def test_keys_a_saved_dynamic_table_did_not_hold_read_its_default_row(server, tmp_path):
    """Unseen keys: the constant initializer's row (0.25) for one table, zeros for the table of
    random rows (random rows are a function of the key that the serving ops cannot recompute)."""
    model = DynamicModel()
    path = tmp_path / "model"
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})
    ids = np.random.default_rng(7).integers(0, ROWS, size=(BATCH, 3 * HOTNESS))
    ids[:, : 2 * HOTNESS] += 10 * ROWS  # the dynamic tables never held these
    done = serving_cpp.serve(server, path, ids, tmp_path, tf_ops.serving_libraries())
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    served = np.fromfile(tmp_path / "out.bin", np.float32).reshape(BATCH, 1)
    static = model.tables[2].numpy()[ids[:, 2 * HOTNESS :]].sum(axis=1)
    pooled = np.concatenate([np.full((BATCH, DIM), 0.25 * HOTNESS), np.zeros((BATCH, DIM)), static], axis=1)
    expected = 1.0 / (1.0 + np.exp(-(pooled @ model.kernel.numpy().astype(np.float64))))
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
    assert [table.storage.size() for table in model.tables[:2]] == [ROWS, ROWS]
