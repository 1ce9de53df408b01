"""The DEVICE_GPU kernels of the training path's ops against their CPU kernels, bit for bit.

SokUniqueIndex and SokUniqueSum run on the same keys and values on /CPU:0 and /GPU:0.
SokLookupDistinct and SokSparseApply run on two tables with the same rows, one CPU storage and one
CUDA storage of the same backend (``hbm``, and ``hybrid`` where hkv is built with CUDA); the rows
exported from both afterwards must be equal, but where a key has more than ``HOT`` gradient rows:
SokSparseApply sums those in a fixed parallel order on the GPU, so its rows are then close to the
CPU's (within the rounding of the sums) and the same bits run after run. Soft device placement is
off, so an op that lacks a GPU kernel fails instead of running on the CPU.

Skipped unless TensorFlow sees a GPU and sok-core's GPU kernels were built (``ci/gpu_test.sh``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")  # leave GPU memory to the CUDA tables

tf = pytest.importorskip("tensorflow")

from sparse_operation_kit import initializers as inits  # noqa: E402
from sparse_operation_kit import tf_ops  # noqa: E402
from sparse_operation_kit.storage import Storage, create_storage  # noqa: E402
from sparse_operation_kit.table_ref import TableRef  # noqa: E402
from sparse_operation_kit.testing.device import cuda_skip_reason, skip_unless_gpu_tensorflow  # noqa: E402

pytestmark = pytest.mark.gpu

CPU, GPU = "/CPU:0", "/GPU:0"
KEY_DTYPES = ("int64", "int32", "uint64")
# kHotOccurrences of gpu/sparse_apply_kernels.cu: keys with more gradient rows are summed in parallel.
HOT = 32
#: The native module of each backend's var_type, for cuda_skip_reason.
BACKEND_CORES = {"hbm": "sok_backend_det._core", "hybrid": "sok_backend_hkv._core"}


@pytest.fixture(autouse=True)
def gpu_tensorflow() -> Iterator[None]:
    """Skips without a GPU or GPU kernels; runs the test with soft device placement off."""
    skip_unless_gpu_tensorflow()
    soft = tf.config.get_soft_device_placement()
    tf.config.set_soft_device_placement(False)
    try:
        yield
    finally:
        tf.config.set_soft_device_placement(soft)


def _bits(array: np.ndarray) -> np.ndarray:
    """The bits of a float32 array, so that equality is bitwise (-0.0 != 0.0, NaN == same NaN)."""
    return np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)


def _assert_same_bits(cpu: np.ndarray, gpu: np.ndarray) -> None:
    assert cpu.shape == gpu.shape
    np.testing.assert_array_equal(_bits(gpu), _bits(cpu))


def _assert_close(cpu: np.ndarray, gpu: np.ndarray) -> None:
    """Equal within the rounding of sums taken in another order: an error that scales with the
    partial sums (up to the largest value), not with each result, hence atol from the largest."""
    assert cpu.shape == gpu.shape
    atol = 1e-6 + 1e-4 * float(np.abs(cpu).max(initial=0.0))
    np.testing.assert_allclose(gpu, cpu, rtol=1e-5, atol=atol)


def _has_hot_keys(keys: np.ndarray) -> bool:
    """Whether a key has more than HOT gradient rows (they are then summed in parallel)."""
    return keys.size > 0 and int(np.unique(keys, return_counts=True)[1].max()) > HOT


def _on_gpu(tensor: Any) -> None:
    assert "GPU" in tensor.device.upper(), f"ran on {tensor.device}, not on the GPU"


# -- keys ---------------------------------------------------------------------------------------
def _extremes(dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    values = [info.max, info.min, 0, 1, info.max, info.max - 1, 0, info.min, info.max // 2 + 1, info.min]
    if info.min < 0:
        values += [-1, -1, -2]
    return np.array(values, dtype=dtype)


def _power_law(dtype: str, n: int = 100_000, seed: int = 7) -> np.ndarray:
    """n keys with a power-law frequency (a few hot keys, a long tail), spread over every bit."""
    ranks = np.random.default_rng(seed).zipf(1.2, n).astype(np.uint64)
    spread = ranks * np.uint64(0x9E3779B97F4A7C15)  # wraps: every bit, signs included after the view
    return spread.view(np.int64).astype(dtype) if dtype == "int32" else spread.view(dtype)


def _keys(case: str, dtype: str) -> np.ndarray:
    if case == "duplicates":
        return np.array([5, 3, 5, 5, 7, 3, 0, 9, 7, 5, 1, 0], dtype=dtype)
    if case == "extremes":
        return _extremes(dtype)
    if case == "empty":
        return np.zeros(0, dtype=dtype)
    if case == "one":
        return np.array([42], dtype=dtype)
    if case == "all_distinct":
        return np.arange(1000, 0, -1).astype(dtype)
    return _power_law(dtype)


KEY_CASES = ("duplicates", "extremes", "empty", "one", "all_distinct", "power_law")


def _values(n: int, w: int, seed: int = 3) -> np.ndarray:
    """Rows whose magnitudes differ widely, so that the order of the sums shows in their bits."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, w)) * 10.0 ** rng.uniform(-4, 4, (n, 1))).astype(np.float32)


