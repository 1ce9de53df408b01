"""Argument handling of the Storage facade, shared by every backend."""

from __future__ import annotations

import numpy as np
import pytest
from sparse_operation_kit.storage import create_storage


def test_uint64_keys_and_scores_from_python_lists():
    table = create_storage(
        "hybrid", row_width=2, key_dtype="uint64", evict_strategy="custom", init_capacity=128, max_capacity=1024
    )
    table.insert_or_assign([2**64 - 1, 3], np.ones((2, 2)), scores=[17, 2**64 - 1])
    keys, _, scores = table.export()
    assert dict(zip(keys.tolist(), scores.tolist(), strict=True)) == {2**64 - 1: 17, 3: 2**64 - 1}


def test_keys_that_do_not_fit_are_named():
    table = create_storage("hbm", row_width=1, key_dtype="int32")
    with pytest.raises(ValueError, match="keys value 2147483648 does not fit int32"):
        table.find(np.array([1, 2**31], dtype=np.int64))
    with pytest.raises(ValueError, match="keys value 1180591620717411303424 does not fit int32"):
        table.find([2**70])


def test_scores_out_of_range_are_refused():
    table = create_storage("hybrid", row_width=1, evict_strategy="custom", init_capacity=128, max_capacity=128)
    with pytest.raises(ValueError, match="scores value 18446744073709551616 does not fit uint64"):
        table.insert_or_assign([1], np.ones((1, 1)), scores=[2**64])
    with pytest.raises(ValueError, match="scores value -1 does not fit uint64"):
        table.insert_or_assign([1], np.ones((1, 1)), scores=np.array([-1]))
    assert table.size() == 0


def test_default_row_must_match_the_columns():
    table = create_storage("hbm", row_width=4)
    with pytest.raises(ValueError, match="default must be a number or a row of 2 values"):
        table.find([1], columns=(0, 2), default=[1.0, 2.0, 3.0])
    values, _ = table.find([1], columns=(0, 2), default=7)
    np.testing.assert_array_equal(values, [[7, 7]])


def test_row_width_and_options_are_checked():
    with pytest.raises(ValueError, match="row_width must be an integer >= 1"):
        create_storage("hbm", row_width=0)
    with pytest.raises(TypeError, match="must be a number, string or bool"):
        create_storage("hbm", row_width=1, init_capacity=[1])


def test_export_batch_fills_given_arrays():
    storage = create_storage("hbm", row_width=2)
    storage.insert_or_assign(np.arange(5), np.arange(10, dtype=np.float32).reshape(5, 2))
    out = (np.empty(storage.capacity(), np.int64), np.empty((storage.capacity(), 2), np.float32))
    keys, values, scores = storage.export_batch(0, storage.capacity(), out=out)
    assert scores is None and np.shares_memory(keys, out[0]) and np.shares_memory(values, out[1])
    order = np.argsort(keys)
    np.testing.assert_array_equal(keys[order], np.arange(5))
    np.testing.assert_array_equal(values[order], np.arange(10, dtype=np.float32).reshape(5, 2))


def test_gpu_support_comes_from_the_declared_devices():
    """A backend whose Capabilities.devices lacks "cuda" is refused a GPU storage before its factory
    is asked, whatever the factory's signature; one that lists it gets ``device=`` passed."""
    from sparse_operation_kit.plugins import BackendSpec, Capabilities, get_registry

    calls = []

    def factory(key_dtype, row_width, options, device="cpu"):
        calls.append(device)
        raise MemoryError("stop here")

    registry = get_registry()
    for name, devices in (("cpu_only", ("cpu",)), ("with_cuda", ("cpu", "cuda"))):
        registry.register(
            BackendSpec(name=name, var_types=(name,), factory=factory, capabilities=Capabilities(devices=devices))
        )
    try:
        with pytest.raises(NotImplementedError, match="'cpu_only'.*no GPU support.*'cuda:1'.*device='cpu'"):
            create_storage("cpu_only", row_width=2, device="cuda:1")
        assert calls == []
        with pytest.raises(MemoryError):
            create_storage("with_cuda", row_width=2, device="cuda:1")
        assert calls[0] == "cuda:1"
    finally:
        registry.unregister("cpu_only")
        registry.unregister("with_cuda")
