"""Messages of sok.lookup_sparse that name the argument at fault (one process): id dtypes, and
SparseTensor row indices outside [0, dense_shape[0]), eager and inside tf.function."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import communication  # noqa: E402


@pytest.fixture(autouse=True)
def single_process(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(communication, "_tool", communication.SingleProcess())


def _table():
    return sok.Variable(np.arange(17 * 3, dtype=np.float32).reshape(17, 3), dtype=tf.float32)


@pytest.mark.parametrize("dtype", [tf.uint8, tf.int16, tf.uint32])
def test_integer_ids_of_another_dtype_name_the_argument_and_the_cast(dtype):
    ids = tf.ragged.constant([[1, 2], [3]], dtype=dtype)
    with pytest.raises(TypeError) as caught:
        sok.lookup_sparse([_table(), _table()], [tf.ragged.constant([[1]], dtype=tf.int64)[:1], ids])
    message = str(caught.value)
    assert "sp_ids[1]" in message and f"dtype {dtype.name}" in message
    assert "int32 or int64" in message and "tf.cast(ids, tf.int64)" in message


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.string])
def test_non_integer_ids_name_the_argument_and_never_suggest_a_float_key_type(dtype):
    values = [["a", "b"], ["c"]] if dtype == tf.string else [[1.0, 2.0], [3.0]]
    ids = tf.ragged.constant(values, dtype=dtype)
    with pytest.raises(TypeError) as caught:
        sok.lookup_sparse([_table()], [ids])
    message = str(caught.value)
    assert "sp_ids[0]" in message and f"dtype {dtype.name}" in message and "int32 or int64" in message
    assert "key_type" not in message


def test_uint64_ids_are_valid_for_a_uint64_dynamic_table():
    v = sok.DynamicVariable(dimension=2, initializer="3", key_type=tf.uint64)
    out = sok.lookup_sparse([v], [tf.ragged.constant([[1, 2], [3]], dtype=tf.uint64)], combiners=["sum"])[0]
    np.testing.assert_array_equal(out.numpy(), [[6.0, 6.0], [3.0, 3.0]])


def _sparse(rows: list[int], nrows: int) -> tf.SparseTensor:
    seen: dict[int, int] = {}
    indices = []
    for r in rows:  # column = position of the id in its sample
        indices.append([r, seen.get(r, 0)])
        seen[r] = seen.get(r, 0) + 1
    return tf.SparseTensor(indices, tf.constant([1] * len(rows), tf.int64), [nrows, len(rows)])


@pytest.mark.parametrize("rows, bad", [([0, -1, 1], -1), ([0, 1, 4], 4)])
def test_sparse_row_index_outside_the_batch_is_a_value_error_naming_the_argument(rows, bad):
    with pytest.raises(ValueError) as caught:
        sok.lookup_sparse([_table(), _table()], [_sparse([0, 1], 4), _sparse(rows, 4)])
    message = str(caught.value)
    assert "sp_ids[1]" in message and f"row index {bad}" in message and "[0, 4)" in message


def test_sparse_row_index_outside_the_batch_in_tf_function_is_a_clear_assert():
    table = _table()
    spec = tf.SparseTensorSpec([None, None], tf.int64)
    lookup = tf.function(lambda ids: sok.lookup_sparse([table], [ids])[0], input_signature=[spec])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"sp_ids\[0\] has row indices outside \[0, dense_shape"):
        lookup(_sparse([0, 5], 2))
    # valid ids still work, and equal TensorFlow's own lookup
    good = _sparse([0, 1, 1], 2)
    want = tf.nn.embedding_lookup_sparse(tf.constant(table.numpy()), good, None, combiner="mean")
    np.testing.assert_allclose(lookup(good).numpy(), want.numpy())


def test_sparse_weights_rows_are_checked_too():
    ids = _sparse([0, 1], 2)
    weights = tf.SparseTensor([[0, 0], [-1, 1]], tf.constant([1.0, 1.0]), [2, 2])
    with pytest.raises(ValueError, match=r"sp_weights\[0\] has row index -1"):
        sok.lookup_sparse([_table()], [ids], sp_weights=[weights])


def test_pooled_rows_beyond_horovods_int32_counts_are_refused_not_wrapped():
    """Horovod's all-to-all counts are int32: a rank's pooled rows of more floats than that (a batch
    of 2**21 samples over tables of total width 1024, say) would wrap around, so the exchange
    refuses them, naming the count; counts that fit come back as int32, unchanged."""
    from sparse_operation_kit.lookup.exchange import INT32_MAX, int32_counts

    fits = int32_counts(tf.constant([INT32_MAX - 5, 5], tf.int64), "the pooled rows this rank sends")
    assert fits.dtype == tf.int32 and fits.numpy().tolist() == [INT32_MAX - 5, 5]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"the pooled rows this rank sends are 2147483648 values"):
        int32_counts(tf.constant([2**30, 2**30], tf.int64), "the pooled rows this rank sends")

    @tf.function
    def in_a_graph(counts: tf.Tensor) -> tf.Tensor:
        return int32_counts(counts, "the pooled rows this rank receives")

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"receives are 3221225472 values.*at most 2147483647"):
        in_a_graph(tf.constant([2**31, 2**30], tf.int64))
