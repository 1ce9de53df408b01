"""sok.DynamicVariable under a CUDA TensorFlow: where its table lives, training on the GPU against
the same training on the CPU, checkpoints between the two, and no host round trip inside a step.

Skipped without a GPU visible to a CUDA TensorFlow and sok-core's GPU kernels (ci/gpu_test.sh --tf
runs them on the GPU host).
"""

from __future__ import annotations

import glob
import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import initializers  # noqa: E402
from sparse_operation_kit.testing.device import skip_unless_gpu_tensorflow  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def gpu_tensorflow() -> None:
    skip_unless_gpu_tensorflow()


K = tf.keras.optimizers
SAME_ROWS = initializers.uniform(-0.05, 0.05, 1234)
VAR_TYPES = {"hbm": {}, "hybrid": {"init_capacity": 1 << 14, "max_capacity": 1 << 16}}
OPTIMIZERS = {
    "SGD": lambda: K.SGD(learning_rate=0.1),
    "SGD-nesterov": lambda: K.SGD(learning_rate=0.1, momentum=0.9, nesterov=True),
    "Adagrad": lambda: K.Adagrad(learning_rate=0.1),
    "Adam": lambda: K.Adam(learning_rate=0.05),
    "Adamax": lambda: K.Adamax(learning_rate=0.05),
    "Adadelta": lambda: K.Adadelta(learning_rate=1.0),
    "Ftrl": lambda: K.Ftrl(learning_rate=0.1),
    "RMSprop": lambda: K.RMSprop(learning_rate=0.01),
}


def make(device: str, var_type: str = "hbm", dimension: int = 8, **kwargs) -> sok.DynamicVariable:
    """A table on ``device`` whose new rows are the same on every device (one initializer seed)."""
    with tf.device(device):
        return sok.DynamicVariable(
            dimension=dimension, var_type=var_type, initializer=SAME_ROWS, **VAR_TYPES[var_type], **kwargs
        )


def exported(var) -> tuple[np.ndarray, np.ndarray]:
    keys, values = (t.numpy() for t in sok.export(var))
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]


def batches(count: int = 4, n: int = 512, vocab: int = 300, seed: int = 0) -> list[tf.Tensor]:
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.zipf(1.3, n) % vocab, tf.int64) for _ in range(count)]


@pytest.mark.parametrize("var_type", list(VAR_TYPES))
def test_table_lives_on_the_gpu_by_default_and_where_tf_device_says(var_type):
    default = sok.DynamicVariable(dimension=4, var_type=var_type, **VAR_TYPES[var_type])
    assert default.storage.device == "cuda:0"
    assert "GPU:0" in default.handle.device and "device='cuda:0'" in repr(default)
    on_cpu = make("/CPU:0", var_type, dimension=4)
    assert on_cpu.storage.device == "cpu" and "CPU:0" in on_cpu.handle.device


def test_a_gpu_that_tensorflow_does_not_see_is_an_error_naming_the_valid_ones():
    count = len(tf.config.list_logical_devices("GPU"))
    with pytest.raises(ValueError, match=rf"names no GPU: TensorFlow sees {count}"):
        make(f"/GPU:{count + 3}")


@pytest.mark.parametrize("var_type", list(VAR_TYPES))
def test_lookup_on_the_gpu_equals_the_cpu(var_type):
    gpu, cpu = make("/GPU:0", var_type), make("/CPU:0", var_type)
    ids = tf.constant([[3, 1 << 40, 3], [-7, 0, 2**63 - 1]], tf.int64)
    out_gpu = tf.nn.embedding_lookup(gpu, ids)
    assert "GPU" in out_gpu.device
    np.testing.assert_array_equal(out_gpu.numpy(), tf.nn.embedding_lookup(cpu, ids).numpy())
    assert gpu.size.numpy().tolist() == [5, 8]


@pytest.mark.parametrize("var_type", list(VAR_TYPES))
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_training_on_the_gpu_matches_the_cpu(name, var_type):
    def train(device: str) -> tuple[np.ndarray, np.ndarray]:
        var = make(device, var_type)
        wrapper = sok.OptimizerWrapper(OPTIMIZERS[name]())
        weights = tf.constant(np.linspace(0.5, 1.5, 512, dtype=np.float32)[:, None])

        @tf.function
        def step(ids):
            with tf.GradientTape() as tape:
                rows = tf.nn.embedding_lookup(var, ids)
                loss = tf.reduce_sum(weights * rows) + 0.01 * tf.reduce_sum(tf.square(rows))
            wrapper.apply_gradients(zip(tape.gradient(loss, [var]), [var]))

        for ids in batches():
            step(ids)
        return exported(var)

    gpu_keys, gpu_rows = train("/GPU:0")
    cpu_keys, cpu_rows = train("/CPU:0")
    np.testing.assert_array_equal(gpu_keys, cpu_keys)
    np.testing.assert_allclose(gpu_rows, cpu_rows, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("var_type", list(VAR_TYPES))
def test_lookup_sparse_mixes_gpu_tables_as_tensorflow(var_type):
    dynamic = make("/GPU:0", var_type, dimension=4)
    with tf.device("/GPU:0"):
        static = sok.Variable(np.arange(40, dtype=np.float32).reshape(10, 4))
    ids = tf.ragged.constant([[1, 2, 2], [], [9]], tf.int64)
    weights = tf.ragged.constant([[1.0, 0.5, -2.0], [], [3.0]])
    out_dynamic, out_static = sok.lookup_sparse([dynamic, static], [ids, ids], [weights, weights], ["mean", "sqrtn"])
    rows = tf.nn.embedding_lookup(dynamic, tf.range(10, dtype=tf.int64))
    for out, table, combiner in ((out_dynamic, rows, "mean"), (out_static, static.numpy(), "sqrtn")):
        expected = tf.nn.embedding_lookup_sparse(
            tf.constant(np.asarray(table)), ids.to_sparse(), weights.to_sparse(), combiner=combiner
        )
        np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("source", "target"), [("/GPU:0", "/CPU:0"), ("/CPU:0", "/GPU:0")])
