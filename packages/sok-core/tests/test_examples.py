"""The seed examples of sok-dynamic-variable-api (examples/*.py), run verbatim, and the same flows
in-process on both var_types.

Documented numbers (reference §1.3): a lookup of [0, 1, 2**40] in a table initialised with "13"
gives a 3x3 array of 13 and grows v.size from [0, 3] to [3, 3]; one SGD step with lr=1.0 on
``sum(embedding)`` leaves every value at 12.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
VAR_TYPES = ["hbm", "hybrid"]
OPTIONS = {"hbm": {}, "hybrid": {"init_capacity": 1024, "max_capacity": 1 << 16}}
IDS = [0, 1, 2**40]
#: The examples of the seed doc, kept verbatim in examples/.
SEED_EXAMPLES = ("dynamic_variable.py", "optimizer_wrapper.py")


@pytest.fixture(scope="module")
def example_output() -> dict[str, str]:
    """stdout of every example, run concurrently (each loads TensorFlow: seconds)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    procs = {
        path.name: subprocess.Popen(
            [sys.executable, str(path)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for path in (EXAMPLES / name for name in SEED_EXAMPLES)
    }
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{stderr[-3000:]}"
        out[name] = stdout
    return out


def printed_tensors(stdout: str, label: str) -> list[np.ndarray]:
    """Every ``label: tf.Tensor(<numbers>, shape=(...), dtype=...)`` printed, as arrays of that shape."""
    found = []
    for body, shape in re.findall(rf"^{label}: tf\.Tensor\((.*?), shape=\(([\d, ]*)\)", stdout, re.M | re.S):
        numbers = [float(x) for x in re.findall(r"-?\d+(?:\.\d*)?(?:e[-+]?\d+)?", body)]
        dims = [int(d) for d in shape.replace(" ", "").split(",") if d]
        found.append(np.array(numbers).reshape(dims))
    return found


def test_dynamic_variable_example_shape_stays_none_by_3(example_output):
    shapes = re.findall(r"^v\.shape: (.*)$", example_output["dynamic_variable.py"], re.M)
    assert shapes == ["(None, 3)", "(None, 3)"]


def test_dynamic_variable_example_size_grows_from_0_to_3_rows(example_output):
    sizes = printed_tensors(example_output["dynamic_variable.py"], r"v\.size")
    assert [s.tolist() for s in sizes] == [[0, 3], [3, 3]]


def test_dynamic_variable_example_lookup_is_all_13(example_output):
    (embedding,) = printed_tensors(example_output["dynamic_variable.py"], "embedding")
    np.testing.assert_array_equal(embedding, np.full((3, 3), 13.0))


def test_optimizer_wrapper_example_one_sgd_step_gives_12(example_output):
    before, after = printed_tensors(example_output["optimizer_wrapper.py"], "embedding")
    np.testing.assert_array_equal(before, np.full((3, 3), 13.0))
    np.testing.assert_array_equal(after, np.full((3, 3), 12.0))


# -- the same flows in-process -----------------------------------------------------------------


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_dynamic_variable_flow(var_type):
    v = sok.DynamicVariable(dimension=3, initializer="13", var_type=var_type, **OPTIONS[var_type])
    assert v.shape.as_list() == [None, 3]
    assert v.size.numpy().tolist() == [0, 3]
    embedding = tf.nn.embedding_lookup(v, tf.convert_to_tensor(IDS, dtype=tf.int64))
    np.testing.assert_array_equal(embedding.numpy(), np.full((3, 3), 13.0, np.float32))
    assert v.shape.as_list() == [None, 3]
    assert v.size.numpy().tolist() == [3, 3]


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_optimizer_wrapper_flow(var_type, mode):
    v = sok.DynamicVariable(dimension=3, var_type=var_type, initializer="13", **OPTIONS[var_type])
    indices = tf.convert_to_tensor(IDS, dtype=tf.int64)
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=1.0))

    def step():
        with tf.GradientTape() as tape:
            embedding = tf.nn.embedding_lookup(v, indices)
            loss = tf.reduce_sum(embedding)
        grads = tape.gradient(loss, [v])
        optimizer.apply_gradients(zip(grads, [v]))
        return embedding

    before = (tf.function(step) if mode == "function" else step)()
    np.testing.assert_array_equal(before.numpy(), np.full((3, 3), 13.0, np.float32))
    after = tf.nn.embedding_lookup(v, indices)
    np.testing.assert_array_equal(after.numpy(), np.full((3, 3), 12.0, np.float32))
    assert v.size.numpy().tolist() == [3, 3]
