"""device_ops against the TensorFlow ops they stand in for (which run on the host under a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from sparse_operation_kit import device_ops


@pytest.mark.parametrize("lengths", [[2, 0, 3, 1], [0, 0, 0], [], [5], [0, 4, 0]])
@pytest.mark.parametrize("split_dtype", [tf.int32, tf.int64])
def test_sample_ids_are_value_rowids(lengths: list[int], split_dtype: tf.DType) -> None:
    values = tf.range(sum(lengths), dtype=tf.int64) * 7
    ragged = tf.RaggedTensor.from_row_lengths(values, tf.constant(lengths, tf.int64), validate=True)
    splits = tf.cast(ragged.row_splits, split_dtype)
    got = device_ops.sample_ids(splits, ragged.values)
    assert got.dtype == tf.int64
    np.testing.assert_array_equal(got.numpy(), ragged.value_rowids().numpy())


def test_sample_ids_in_a_function_with_unknown_sizes() -> None:
    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64)])
    def rows(splits: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        return device_ops.sample_ids(splits, values)

    lengths = np.random.default_rng(3).integers(0, 5, size=200)
    ragged = tf.RaggedTensor.from_row_lengths(tf.zeros([int(lengths.sum())], tf.int64), lengths)
    np.testing.assert_array_equal(rows(ragged.row_splits, ragged.values).numpy(), ragged.value_rowids().numpy())


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8])
def test_floormod_is_tf_floormod(n: int) -> None:
    edges = [0, 1, -1, n - 1, -n, n, 2**62, -(2**62), 2**63 - 1, -(2**63), 2**63 - n]
    random = np.random.default_rng(n).integers(-(2**63), 2**63 - 1, size=1000, dtype=np.int64)
    ids = tf.constant(np.concatenate([np.array(edges, np.int64), random]))
    got = device_ops.floormod(ids, n)
    np.testing.assert_array_equal(got.numpy(), tf.math.floormod(ids, tf.constant(n, tf.int64)).numpy())
    assert got.numpy().min() >= 0 and got.numpy().max() < n


@pytest.mark.parametrize("size", [0, 1, 5])
def test_length_is_the_number_of_values_as_int64(size: int) -> None:
    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def count(values: tf.Tensor) -> tf.Tensor:
        return device_ops.length(values)

    got = count(tf.zeros([size, 3]))
    assert got.dtype == tf.int64 and int(got) == size
    assert int(device_ops.length(tf.zeros([size, 3]))) == size


DEVICES = ["/CPU:0", pytest.param("/GPU:0", marks=pytest.mark.gpu)]


def _on(device: str) -> str:
    if device.startswith("/GPU") and not tf.config.list_logical_devices("GPU"):
        pytest.skip("no GPU")
    return device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "lengths", [[[2, 0, 3], [1, 1, 0], [0, 0, 4]], [[0, 0], [0, 0]], [[], []], [[5]], [[0], [3], [0]]]
)
def test_sample_ids_of_tables_are_their_sample_ids_one_after_the_other(device: str, lengths: list) -> None:
    tables = [
        tf.RaggedTensor.from_row_lengths(tf.range(sum(r), dtype=tf.int64), tf.constant(r, tf.int64)) for r in lengths
    ]
    with tf.device(_on(device)):
        got = device_ops.sample_ids_of([t.row_splits for t in tables], [t.values for t in tables])
    want = np.concatenate([t.value_rowids().numpy() for t in tables]).astype(np.int64)
    assert got.dtype == tf.int64
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_groups", [1, 2, 3, 26, 1000])
def test_group_by_key_is_a_stable_argsort_and_a_bincount(device: str, num_groups: int) -> None:
    keys = np.random.default_rng(num_groups).integers(0, num_groups, size=5000).astype(np.int64)
    with tf.device(_on(device)):
        order, counts = device_ops.group_by_key(tf.constant(keys), num_groups)
    np.testing.assert_array_equal(order.numpy(), np.argsort(keys, kind="stable"))
    np.testing.assert_array_equal(counts.numpy(), np.bincount(keys, minlength=num_groups))


@pytest.mark.parametrize("device", DEVICES)
def test_group_by_key_of_no_keys(device: str) -> None:
    with tf.device(_on(device)):
        order, counts = device_ops.group_by_key(tf.zeros([0], tf.int64), 3)
    assert order.numpy().tolist() == [] and counts.numpy().tolist() == [0, 0, 0]


def test_group_by_key_refuses_a_key_outside_the_groups_on_the_cpu() -> None:
    with tf.device("/CPU:0"), pytest.raises(tf.errors.InvalidArgumentError, match=r"keys\[1\] = 3 is outside \[0, 3\)"):
        device_ops.group_by_key(tf.constant([0, 3], tf.int64), 3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lengths", [[3, 0, 2], [0, 0], [5], [0, 4, 0, 1]])
def test_part_of_each_names_the_tensor_each_element_comes_from(device: str, lengths: list[int]) -> None:
    values = [tf.zeros([k], tf.int64) for k in lengths]
    with tf.device(_on(device)):
        got = device_ops.part_of_each(values)
    assert got.dtype == tf.int64
    np.testing.assert_array_equal(got.numpy(), np.repeat(np.arange(len(lengths)), lengths))


def _unique_cases() -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    return [
        np.array([5, 3, 5, 5, 7, 3, 0, 9], np.int64),
        np.zeros(0, np.int64),
        np.array([2**63 - 1, -(2**63), -1, 2**63 - 1], np.int64),
        rng.zipf(1.2, 5000).astype(np.int32),
        np.array([2**64 - 1, 0, 2**64 - 1], np.uint64),
        np.arange(300, 0, -1).astype(np.int64),
    ]


def _assert_unique_index(keys: np.ndarray, distinct: tf.Tensor, positions: tf.Tensor) -> None:
    first = np.sort(np.unique(keys, return_index=True)[1])  # first occurrences, in batch order
    row = {key: i for i, key in enumerate(keys[first].tolist())}
    assert distinct.dtype == tf.as_dtype(keys.dtype) and positions.dtype == tf.int32
    np.testing.assert_array_equal(distinct.numpy(), keys[first])
    np.testing.assert_array_equal(positions.numpy(), np.array([row[x] for x in keys.tolist()], np.int32))


@pytest.mark.parametrize("device", DEVICES)
def test_unique_index_list_is_tf_unique_of_each_tensor(device: str) -> None:
    keys = _unique_cases()
    with tf.device(_on(device)):
        distinct, positions = device_ops.unique_index_list([tf.constant(k) for k in keys])
    assert len(distinct) == len(positions) == len(keys)
    for k, d, p in zip(keys, distinct, positions, strict=True):
        assert ("GPU" in d.device) == device.startswith("/GPU")
        _assert_unique_index(k, d, p)


@pytest.mark.parametrize("device", DEVICES)
def test_unique_index_list_of_many_tables_that_share_keys(device: str) -> None:
    # more tables than one GPU launch takes (64), empty ones among them, the same keys in several
    # tables and key types: each table is indexed on its own
    rng = np.random.default_rng(5)
    types = [np.int64, np.int32, np.uint64]
    keys = [
        np.zeros(0, types[t % 3]) if t % 7 == 3 else rng.integers(0, 40, rng.integers(1, 300)).astype(types[t % 3])
        for t in range(150)
    ]
    keys[10] = np.array([-1, -(2**31), 2**31 - 1, -1], np.int32)
    with tf.device(_on(device)):
        distinct, positions = device_ops.unique_index_list([tf.constant(k) for k in keys])
    for k, d, p in zip(keys, distinct, positions, strict=True):
        _assert_unique_index(k, d, p)


def test_unique_index_list_in_a_function_with_unknown_sizes() -> None:
    spec = [tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int32)]

    @tf.function(input_signature=spec)
    def index(a: tf.Tensor, b: tf.Tensor) -> tuple:
        return device_ops.unique_index_list([a, b])

    (da, db), (pa, pb) = index(tf.constant([4, 4, 1], tf.int64), tf.constant([9], tf.int32))
    assert da.numpy().tolist() == [4, 1] and pa.numpy().tolist() == [0, 0, 1]
    assert db.numpy().tolist() == [9] and pb.numpy().tolist() == [0]


def test_unique_index_list_refuses_attrs_that_disagree() -> None:
    from sparse_operation_kit import tf_ops

    with pytest.raises(tf.errors.InvalidArgumentError, match="num_tables = 2 but 1 key tensors"):
        tf_ops.library().sok_unique_index_list(keys=[tf.constant([1], tf.int64)], num_tables=2)


def test_lengths_of_tensors_of_several_dtypes_in_their_order() -> None:
    values = [tf.zeros([3], tf.int64), tf.zeros([0], tf.int32), tf.zeros([5], tf.int64), tf.zeros([2], tf.float32)]
    got = device_ops.lengths(values)
    assert got.dtype == tf.int64 and got.numpy().tolist() == [3, 0, 5, 2]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int32)])
    def lengths(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        return device_ops.lengths([a, b, a])

    assert lengths(tf.zeros([4], tf.int64), tf.zeros([1], tf.int32)).numpy().tolist() == [4, 1, 4]