# -- SokUniqueIndex, SokUniqueSum ----------------------------------------------------------------
@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("case", KEY_CASES)
def test_unique_index_on_gpu_equals_cpu(dtype: str, case: str) -> None:
    keys = _keys(case, dtype)
    lib = tf_ops.library()
    with tf.device(CPU):
        cpu_distinct, cpu_positions = lib.sok_unique_index(tf.constant(keys))
    with tf.device(GPU):
        gpu_distinct, gpu_positions = lib.sok_unique_index(tf.constant(keys))
    _on_gpu(gpu_distinct)
    _on_gpu(gpu_positions)
    np.testing.assert_array_equal(gpu_distinct.numpy(), cpu_distinct.numpy())
    np.testing.assert_array_equal(gpu_positions.numpy(), cpu_positions.numpy())
    assert gpu_distinct.dtype == tf.as_dtype(dtype) and gpu_positions.dtype == tf.int32


def test_unique_index_on_gpu_takes_keys_of_any_shape() -> None:
    keys = _keys("duplicates", "int64").reshape(3, 4)
    lib = tf_ops.library()
    with tf.device(CPU):
        cpu = lib.sok_unique_index(tf.constant(keys))
    with tf.device(GPU):
        gpu = lib.sok_unique_index(tf.constant(keys))
    for c, g in zip(cpu, gpu, strict=True):
        np.testing.assert_array_equal(g.numpy(), c.numpy())


@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("case", KEY_CASES)
def test_unique_sum_on_gpu_equals_cpu(dtype: str, case: str) -> None:
    keys = _keys(case, dtype)
    values = _values(len(keys), 16)
    lib = tf_ops.library()
    with tf.device(CPU):
        cpu_unique, cpu_sums = lib.sok_unique_sum(tf.constant(keys), tf.constant(values))
    with tf.device(GPU):
        gpu_unique, gpu_sums = lib.sok_unique_sum(tf.constant(keys), tf.constant(values))
    _on_gpu(gpu_sums)
    np.testing.assert_array_equal(gpu_unique.numpy(), cpu_unique.numpy())
    _assert_same_bits(cpu_sums.numpy(), gpu_sums.numpy())


@pytest.mark.parametrize("w", [0, 1, 3, 130])
def test_unique_sum_on_gpu_equals_cpu_for_any_width(w: int) -> None:
    keys = _power_law("int64", n=5000)
    values = _values(len(keys), w)
    lib = tf_ops.library()
    with tf.device(CPU):
        cpu = lib.sok_unique_sum(tf.constant(keys), tf.constant(values))
    with tf.device(GPU):
        gpu = lib.sok_unique_sum(tf.constant(keys), tf.constant(values))
    np.testing.assert_array_equal(gpu[0].numpy(), cpu[0].numpy())
    _assert_same_bits(cpu[1].numpy(), gpu[1].numpy())


def test_unique_sum_on_gpu_refuses_values_of_the_wrong_shape() -> None:
    with tf.device(GPU), pytest.raises(tf.errors.InvalidArgumentError, match=r"values must have shape \[4, width\]"):
        tf_ops.library().sok_unique_sum(tf.constant([1, 2, 3, 4], tf.int64), tf.zeros([3, 2]))


