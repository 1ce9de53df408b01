"""``sok.DynamicVariable`` in a SavedModel (issue 39): ``tf.saved_model.save`` writes a serving copy
of each dynamic table its functions read (``serving_table``: sorted keys and rows, constants of the
saved functions, read by TensorFlow's own ops), loaded here in a fresh process that never imports
``sparse_operation_kit`` (only SOK's op library is loaded, as a C++ server does; the C++ server
itself is ``test_serving_cpp.py``); and what saving refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import communication, serving_table, tf_ops  # noqa: E402

DIM = 3

#: Loads a SavedModel with SOK's op library only and prints its functions' outputs as JSON.
LOADER = """
import json, sys
import tensorflow as tf
for library in sys.argv[3:]:
    tf.load_op_library(library)
model = tf.saved_model.load(sys.argv[1])
ids = tf.constant(json.loads(sys.stdin.read()), sys.argv[2])
bags = tf.RaggedTensor.from_row_lengths(ids, [2, 1, 0, 1])
print(json.dumps({
    "rows": model.rows(ids).numpy().tolist(),
    "pooled": model.pooled(bags).numpy().tolist(),
    "imported_sok": any(name.startswith("sparse_operation_kit") for name in sys.modules),
}))
"""


class Model(tf.Module):
    """One dynamic table read two ways: tf.nn.embedding_lookup and sok.lookup_sparse (mean)."""

    def __init__(self, table: sok.DynamicVariable) -> None:
        self.table = table
        spec = tf.TensorSpec([None], table.key_type)
        self.rows = tf.function(lambda ids: tf.nn.embedding_lookup(self.table, ids), input_signature=[spec])
        ragged = tf.RaggedTensorSpec([None, None], table.key_type, 1, tf.int64)
        self.pooled = tf.function(
            lambda bags: sok.lookup_sparse([self.table], [bags], combiners=["mean"])[0], input_signature=[ragged]
        )


def _table(key_type=tf.int64, initializer=None, name="t") -> sok.DynamicVariable:
    table = sok.DynamicVariable(dimension=DIM, key_type=key_type, initializer=initializer, name=name)
    keys = tf.constant([5, 9, 2], key_type)
    sok.assign(table, keys, tf.constant(np.arange(9, dtype=np.float32).reshape(3, DIM) + 1.0))
    return table


def _load_elsewhere(path: Path, ids: list[int], key_type: tf.DType) -> dict:
    """The saved functions' outputs from a fresh process that loads SOK's op library only (TensorFlow
    from where this process has it: a PYTHONPATH entry on the GPU host)."""
    command = [sys.executable, "-c", LOADER, str(path), key_type.name, *tf_ops.serving_libraries()]
    tensorflow_site = str(Path(tf.__file__).resolve().parents[1])
    env = {
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": tensorflow_site,
    }
    done = subprocess.run(command, input=json.dumps(ids), capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("key_type", [tf.int64, tf.int32, tf.uint64], ids=["int64", "int32", "uint64"])
def test_a_saved_table_serves_its_rows_and_the_default_row_elsewhere(tmp_path, key_type):
    table = _table(key_type, initializer=0.5, name=f"t_{key_type.name}")
    model = Model(table)
    path = tmp_path / "model"
    tf.saved_model.save(model, str(path))
    assert table.storage.size() == 3  # saving inserted nothing
    out = _load_elsewhere(path, [9, 2, 7, 5], key_type)  # 7: never held
    assert out["imported_sok"] is False
    np.testing.assert_array_equal(out["rows"], [[4, 5, 6], [7, 8, 9], [0.5] * DIM, [1, 2, 3]])
    # mean bags [9, 2], [7], [], [5]: the unseen key's default row is pooled like a row
    np.testing.assert_allclose(out["pooled"], [[5.5, 6.5, 7.5], [0.5] * DIM, [0, 0, 0], [1, 2, 3]])
    # the same bags from the live table, whose key 7 is the same default (constant initializer)
    live = sok.lookup_sparse([table], [tf.ragged.constant([[9, 2], [7], [], [5]], key_type)], combiners=["mean"])
    np.testing.assert_array_equal(out["pooled"], live[0].numpy())


def test_a_function_that_reads_and_evicts_serves_the_rows_and_evicts_nothing(tmp_path):
    """sok.sparse_read_and_evict in a saved function reads the serving copy (a hybrid table): its
    rows and the default row, no evicted row, nothing inserted; the live read still evicts."""
    table = sok.DynamicVariable(dimension=DIM, var_type="hybrid", initializer=0.25, name="evicting")
    sok.assign(table, tf.constant([5, 9], tf.int64), tf.constant([[1.0] * DIM, [2.0] * DIM]))
    module = tf.Module()
    module.table = table
    module.read = tf.function(
        lambda ids: sok.sparse_read_and_evict(module.table, ids), input_signature=[tf.TensorSpec([None], tf.int64)]
    )
    path = tmp_path / "model"
    tf.saved_model.save(module, str(path))
    assert table.storage.size() == 2
    loaded = tf.saved_model.load(str(path))
    rows, keys, values = loaded.read(tf.constant([9, 7, 5], tf.int64))
    np.testing.assert_array_equal(rows.numpy(), [[2.0] * DIM, [0.25] * DIM, [1.0] * DIM])
    assert keys.numpy().shape == (0,) and values.numpy().shape == (0, DIM)
    assert table.storage.size() == 2  # the SavedModel read its copy, not this live table


def test_a_table_of_random_rows_serves_zeros_for_keys_it_did_not_hold(tmp_path):
    model = Model(_table(name="random_rows"))
    path = tmp_path / "model"
    tf.saved_model.save(model, str(path))
    loaded = tf.saved_model.load(str(path))
    np.testing.assert_array_equal(loaded.rows(tf.constant([5, 11], tf.int64)).numpy(), [[1, 2, 3], [0, 0, 0]])
    assert loaded.rows(tf.constant([], tf.int64)).numpy().shape == (0, DIM)


def test_each_save_copies_the_rows_of_that_moment(tmp_path):
    table = _table(name="changing")
    tf.saved_model.save(Model(table), str(tmp_path / "first"))
    sok.assign(table, tf.constant([5, 40], tf.int64), tf.constant([[-1.0] * DIM, [8.0] * DIM]))
    tf.saved_model.save(Model(table), str(tmp_path / "second"))  # new tf.functions: traced anew
    ids = tf.constant([5, 40], tf.int64)
    loaded = [tf.saved_model.load(str(tmp_path / name)) for name in ("first", "second")]
    first, second = (model.rows(ids).numpy() for model in loaded)
    np.testing.assert_array_equal(first, [[1, 2, 3], [0, 0, 0]])
    np.testing.assert_array_equal(second, [[-1] * DIM, [8] * DIM])


def test_a_checkpoint_still_refuses_the_table(tmp_path):
    with pytest.raises(
        NotImplementedError, match=r"tf.train.Checkpoint is not supported by a sok.DynamicVariable.*sok.dump"
    ):
        tf.train.Checkpoint(table=_table(name="in_checkpoint")).save(str(tmp_path / "ckpt"))


def test_a_shard_of_several_ranks_is_refused_with_the_way_to_save_it(tmp_path, monkeypatch):
    model = Model(_table(name="sharded"))
    monkeypatch.setattr(communication, "num_ranks", lambda: 2)
    with pytest.raises(ValueError, match=r"saved for serving from 2 ranks.*sok.load it in one process"):
        tf.saved_model.save(model, str(tmp_path / "model"))


def test_a_copy_larger_than_a_saved_model_holds_is_refused_with_its_size(tmp_path, monkeypatch):
    model = Model(_table(name="large"))
    monkeypatch.setattr(serving_table, "MAX_COPY_BYTES", 16)
    with pytest.raises(ValueError, match=r"large holds 3 keys \(0\.00 GiB with their rows\), more than a SavedModel"):
        tf.saved_model.save(model, str(tmp_path / "model"))


def test_a_second_save_of_the_same_functions_is_refused(tmp_path):
    """TensorFlow reuses a function's trace for a later save: it would serve the first save's rows.
    Functions traced anew save while the earlier ones live on are refused too (they might be part of
    the save); once the earlier ones are gone, the save goes through."""
    table = _table(name="saved_twice")
    model = Model(table)
    tf.saved_model.save(model, str(tmp_path / "first"))
    sok.assign(table, tf.constant([5], tf.int64), tf.constant([[-1.0] * DIM]))
    with pytest.raises(ValueError, match=r"saved_twice:0: functions traced for an earlier SavedModel save still exist"):
        tf.saved_model.save(model, str(tmp_path / "second"))
    with pytest.raises(ValueError, match=r"functions traced for an earlier SavedModel save still exist"):
        tf.saved_model.save(Model(table), str(tmp_path / "third"))  # new functions, but model lives on
    del model
    tf.saved_model.save(Model(table), str(tmp_path / "fourth"))
    served = tf.saved_model.load(str(tmp_path / "fourth"))
    np.testing.assert_array_equal(served.rows(tf.constant([5], tf.int64)).numpy(), [[-1.0] * DIM])


def test_a_keras_model_with_sok_dynamic_embedding_exports(tmp_path):
    """Keras 3 ``model.export`` (new functions each time) of SOK's DynamicEmbedding layer."""
    keras = pytest.importorskip("keras")
    from sparse_operation_kit.layers import DynamicEmbedding

    embedding = DynamicEmbedding(DIM, initializer=0.5)
    inputs = keras.Input(shape=(), dtype="int64")
    model = keras.Model(inputs, keras.layers.Dense(1, kernel_initializer="ones")(embedding(inputs)))
    ids = tf.constant([5, 9], tf.int64)
    expected = model(ids).numpy()  # inserts 5 and 9 with the constant row
    model.export(str(tmp_path / "keras"))
    loaded = tf.saved_model.load(str(tmp_path / "keras"))
    served = loaded.serve(tf.constant([5, 9, 11], tf.int64)).numpy()
    np.testing.assert_array_equal(served[:2], expected)
    np.testing.assert_array_equal(served[2], [0.5 * DIM])  # 11: never held, the default row


