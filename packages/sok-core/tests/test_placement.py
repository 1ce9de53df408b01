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


class _FakeGpus:
    """tf.config's device functions over ``count`` fake GPUs (``set_visible_devices`` recorded, or
    raising as TensorFlow does once it has set up its GPUs)."""

    def __init__(self, count: int, visible: int | None = None, initialised: bool = False) -> None:
        self.gpus = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(count)]
        self.visible = self.gpus[: count if visible is None else visible]
        self.initialised = initialised
        self.pinned: list = []

    def install(self, monkeypatch) -> None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.setattr(placement.tf.test, "is_built_with_cuda", lambda: True)
        monkeypatch.setattr(placement.tf.config, "list_physical_devices", lambda kind=None: list(self.gpus))
        monkeypatch.setattr(placement.tf.config, "get_visible_devices", lambda kind=None: list(self.visible))
        monkeypatch.setattr(placement.tf.config, "set_visible_devices", self._set)

    def _set(self, devices, kind=None) -> None:
        if self.initialised:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self.pinned.append(list(devices))


@pytest.mark.parametrize("local_rank", [0, 1, 2])
def test_each_rank_of_a_host_is_pinned_to_its_own_gpu(monkeypatch, caplog, local_rank):
    fake = _FakeGpus(4)
    fake.install(monkeypatch)
    with caplog.at_level(logging.INFO, logger=placement.__name__):
        name = placement.pin_local_gpu(local_rank, 3)
    assert fake.pinned == [[fake.gpus[local_rank]]] and name == fake.gpus[local_rank].name
    assert f"rank {local_rank} of this host uses /physical_device:GPU:{local_rank} only" in caplog.text


@pytest.mark.parametrize(
    ("gpus", "visible", "local_size"),
    [(2, 1, 2), (1, None, 2), (4, None, 1)],
    ids=["user-chose", "one-gpu", "one-rank"],
)
def test_a_choice_already_made_or_nothing_to_share_is_kept(monkeypatch, gpus, visible, local_size):
    fake = _FakeGpus(gpus, visible)
    fake.install(monkeypatch)
    assert placement.pin_local_gpu(0, local_size) is None and fake.pinned == []


def test_ranks_that_outnumber_the_gpus_share_them_with_a_warning(monkeypatch, caplog):
    fake = _FakeGpus(2)
    fake.install(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=placement.__name__):
        placement.pin_local_gpu(3, 4)
    assert fake.pinned == [[fake.gpus[1]]] and "4 ranks share this host's 2 GPUs" in caplog.text


def test_gpus_already_set_up_warn_how_to_pin_the_rank(monkeypatch, caplog):
    fake = _FakeGpus(2, initialised=True)
    fake.install(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=placement.__name__):
        assert placement.pin_local_gpu(1, 2) is None
    assert "call sok.init() before anything runs on a GPU" in caplog.text and "CUDA_VISIBLE_DEVICES" in caplog.text


@pytest.mark.parametrize("chosen", ["1,0", "0,1,2,3", ""])
def test_a_cuda_visible_devices_of_the_users_is_kept(monkeypatch, chosen):
    fake = _FakeGpus(4)
    fake.install(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", chosen)
    assert placement.pin_local_gpu(1, 2) is None and fake.pinned == []