# -- tables ---------------------------------------------------------------------------------------
class Tables:
    """One CPU and one CUDA storage of a backend with the same rows, and the ops' inputs for each."""

    def __init__(self, backend: str, row_width: int, key_dtype: str, initializers: list[inits.Initializer]) -> None:
        self.key_dtype = key_dtype
        self.storages: dict[str, Storage] = {}
        self.refs: dict[str, TableRef] = {}
        self.inputs: dict[str, tuple[tf.Tensor, tf.Tensor]] = {}
        for device, where in ((CPU, "cpu"), (GPU, "cuda:0")):
            storage = create_storage(
                backend, row_width=row_width, key_dtype=key_dtype, initializer=initializers, device=where
            )
            ref = TableRef(storage)
            with tf.device(device):
                handle = tf.Variable(0.0, name="handle").handle  # never read: orders and places the ops
            self.storages[device], self.refs[device] = storage, ref
            self.inputs[device] = (handle, tf.constant(ref.address, tf.int64))

    def insert(self, keys: np.ndarray, rows: np.ndarray) -> None:
        for storage in self.storages.values():
            storage.insert_or_assign(keys, rows)
        _synchronize()

    def rows(self, device: str) -> tuple[np.ndarray, np.ndarray]:
        """(keys, rows) of every row of the table on `device`, sorted by key."""
        _synchronize()
        keys, values, _ = self.storages[device].export()
        order = np.argsort(keys, kind="stable")
        return keys[order], values[order]

    def assert_same_rows(self, hot: bool = False) -> None:
        """The same keys; rows of the same bits, or close ones after sums of hot keys."""
        cpu_keys, cpu_rows = self.rows(CPU)
        gpu_keys, gpu_rows = self.rows(GPU)
        np.testing.assert_array_equal(gpu_keys, cpu_keys)
        if hot:
            _assert_close(cpu_rows, gpu_rows)
        else:
            _assert_same_bits(cpu_rows, gpu_rows)


def _synchronize() -> None:
    """Waits for TF's GPU streams and CuPy's: the ops and the storages' Python calls use different
    streams of the same device."""
    tf.test.experimental.sync_devices()
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


@pytest.fixture(params=sorted(BACKEND_CORES))
def backend(request: pytest.FixtureRequest) -> str:
    core = pytest.importorskip(BACKEND_CORES[request.param])
    if (reason := cuda_skip_reason(core)) is not None:
        pytest.skip(reason)
    return request.param