def test_checkpoint_moves_between_gpu_and_cpu_tables(tmp_path, source, target):
    var = make(source, name="moving")
    wrapper = sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(var, batches(1)[0]))
    wrapper.apply_gradients(zip(tape.gradient(loss, [var]), [var]))
    sok.dump(str(tmp_path / "ckpt"), [var], wrapper)
    restored = make(target, name="moving")
    target_wrapper = sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    sok.load(str(tmp_path / "ckpt"), [restored], target_wrapper)
    slots = (wrapper.slot_view(var, "accumulator"), target_wrapper.slot_view(restored, "accumulator"))
    for a, b in ((var, restored), slots):
        keys_a, rows_a = exported(a)
        keys_b, rows_b = exported(b)
        np.testing.assert_array_equal(keys_a, keys_b)
        np.testing.assert_array_equal(rows_a, rows_b)


def _device_to_host_copies(logdir: str) -> tuple[list[int], int]:
    """``(bytes of each device-to-host copy, number of GPU events)`` of the profile in ``logdir``."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    sizes, gpu_events = [], 0
    for path in glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True):
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
        for plane in space.planes:
            if not plane.name.startswith("/device:GPU"):
                continue
            stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
            for line in plane.lines:
                for event in line.events:
                    gpu_events += 1
                    name = plane.event_metadata[event.metadata_id].name
                    if not re.search(r"memcpy.*d(evice)?to?h", name, re.IGNORECASE):
                        continue
                    details = " ".join(
                        f"{stat_names.get(s.metadata_id, '')}={s.str_value or s.uint64_value or s.int64_value}"
                        for s in event.stats
                    )
                    match = re.search(r"(?:size|num_bytes|bytes)\D{0,3}(\d+)", details)
                    sizes.append(int(match.group(1)) if match else -1)
    return sizes, gpu_events


@pytest.mark.parametrize("var_type", list(VAR_TYPES))
def test_a_training_step_copies_nothing_but_scalars_to_the_host(tmp_path, var_type):
    var = make("/GPU:0", var_type, dimension=16)
    with tf.device("/GPU:0"):
        head = tf.Variable(tf.ones([16, 1]))
    wrapper = sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(tf.reduce_sum(tf.nn.embedding_lookup(var, ids), axis=1), head))
        grads = tape.gradient(loss, [var, head])
        wrapper.apply_gradients(zip(grads, [var, head]))
        return loss

    with tf.device("/GPU:0"):
        ids = tf.reshape(batches(1, n=4096)[0], [512, 8])
    step(ids)  # trace and warm up outside the profile
    tf.profiler.experimental.start(str(tmp_path))
    step(ids).numpy()
    tf.profiler.experimental.stop()
    sizes, gpu_events = _device_to_host_copies(str(tmp_path))
    assert gpu_events > 0, "the profile holds no GPU events: the parser does not understand it"
    large = [s for s in sizes if s > 16 or s < 0]
    assert not large, f"device-to-host copies larger than a scalar (bytes; -1 = size unknown): {large}"


@pytest.mark.parametrize("var_type", list(VAR_TYPES))
def test_find_or_default_on_the_gpu_equals_the_cpu(var_type):
    from sparse_operation_kit import tf_ops

    lib = tf_ops.library()
    gpu, cpu = make("/GPU:0", var_type), make("/CPU:0", var_type)
    stored = tf.constant([3, 1 << 40, -7], tf.int64)
    keys = tf.constant([3, 4, -7, 2**63 - 1, 1 << 40], tf.int64)
    out = {}
    for device, var in (("/GPU:0", gpu), ("/CPU:0", cpu)):
        with tf.device(device):
            lib.sok_insert_or_assign(*var.table_inputs, stored, tf.ones([3, 8]) * 2.0, col_begin=0, col_end=8)
            values, found = lib.sok_find_or_default(
                *var.table_inputs, keys, tf.range(8, dtype=tf.float32), col_begin=0, col_end=8
            )
        assert device[1:4] in values.device
        out[device] = (values.numpy(), found.numpy())
    np.testing.assert_array_equal(out["/GPU:0"][0], out["/CPU:0"][0])
    np.testing.assert_array_equal(out["/GPU:0"][0][1], np.arange(8))
    assert out["/GPU:0"][1].tolist() == [True, False, True, False, True]


def test_a_function_of_gpu_table_ops_takes_no_input_from_the_cpu():
    v = make("/GPU:0")
    step = tf.function(lambda ids: tf.nn.embedding_lookup(v, ids))
    fn = step.get_concrete_function(tf.TensorSpec([None], tf.int64))
    assert [t.device for t in fn.captured_inputs if "CPU" in t.device] == []
    with tf.device("/GPU:0"):
        out = step(tf.constant([1, 2], tf.int64))
    assert "GPU" in out.device
