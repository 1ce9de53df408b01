"""Where a DynamicVariable's table lives (placement.py), as far as a CPU TensorFlow shows it; the GPU
side runs in test_dynamic_variable_gpu.py on a GPU host."""

from __future__ import annotations

import logging

import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import placement  # noqa: E402

cpu_tensorflow = pytest.mark.skipif(tf.test.is_built_with_cuda(), reason="a CPU build of TensorFlow shows this")


@cpu_tensorflow
def test_table_and_its_ops_are_on_the_cpu_without_a_gpu():
    v = sok.DynamicVariable(dimension=2, initializer="1")
    assert v.storage.device == "cpu" and v.table_device == "/device:CPU:0"
    assert "CPU:0" in v.handle.device and "device='cpu'" in repr(v)
    assert tf.nn.embedding_lookup(v, tf.constant([5], tf.int64)).numpy().tolist() == [[1.0, 1.0]]


@cpu_tensorflow
def test_asking_for_a_gpu_without_one_warns_and_keeps_the_table_on_the_cpu(caplog):
    with caplog.at_level(logging.WARNING, logger=placement.__name__), tf.device("/GPU:0"):
        v = sok.DynamicVariable(dimension=2)
    assert v.storage.device == "cpu"
    assert "stays on the CPU: TensorFlow is built without CUDA" in caplog.text


def test_an_explicit_cpu_scope_keeps_the_table_on_the_cpu_silently(caplog):
    with caplog.at_level(logging.WARNING, logger=placement.__name__), tf.device("/CPU:0"):
        v = sok.DynamicVariable(dimension=2)
    assert v.storage.device == "cpu" and not caplog.text


def test_a_device_that_is_neither_cpu_nor_gpu_is_an_error_naming_the_valid_ones():
    with pytest.raises(ValueError, match=r"cannot live on TPU .* valid: tf.device\('/GPU:i'\)"):
        with tf.device("/TPU:0"):
            sok.DynamicVariable(dimension=2)


@cpu_tensorflow
def test_default_home_says_why_not_a_gpu():
    assert placement.default_home("hbm") == "cpu (TensorFlow is built without CUDA)"