def _index(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """distinct keys and positions of the flattened keys (SokUniqueIndex on the CPU)."""
    with tf.device(CPU):
        distinct, positions = tf_ops.library().sok_unique_index(tf.constant(keys.reshape(-1)))
    return distinct.numpy(), positions.numpy()


def test_find_or_insert_fills_new_rows_alike_on_both_devices(backend: str) -> None:
    """The premise of the table tests: new rows are the same on the CPU and the CUDA table."""
    tables = Tables(backend, 6, "int64", [inits.uniform(-0.5, 0.5, seed=11)])
    keys = _keys("extremes", "int64")
    for device in (CPU, GPU):
        with tf.device(device):
            tf_ops.library().sok_find_or_insert(*tables.inputs[device], tf.constant(keys), col_begin=0, col_end=6)
    tables.assert_same_rows()


# -- SokLookupDistinct ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", KEY_DTYPES)
@pytest.mark.parametrize("columns", [(0, 8), (2, 5)])
def test_lookup_distinct_on_gpu_equals_cpu(backend: str, dtype: str, columns: tuple[int, int]) -> None:
    tables = Tables(backend, 8, dtype, [inits.uniform(-1.0, 1.0, seed=5)])
    known = _keys("extremes", dtype)[:5]
    tables.insert(known, _values(len(known), 8))
    keys = np.concatenate([known, _keys("duplicates", dtype), known[::-1]]).reshape(-1, 2)  # known, new, repeated
    distinct, positions = _index(keys)
    begin, end = columns
    out = {}
    for device in (CPU, GPU):
        with tf.device(device):
            out[device] = tf_ops.library().sok_lookup_distinct(
                *tables.inputs[device],
                tf.constant(keys),
                tf.constant(distinct),
                tf.constant(positions),
                col_begin=begin,
                col_end=end,
            )
    _on_gpu(out[GPU])
    assert out[GPU].shape == (*keys.shape, end - begin)
    _assert_same_bits(out[CPU].numpy(), out[GPU].numpy())
    tables.assert_same_rows()


def test_lookup_distinct_on_gpu_of_no_keys(backend: str) -> None:
    tables = Tables(backend, 4, "int64", [inits.constant(0.5)])
    empty = np.zeros((0, 3), np.int64)
    with tf.device(GPU):
        values = tf_ops.library().sok_lookup_distinct(
            *tables.inputs[GPU],
            tf.constant(empty),
            tf.constant(empty.reshape(-1)),
            tf.zeros([0], tf.int32),
            col_begin=0,
            col_end=4,
        )
    assert values.shape == (0, 3, 4)


# -- SokSparseApply -------------------------------------------------------------------------------
RULES = [
    ("sgd", []),
    ("momentum", [0.9, 0.0]),
    ("momentum", [0.9, 1.0]),
    ("adagrad", [0.1, 0.0]),
    ("adagrad", [1e-7, 1.0]),
    ("rowwise_adagrad", [1e-8]),
]
#: The state of each rule after the embedding, in floats for an embedding of d (sparse_rules.h).
STATE = {"sgd": lambda d: 0, "rowwise_adagrad": lambda d: 1}


def _rule_tables(backend: str, rule: str, d: int, key_dtype: str = "int64") -> Tables:
    """Tables of rows [embedding | state]: random embeddings, a positive state (adagrad's
    accumulator starts at 0.1; momentum's at 0.1 too, so that it shows)."""
    state = STATE.get(rule, lambda d: d)(d)
    initializers = [inits.uniform(-1.0, 1.0, seed=17, columns=(0, d))]
    if state:
        initializers.append(inits.constant(0.1, columns=(d, d + state)))
    return Tables(backend, d + state, key_dtype, initializers)


def _apply(tables: Tables, keys: np.ndarray, grads: np.ndarray, lr: float, rule: str, hyper: list[float]) -> None:
    distinct, positions = _index(keys)
    for device in (CPU, GPU):
        with tf.device(device):
            tf_ops.library().sok_sparse_apply(
                *tables.inputs[device],
                tf.constant(distinct),
                tf.constant(positions),
                tf.constant(grads),
                tf.constant(lr, tf.float32),
                rule=rule,
                hyper=hyper,
            )


@pytest.mark.parametrize(("rule", "hyper"), RULES, ids=[f"{r}-{h}" for r, h in RULES])
def test_sparse_apply_on_gpu_equals_cpu(backend: str, rule: str, hyper: list[float]) -> None:
    d = 8
    tables = _rule_tables(backend, rule, d)
    known = np.arange(0, 200, 2, dtype=np.int64)
    rows = _values(len(known), tables.storages[CPU].row_width, seed=9)
    if rule in ("adagrad", "rowwise_adagrad"):
        rows[:, d:] = np.abs(rows[:, d:])  # a non-negative accumulator
    tables.insert(known, rows)
    # The row-wise mean adds a row's squares in another order on the GPU (a warp's tree): close rows.
    hot = rule == "rowwise_adagrad"
    for step in range(3):  # duplicates, known keys and new ones (odd keys, and keys past 200)
        keys = _power_law("int64", n=4000, seed=step) % 400
        grads = _values(len(keys), d, seed=100 + step)
        _apply(tables, keys, grads, 0.05, rule, hyper)
        hot = hot or _has_hot_keys(keys)  # a close row stays close, not equal, in later steps
        tables.assert_same_rows(hot)


@pytest.mark.parametrize("dtype", KEY_DTYPES)
def test_sparse_apply_on_gpu_equals_cpu_for_every_key_dtype(backend: str, dtype: str) -> None:
    tables = _rule_tables(backend, "adagrad", 4, dtype)
    keys = np.concatenate([_keys("extremes", dtype), _keys("duplicates", dtype)])
    assert not _has_hot_keys(keys)
    _apply(tables, keys, _values(len(keys), 4), 0.5, "adagrad", [0.1, 1.0])
    tables.assert_same_rows()


def test_sparse_apply_on_gpu_of_one_key_repeated_many_times(backend: str) -> None:
    """A hot key: its thousands of gradient rows are summed in a fixed parallel order."""
    tables = _rule_tables(backend, "sgd", 16)
    keys = np.full(50_000, 7, np.int64)
    keys[::1000] = np.arange(50)
    _apply(tables, keys, _values(len(keys), 16), 0.01, "sgd", [])
    tables.assert_same_rows(hot=True)


def test_sparse_apply_on_gpu_of_keys_at_most_hot_times_equals_cpu_to_the_bit(backend: str) -> None:
    """Every key with at most HOT gradient rows: each sum is the CPU's, in batch order."""
    tables = _rule_tables(backend, "momentum", 8)
    keys = np.repeat(np.arange(100, dtype=np.int64), HOT)[np.random.default_rng(4).permutation(100 * HOT)]
    assert not _has_hot_keys(keys)
    _apply(tables, keys, _values(len(keys), 8), 0.05, "momentum", [0.9, 1.0])
    tables.assert_same_rows()


@pytest.mark.parametrize(("rule", "hyper"), [("sgd", []), ("adagrad", [0.1, 0.0]), ("rowwise_adagrad", [1e-8])])
@pytest.mark.parametrize("d", [32, 128])
def test_sparse_apply_on_gpu_of_a_very_hot_key_is_close_and_deterministic(
    backend: str, rule: str, hyper: list[float], d: int
) -> None:
    """200k gradient rows of one key among others: the GPU's rows are close to the CPU's, and two
    tables of the same rows stepped alike on the GPU end with the same bits."""
    rng = np.random.default_rng(12)
    keys = rng.integers(0, 3000, 260_000).astype(np.int64)
    keys[rng.permutation(keys.size)[:200_000]] = 1234
    grads = rng.standard_normal((keys.size, d)).astype(np.float32)
    first, second = _rule_tables(backend, rule, d), _rule_tables(backend, rule, d)
    for tables in (first, second):
        _apply(tables, keys, grads, 0.01, rule, hyper)
        tables.assert_same_rows(hot=True)
    first_keys, first_rows = first.rows(GPU)
    second_keys, second_rows = second.rows(GPU)
    np.testing.assert_array_equal(second_keys, first_keys)
    _assert_same_bits(first_rows, second_rows)


def test_sparse_apply_on_gpu_of_no_gradients_still_steps_the_distinct_rows(backend: str) -> None:
    """As on the CPU: distinct keys without gradient rows take a step with a zero gradient."""
    tables = _rule_tables(backend, "momentum", 4)
    tables.insert(np.array([1, 2], np.int64), _values(2, 8))
    for device in (CPU, GPU):
        with tf.device(device):
            tf_ops.library().sok_sparse_apply(
                *tables.inputs[device],
                tf.constant([1, 2], tf.int64),
                tf.zeros([0], tf.int32),
                tf.zeros([0, 4]),
                tf.constant(0.1),
                rule="momentum",
                hyper=[0.9, 0.0],
            )
    tables.assert_same_rows()


# -- errors ---------------------------------------------------------------------------------------
def _bad_positions_call(op: str, tables: Tables, device: str) -> None:
    lib = tf_ops.library()
    keys = tf.constant([4, 5, 4, 6], tf.int64)
    distinct = tf.constant([4, 5, 6], tf.int64)
    positions = tf.constant([0, 1, 3, -1], tf.int32)  # 3 and -1 are no rows of 3 distinct keys
    with tf.device(device):
        if op == "lookup":
            lib.sok_lookup_distinct(*tables.inputs[device], keys, distinct, positions, col_begin=0, col_end=4)
        else:
            lib.sok_sparse_apply(
                *tables.inputs[device], distinct, positions, tf.ones([4, 4]), tf.constant(0.1), rule="sgd", hyper=[]
            )


@pytest.mark.parametrize("op", ["lookup", "apply"])
def test_bad_positions_are_refused_on_gpu_as_on_cpu_and_change_no_row(backend: str, op: str) -> None:
    tables = _rule_tables(backend, "sgd", 4)
    message = r"positions\[2\] = 3 is not a row of the 3 distinct keys; valid: 0 \.\. 2 \(from SokUniqueIndex\)"
    for device in (CPU, GPU):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            _bad_positions_call(op, tables, device)
    assert tables.storages[GPU].size() == 0
    assert tables.storages[CPU].size() == 0


def test_sparse_apply_on_gpu_refuses_a_table_too_narrow_for_the_rule(backend: str) -> None:
    tables = _rule_tables(backend, "sgd", 4)  # rows of 4: no room for momentum's state
    with tf.device(GPU), pytest.raises(tf.errors.InvalidArgumentError, match="need table rows of 8 floats"):
        tf_ops.library().sok_sparse_apply(
            *tables.inputs[GPU],
            tf.constant([1], tf.int64),
            tf.constant([0], tf.int32),
            tf.ones([1, 4]),
            tf.constant(0.1),
            rule="momentum",
            hyper=[0.9, 0.0],
        )
