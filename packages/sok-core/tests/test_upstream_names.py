"""Names and behaviours of NVIDIA SOK 2.x that its own scripts rely on (issue 16): ``sok.tf_version``,
the ``experiment`` namespace's ``dump`` / ``load`` / ``tf_version`` / ``set_comm_tool``, ``sok.init``
with an unknown tool (a warning, not an error), and ``use_legacy_optimizer`` under Keras 2.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import communication  # noqa: E402
from sparse_operation_kit import experiment as sok_experiment  # noqa: E402


@pytest.fixture
def no_init(monkeypatch):
    """A process in which sok.init has not been called (restored afterwards)."""
    monkeypatch.setattr(communication, "_tool", None)


def test_tf_version_is_the_list_of_tensorflow_version_numbers():
    expected = [int(part) for part in tf.__version__.split(".")[:3]]
    assert sok.tf_version == expected and sok_experiment.tf_version == expected
    assert sok.tf_version[0] == 2 and "tf_version" in dir(sok)


def test_experiment_namespace_has_the_checkpoint_and_communication_calls():
    assert sok_experiment.dump is sok.dump and sok_experiment.load is sok.load
    assert sok_experiment.set_comm_tool is communication.set_comm_tool
    assert {"dump", "load", "tf_version", "set_comm_tool"} <= set(sok_experiment.__all__)


def test_unknown_comm_tool_warns_and_goes_on_in_one_process(no_init, caplog):
    with caplog.at_level(logging.WARNING, logger="sparse_operation_kit.communication"):
        sok.init("xyz")
    assert "comm_tool 'xyz' is not supported (valid: horovod, single); using 'single'" in caplog.text
    assert (sok.rank(), sok.num_ranks()) == (0, 1)
    v = sok.DynamicVariable(dimension=2, initializer="1")
    assert tf.nn.embedding_lookup(v, tf.constant([3], tf.int64)).numpy().tolist() == [[1.0, 1.0]]


def test_set_comm_tool_installs_a_tool_once(no_init):
    sok.set_comm_tool("single")
    assert communication.tool().name == "single"
    with pytest.raises(RuntimeError, match="already called"):
        sok.set_comm_tool("single")


def test_init_without_horovod_runs_one_process_and_says_so(no_init, monkeypatch, caplog):
    """The seed's plain sok.init() on one GPU with no Horovod installed (issue 17)."""
    monkeypatch.setattr(communication, "_horovod_installed", lambda: False)
    for name in communication._WORLD_SIZE_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    with caplog.at_level(logging.INFO, logger="sparse_operation_kit.communication"):
        sok.init()
    assert "Horovod is not installed: SOK runs as one process" in caplog.text
    assert communication.tool().name == "single" and (sok.rank(), sok.num_ranks()) == (0, 1)


@pytest.mark.parametrize("setting", ["HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE"])
def test_init_without_horovod_in_a_launched_job_raises(no_init, monkeypatch, setting):
    monkeypatch.setattr(communication, "_horovod_installed", lambda: False)
    monkeypatch.setenv(setting, "4")
    with pytest.raises(ImportError, match="one of 4 started by a launcher .* Horovod is not installed"):
        sok.init()
    assert communication._tool is None


def run_python(code: str, **env: str) -> str:
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", **env)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


SWITCH = """
    import tensorflow as tf
    import sparse_operation_kit as sok
    before = tf.keras.optimizers.SGD.__module__
    sok.init("single", use_legacy_optimizer={flag})
    print(before, tf.keras.optimizers.SGD.__module__, tf.optimizers.SGD.__module__)
"""


def test_init_switches_to_legacy_optimizers_under_keras_2():
    """As NVIDIA SOK: one legacy optimizer may update SOK tables and a TensorFlow reference in turn."""
    pytest.importorskip("tf_keras", reason="Keras 2 (TF_USE_LEGACY_KERAS=1) needs tf_keras")
    before, after, short = run_python(SWITCH.format(flag=True), TF_USE_LEGACY_KERAS="1").split()
    assert "legacy" not in before and "optimizers.legacy" in after and "optimizers.legacy" in short


def test_init_keeps_the_optimizers_when_asked_or_under_keras_3():
    pytest.importorskip("tf_keras", reason="Keras 2 (TF_USE_LEGACY_KERAS=1) needs tf_keras")
    before, after, _ = run_python(SWITCH.format(flag=False), TF_USE_LEGACY_KERAS="1").split()
    assert before == after and "legacy" not in after
    before, after, _ = run_python(SWITCH.format(flag=True), TF_USE_LEGACY_KERAS="0").split()
    assert before == after and after.startswith("keras")