def test_a_keras_model_exports_again_after_training(tmp_path):
    """model.export traces its own functions each time: a second export copies the later rows."""
    keras = pytest.importorskip("keras")
    from sparse_operation_kit.layers import DynamicEmbedding

    embedding = DynamicEmbedding(DIM, initializer=0.5)
    inputs = keras.Input(shape=(), dtype="int64")
    model = keras.Model(inputs, embedding(inputs))
    model(tf.constant([5], tf.int64))
    model.export(str(tmp_path / "first"))
    sok.assign(embedding.variables[0], tf.constant([5], tf.int64), tf.constant([[2.0] * DIM]))
    model.export(str(tmp_path / "second"))
    loaded = tf.saved_model.load(str(tmp_path / "second"))
    np.testing.assert_array_equal(loaded.serve(tf.constant([5], tf.int64)).numpy(), [[2.0] * DIM])


def test_an_empty_table_serves_its_default_row(tmp_path):
    table = sok.DynamicVariable(dimension=DIM, initializer=-2.0, name="empty")
    tf.saved_model.save(Model(table), str(tmp_path / "model"))
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    np.testing.assert_array_equal(loaded.rows(tf.constant([1, 2], tf.int64)).numpy(), [[-2.0] * DIM] * 2)
    assert loaded.rows(tf.constant([], tf.int64)).numpy().shape == (0, DIM)
    assert table.storage.size() == 0


def test_a_second_save_after_an_empty_one_is_refused(tmp_path):
    """The functions traced for an empty table's save hold its (empty) copy too: saving them again
    after rows arrive would serve defaults only."""
    table = sok.DynamicVariable(dimension=DIM, name="filled_later")
    model = Model(table)
    tf.saved_model.save(model, str(tmp_path / "empty"))
    sok.assign(table, tf.constant([3], tf.int64), tf.constant([[1.0] * DIM]))
    with pytest.raises(ValueError, match=r"functions traced for an earlier SavedModel save still exist"):
        tf.saved_model.save(model, str(tmp_path / "filled"))


def test_a_table_the_saved_object_does_not_track_is_refused(tmp_path):
    """A function that reads a table held by no attribute of the saved object: TensorFlow refuses
    it (the serving read names the variable), rather than saving a copy no later save would check."""
    table = _table(name="untracked")

    class Holder(tf.Module):
        @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64)])
        def pooled(self, bags):
            return sok.lookup_sparse([table], [bags], combiners=["sum"])[0]

    with pytest.raises(AssertionError, match=r"untracked"):
        tf.saved_model.save(Holder(), str(tmp_path / "model"))
