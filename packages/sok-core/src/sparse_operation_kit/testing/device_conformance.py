"""Device arrays in and out of a backend's CUDA tables: one abstract pytest class per backend.

:class:`DeviceArrayConformance` drives a backend's native table (its registry factory, sok-core's
``_table.Table`` over the backend's C ABI: ``factory(key_dtype, width, options, device=)``)
and its :class:`~sparse_operation_kit.storage.CudaStorage` with every kind of device array the
contract names: CuPy arrays, Torch CUDA tensors, objects exposing only
``__cuda_array_interface__`` or only ``__dlpack__``, arrays made on non-default streams (and a
producer stream other than the call's), comparing results with NumPy oracles; and it checks
that bad arrays (host arrays for a CUDA table, wrong dtypes, shapes, layouts, devices, streams)
are refused with a ValueError naming them. A backend's GPU test module subclasses it, overriding
``var_type``, and skips itself where CUDA tables cannot be made::

    # packages/my-backend/tests/test_device_arrays.py
    import pytest
    from sok_backend_mine import _core
    from sparse_operation_kit.testing.device import cuda_skip_reason
    from sparse_operation_kit.testing.device_conformance import DeviceArrayConformance

    pytestmark = pytest.mark.gpu
    if (reason := cuda_skip_reason(_core)) is not None:
        pytest.skip(reason, allow_module_level=True)

    class TestMineDeviceArrays(DeviceArrayConformance):
        @pytest.fixture
        def var_type(self):
            return "mine"

It needs CuPy; the Torch tests are skipped without a CUDA Torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sparse_operation_kit import _table
from sparse_operation_kit import initializers as inits
from sparse_operation_kit.plugins.registry import get_registry
from sparse_operation_kit.storage import CudaStorage, Storage, create_storage
from sparse_operation_kit.testing.device import DEVICE, CudaArrayInterfaceOnly, DLPackOnly
from sparse_operation_kit.testing.model import snapshot

__all__ = ["DeviceArrayConformance"]

#: Row width of the tables of this suite.
WIDTH = 4

_RANDOM = inits.uniform(-0.05, 0.05, seed=4321)


def _rows_for(keys: Any, width: int = WIDTH) -> np.ndarray:
    """Distinct, exactly representable rows derived from keys: ``[k % 1000 + c / 4]``."""
    base = (np.asarray(keys).astype(np.float64) % 1000.0).reshape(-1, 1)
    return (base + np.arange(width, dtype=np.float64) / 4.0).astype(np.float32)


def _contents(cp: Any, table: Any, width: int = WIDTH) -> dict[int, np.ndarray]:
    """Every row of a CUDA ``table`` (int64 keys), read with export_batch into CuPy outputs."""
    capacity = table.capacity()
    keys = cp.empty(capacity, dtype=cp.int64)
    values = cp.empty((capacity, width), dtype=cp.float32)
    scores = cp.empty(capacity, dtype=cp.uint64)
    count = table.export_batch(0, capacity, 0, width, keys, values, scores, None)
    return dict(zip(keys[:count].get().tolist(), values[:count].get(), strict=True))


def _assert_contents(cp: Any, table: Any, keys: np.ndarray, rows: np.ndarray) -> None:
    got = _contents(cp, table, rows.shape[1])
    assert sorted(got) == sorted(keys.tolist())
    np.testing.assert_array_equal(np.array([got[k] for k in keys.tolist()]), rows)


class DeviceArrayConformance:
    """Device arrays through a backend's CUDA tables. Subclass it and override ``var_type``."""

    # -- fixtures -------------------------------------------------------------------------------
    @pytest.fixture
    def var_type(self) -> str:
        """The var_type under test: override this in the subclass."""
        raise NotImplementedError(f"{type(self).__name__} must override the var_type fixture")

    @pytest.fixture
    def cp(self) -> Any:
        """The cupy module."""
        return pytest.importorskip("cupy")

    @pytest.fixture
    def torch(self) -> Any:
        """The torch module, with CUDA (or a skip)."""
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("Torch has no CUDA device")
        return torch

    @pytest.fixture
    def table_class(self, var_type: str) -> Any:
        """The backend's table class (its registry factory): ``Table(key_dtype, width, options, device=)``."""
        return get_registry().factory(var_type)

    @pytest.fixture
    def table(self, table_class: Any) -> Any:
        """An empty int64-keyed CUDA table of width :data:`WIDTH`."""
        return table_class("int64", WIDTH, {}, device=DEVICE)

    @pytest.fixture
    def cpu_table(self, table_class: Any) -> Any:
        """An empty int64-keyed CPU table of width :data:`WIDTH`."""
        return table_class("int64", WIDTH, {})

    @pytest.fixture
    def storage(self, var_type: str) -> Storage:
        """An empty int64-keyed CUDA storage of width :data:`WIDTH` whose new rows are random."""
        return create_storage(var_type, row_width=WIDTH, initializer=_RANDOM, device=DEVICE)

    # -- the native table: each kind of device array ---------------------------------------------
    def test_table_reports_its_device(self, table_class: Any, table: Any) -> None:
        assert table.device == DEVICE
        assert table_class("int64", 1, {}, device="cuda").device == "cuda:0"
        assert table_class("int64", 1, {}).device == "cpu"

    def test_cupy_arrays_in_and_out(self, cp: Any, table: Any) -> None:
        keys = np.array([5, -7, 2**40, 0, 3], dtype=np.int64)
        table.insert_or_assign(cp.asarray(keys[:3]), 0, WIDTH, cp.asarray(_rows_for(keys[:3])), None, [])
        init = _RANDOM.resolve(WIDTH)
        values = cp.empty((keys.size, WIDTH), dtype=cp.float32)
        found = cp.empty(keys.size, dtype=cp.bool_)
        table.find_or_insert(cp.asarray(keys), 0, WIDTH, values, found, None, [init])
        expected = np.concatenate([_rows_for(keys[:3]), inits.init_rows(keys[3:], [_RANDOM], WIDTH)])
        np.testing.assert_array_equal(values.get(), expected)
        np.testing.assert_array_equal(found.get(), [True, True, True, False, False])
        assert table.size() == keys.size
        _assert_contents(cp, table, keys, expected)

    @pytest.fixture
    def wide_table_options(self) -> list[dict[str, str]]:
        """Options of the tables that test_wide_rows_and_column_ranges runs on (a backend with
        rows in host memory adds a table that keeps some there)."""
        return [{}]

    @pytest.mark.parametrize(
        ("width", "cb", "ce"),
        [
            (64, 0, 64),
            (128, 0, 128),
            (96, 0, 96),
            (128, 4, 100),
            (128, 1, 65),
            (130, 0, 130),
            (128, 64, 128),
            (600, 0, 600),
            (600, 3, 517),
        ],
        ids=["64", "128", "96", "128-cols-4-100", "128-cols-1-65", "130", "128-cols-64-128", "600", "600-cols-3-517"],
    )
    def test_wide_rows_and_column_ranges(
        self, cp: Any, table_class: Any, wide_table_options: list[dict[str, str]], width: int, cb: int, ce: int
    ) -> None:
        """Rows of 64 to 600 floats and column ranges, aligned to 16 bytes or not (the CUDA kernels
        copy aligned rows four floats a lane, others one; rows of up to 512 floats take a constant
        initial row from shared memory), through find, find_hits, find_or_insert and
        insert_or_assign, against a NumPy model of the rows."""
        rng = np.random.default_rng(width * 1000 + cb)
        w = ce - cb
        for options in wide_table_options:
            table = table_class("int64", width, options, device=DEVICE)
            stored = rng.choice(1 << 40, size=3000, replace=False).astype(np.int64)
            model = {int(k): row for k, row in zip(stored.tolist(), _rows_for(stored, width), strict=True)}
            table.insert_or_assign(cp.asarray(stored), 0, width, cp.asarray(_rows_for(stored, width)), None, [])
            fresh = (np.int64(1) << 41) + np.arange(1000, dtype=np.int64)
            query = rng.permutation(np.concatenate([stored[:2000], fresh]))
            hit = np.isin(query, stored)
            expected = np.array(
                [model[k][cb:ce] if h else np.zeros(w, np.float32) for k, h in zip(query.tolist(), hit)]
            )
            values = cp.full((query.size, w), -1.0, dtype=cp.float32)
            found = cp.empty(query.size, dtype=cp.bool_)
            table.find(cp.asarray(query), cb, ce, values, None, found)
            np.testing.assert_array_equal(values.get(), expected, err_msg=f"find, options {options}")
            np.testing.assert_array_equal(found.get(), hit)
            values.fill(-1.0)
            table.find_hits(cp.asarray(query), cb, ce, values, found)
            np.testing.assert_array_equal(values.get()[hit], expected[hit], err_msg=f"find_hits, options {options}")
            assert (values.get()[~hit] == -1.0).all()
            # insert_or_assign of the requested columns: updates and new keys (new rows' other columns 0)
            assigned = rng.standard_normal((query.size, w)).astype(np.float32)
            table.insert_or_assign(cp.asarray(query), cb, ce, cp.asarray(assigned), None, [])
            for k, row in zip(query.tolist(), assigned, strict=True):
                model.setdefault(k, np.zeros(width, np.float32))[cb:ce] = row
            # find_or_insert: every key above present, plus new ones (rows of the initializer 0.5)
            more = (np.int64(1) << 42) + np.arange(500, dtype=np.int64)
            query = rng.permutation(np.concatenate([query, more]))
            init = inits.constant(0.5).resolve(width)
            values = cp.empty((query.size, w), dtype=cp.float32)
            found = cp.empty(query.size, dtype=cp.bool_)
            table.find_or_insert(cp.asarray(query), cb, ce, values, found, None, [init])
            for k in more.tolist():
                model[k] = np.full(width, 0.5, np.float32)
            expected = np.array([model[k][cb:ce] for k in query.tolist()])
            np.testing.assert_array_equal(values.get(), expected, err_msg=f"find_or_insert, options {options}")
            np.testing.assert_array_equal(found.get(), ~np.isin(query, more))
            keys = np.array(sorted(model), dtype=np.int64)
            _assert_contents(cp, table, keys, np.array([model[k] for k in keys.tolist()]))

    def test_torch_tensors_in_and_out(self, cp: Any, torch: Any, table: Any) -> None:
        keys = np.array([11, 12, 13, 14], dtype=np.int64)
        stream = torch.cuda.current_stream().cuda_stream
        t_keys = torch.as_tensor(keys, device=DEVICE)
        table.insert_or_assign(
            t_keys, 0, WIDTH, torch.as_tensor(_rows_for(keys), device=DEVICE), None, [], stream=stream
        )
        values = torch.empty((keys.size + 1, WIDTH), dtype=torch.float32, device=DEVICE)
        found = torch.empty(keys.size + 1, dtype=torch.bool, device=DEVICE)
        query = torch.as_tensor(np.append(keys[::-1], 99), device=DEVICE)
        table.find(query, 0, WIDTH, values, None, found, stream=stream)
        torch.cuda.synchronize()
        expected = np.concatenate([_rows_for(keys[::-1]), np.zeros((1, WIDTH), np.float32)])
        np.testing.assert_array_equal(values.cpu().numpy(), expected)
        np.testing.assert_array_equal(found.cpu().numpy(), [True, True, True, True, False])

    def test_cuda_array_interface_only_objects(self, cp: Any, table: Any) -> None:
        keys = np.arange(100, dtype=np.int64) * 3 - 150
        table.insert_or_assign(
            CudaArrayInterfaceOnly(cp.asarray(keys)),
            0,
            WIDTH,
            CudaArrayInterfaceOnly(cp.asarray(_rows_for(keys))),
            None,
            [],
        )
        values = cp.empty((keys.size, WIDTH), dtype=cp.float32)
        found = cp.empty(keys.size, dtype=cp.bool_)
        table.find(
            CudaArrayInterfaceOnly(cp.asarray(keys)),
            0,
            WIDTH,
            CudaArrayInterfaceOnly(values),
            None,
            CudaArrayInterfaceOnly(found),
        )
        np.testing.assert_array_equal(values.get(), _rows_for(keys))
        assert found.get().all()

    def test_dlpack_only_objects(self, cp: Any, table: Any) -> None:
        keys = np.arange(100, dtype=np.int64) * 5 + 2**33
        table.insert_or_assign(
            DLPackOnly(cp.asarray(keys)), 0, WIDTH, DLPackOnly(cp.asarray(_rows_for(keys))), None, []
        )
        values = cp.empty((keys.size, WIDTH), dtype=cp.float32)
        found = cp.empty(keys.size, dtype=cp.bool_)
        table.find(DLPackOnly(cp.asarray(keys)), 0, WIDTH, DLPackOnly(values), None, DLPackOnly(found))
        np.testing.assert_array_equal(values.get(), _rows_for(keys))
        assert found.get().all()

    def test_arrays_of_a_non_default_stream(self, cp: Any, table: Any) -> None:
        keys = np.arange(5000, dtype=np.int64) * 7
        with cp.cuda.Stream(non_blocking=True) as stream:
            d_keys = cp.asarray(keys)
            table.insert_or_assign(d_keys, 0, WIDTH, cp.asarray(_rows_for(keys)), None, [], stream=stream.ptr)
            evens = cp.ascontiguousarray(d_keys[::2])
            table.accum_or_assign(evens, 0, 2, cp.ones((evens.size, 2), cp.float32), None, [], stream=stream.ptr)
            values = cp.empty((keys.size, WIDTH), dtype=cp.float32)
            found = cp.empty(keys.size, dtype=cp.bool_)
            table.find(d_keys, 0, WIDTH, values, None, found, stream=stream.ptr)
            assert table.size(stream=stream.ptr) == keys.size
        stream.synchronize()
        expected = _rows_for(keys)
        expected[::2, :2] += 1.0
        np.testing.assert_array_equal(values.get(), expected)
        assert found.get().all()

    def test_inputs_are_waited_for_on_the_stream_their_interface_names(self, cp: Any, table: Any) -> None:
        """Keys and rows written late on a producer stream, the call enqueued on another stream:
        the table must wait for the producer (``__cuda_array_interface__`` v3 ``stream``)."""
        n = 1 << 16
        keys = cp.full(n, -1, dtype=cp.int64)  # wrong until the producer overwrites them
        values = cp.full((n, WIDTH), -1.0, dtype=cp.float32)
        expected_keys = np.arange(n, dtype=np.int64) * 3 + 1
        d_expected_keys, d_expected_rows = cp.asarray(expected_keys), cp.asarray(_rows_for(expected_keys))
        cp.cuda.Device().synchronize()
        producer = cp.cuda.Stream(non_blocking=True)
        consumer = cp.cuda.Stream(non_blocking=True)
        with producer:
            busy = cp.ones((4096, 4096), dtype=cp.float32)
            for _ in range(8):  # tens of ms of work before the inputs are ready
                busy = busy @ busy / np.float32(4096)
            zero = busy[0, 0] - np.float32(1)
            keys[...] = d_expected_keys + zero.astype(cp.int64)
            values[...] = d_expected_rows + zero
            keys_in, values_in = CudaArrayInterfaceOnly(keys), CudaArrayInterfaceOnly(values)
        assert keys_in.__cuda_array_interface__["stream"] == producer.ptr
        table.insert_or_assign(keys_in, 0, WIDTH, values_in, None, [], stream=consumer.ptr)
        consumer.synchronize()
        producer.synchronize()
        _assert_contents(cp, table, expected_keys, _rows_for(expected_keys))

    def test_erase_export_and_import_with_device_arrays(self, cp: Any, table: Any) -> None:
        keys = np.arange(1, 301, dtype=np.int64)
        scores = (keys * 11).astype(np.uint64)
        table.import_batch(cp.asarray(keys), 0, WIDTH, cp.asarray(_rows_for(keys)), cp.asarray(scores), [])
        assert table.erase(cp.asarray(keys[::3])) == keys[::3].size
        capacity = table.capacity()
        out_keys = cp.empty(capacity, dtype=cp.int64)
        out_values = cp.empty((capacity, 2), dtype=cp.float32)
        out_scores = cp.empty(capacity, dtype=cp.uint64)
        count = table.export_batch(0, capacity, 1, 3, out_keys, out_values, out_scores, None)
        kept = np.setdiff1d(keys, keys[::3])
        got = out_keys[:count].get()
        order = np.argsort(got)
        np.testing.assert_array_equal(got[order], kept)
        np.testing.assert_array_equal(out_values[:count].get()[order], _rows_for(kept)[:, 1:3])
        np.testing.assert_array_equal(out_scores[:count].get()[order], kept.astype(np.uint64) * np.uint64(11))
        count = table.export_batch(0, capacity, 0, WIDTH, out_keys, None, None, 11 * 250)
        assert sorted(out_keys[:count].get().tolist()) == kept[kept >= 250].tolist()

    def test_insert_and_evict_with_device_outputs(self, cp: Any, table: Any) -> None:
        keys = np.arange(64, dtype=np.int64)
        evicted_keys = cp.empty(keys.size, dtype=cp.int64)
        evicted_values = cp.empty((keys.size, WIDTH), dtype=cp.float32)
        evicted_scores = cp.empty(keys.size, dtype=cp.uint64)
        count = table.insert_and_evict(
            cp.asarray(keys),
            0,
            2,
            cp.asarray(_rows_for(keys, 2)),
            None,
            [inits.constant(7.0).resolve(WIDTH)],
            evicted_keys,
            evicted_values,
            evicted_scores,
        )
        assert count == 0  # a default table has room
        expected = np.concatenate([_rows_for(keys, 2), np.full((keys.size, 2), 7.0, np.float32)], axis=1)
        _assert_contents(cp, table, keys, expected)

    def test_default_row_on_the_device(self, cp: Any, table: Any) -> None:
        values = cp.empty((2, 2), dtype=cp.float32)
        found = cp.empty(2, dtype=cp.bool_)
        table.find(cp.asarray([1, 2], dtype=cp.int64), 1, 3, values, cp.asarray([8.0, 9.0], cp.float32), found)
        np.testing.assert_array_equal(values.get(), [[8.0, 9.0], [8.0, 9.0]])
        assert not found.get().any()

    def test_find_hits_leaves_missing_rows_of_a_device_array(self, cp: Any, table: Any) -> None:
        table.insert_or_assign(cp.asarray([4], dtype=cp.int64), 0, WIDTH, cp.asarray(_rows_for([4])), None, [])
        values = cp.full((3, WIDTH), -2.0, dtype=cp.float32)
        found = cp.empty(3, dtype=cp.bool_)
        table.find_hits(cp.asarray([1, 4, 2], dtype=cp.int64), 0, WIDTH, values, found)
        np.testing.assert_array_equal(values.get(), [[-2.0] * WIDTH, _rows_for([4])[0], [-2.0] * WIDTH])
        np.testing.assert_array_equal(found.get(), [False, True, False])

    def test_clear_describe_and_capacity_take_a_stream(self, cp: Any, table: Any) -> None:
        with cp.cuda.Stream(non_blocking=True) as stream:
            table.find_or_insert(
                cp.arange(10, dtype=cp.int64),
                0,
                WIDTH,
                cp.empty((10, WIDTH), cp.float32),
                cp.empty(10, cp.bool_),
                None,
                [],
                stream=stream.ptr,
            )
            assert table.capacity(stream=stream.ptr) >= table.size(stream=stream.ptr) == 10
            assert isinstance(table.describe(stream=stream.ptr), str)
            table.clear(stream=stream.ptr)
            assert table.size(stream=stream.ptr) == 0

    # -- the native table: bad arrays ------------------------------------------------------------
    @pytest.mark.parametrize("host", ["keys", "values", "found", "default_row"])
    def test_host_arrays_to_a_cuda_table_are_refused(self, cp: Any, table: Any, host: str) -> None:
        args = {
            "keys": cp.arange(3, dtype=cp.int64),
            "values": cp.empty((3, WIDTH), cp.float32),
            "default_row": cp.zeros(WIDTH, cp.float32),
            "found": cp.empty(3, cp.bool_),
        }
        args[host] = cp.asnumpy(args[host])
        with pytest.raises(ValueError, match=host):
            table.find(args["keys"], 0, WIDTH, args["values"], args["default_row"], args["found"])

    def test_host_values_to_a_cuda_table_are_refused_by_writes(self, cp: Any, table: Any) -> None:
        with pytest.raises(ValueError, match="values"):
            table.insert_or_assign(cp.arange(3, dtype=cp.int64), 0, WIDTH, np.zeros((3, WIDTH), np.float32), None, [])
        assert table.size() == 0

    @pytest.mark.parametrize(
        ("name", "dtype"), [("keys", "float64"), ("keys", "int32"), ("keys", "uint64"), ("values", "float64")]
    )
    def test_device_arrays_of_the_wrong_dtype_are_refused(self, cp: Any, table: Any, name: str, dtype: str) -> None:
        args = {"keys": cp.arange(3, dtype=cp.int64), "values": cp.zeros((3, WIDTH), cp.float32)}
        args[name] = args[name].astype(dtype)
        with pytest.raises(ValueError, match=name):
            table.insert_or_assign(args["keys"], 0, WIDTH, args["values"], None, [])
        assert table.size() == 0

    def test_found_of_the_wrong_dtype_is_refused(self, cp: Any, table: Any) -> None:
        with pytest.raises(ValueError, match="found"):
            table.find(
                cp.arange(3, dtype=cp.int64), 0, WIDTH, cp.empty((3, WIDTH), cp.float32), None, cp.empty(3, cp.int32)
            )

    @pytest.mark.parametrize(
        ("name", "shape"),
        [("keys", (3, 1)), ("values", (3, WIDTH - 1)), ("values", (2, WIDTH)), ("values", (3 * WIDTH,))],
    )
    def test_device_arrays_of_the_wrong_shape_are_refused(
        self, cp: Any, table: Any, name: str, shape: tuple[int, ...]
    ) -> None:
        args = {"keys": cp.arange(3, dtype=cp.int64), "values": cp.zeros((3, WIDTH), cp.float32)}
        args[name] = cp.zeros(shape, dtype=args[name].dtype)
        with pytest.raises(ValueError, match=name):
            table.insert_or_assign(args["keys"], 0, WIDTH, args["values"], None, [])
        assert table.size() == 0

    @pytest.mark.parametrize("name", ["keys", "values"])
    def test_non_contiguous_device_arrays_are_refused(self, cp: Any, table: Any, name: str) -> None:
        args = {"keys": cp.arange(3, dtype=cp.int64), "values": cp.zeros((3, WIDTH), cp.float32)}
        strided = {"keys": cp.arange(6, dtype=cp.int64)[::2], "values": cp.asfortranarray(args["values"])}
        args[name] = strided[name]
        assert not args[name].flags.c_contiguous
        with pytest.raises(ValueError, match=name):
            table.insert_or_assign(args["keys"], 0, WIDTH, args["values"], None, [])
        assert table.size() == 0

    def test_device_arrays_to_a_cpu_table_are_refused(self, cp: Any, cpu_table: Any) -> None:
        with pytest.raises(ValueError, match="keys"):
            cpu_table.find(
                cp.arange(3, dtype=cp.int64), 0, WIDTH, np.empty((3, WIDTH), np.float32), None, np.empty(3, np.bool_)
            )
        with pytest.raises(ValueError, match="values"):
            cpu_table.insert_or_assign(
                np.arange(3, dtype=np.int64), 0, WIDTH, cp.zeros((3, WIDTH), cp.float32), None, []
            )
        assert cpu_table.size() == 0

    def test_a_stream_for_a_cpu_table_is_refused(self, cp: Any, cpu_table: Any) -> None:
        stream = cp.cuda.Stream(non_blocking=True)
        with pytest.raises(ValueError, match="stream"):
            cpu_table.size(stream=stream.ptr)
        with pytest.raises(ValueError, match="stream"):
            cpu_table.insert_or_assign(
                np.arange(3, dtype=np.int64), 0, WIDTH, np.zeros((3, WIDTH), np.float32), None, [], stream=stream.ptr
            )
        assert cpu_table.size() == 0

    def test_a_device_beyond_the_count_is_refused(self, table_class: Any) -> None:
        count = _table.cuda_device_count()
        with pytest.raises(ValueError) as raised:
            table_class("int64", WIDTH, {}, device="cuda:99")
        message = str(raised.value)
        assert "99" in message and str(count) in message, message

    # -- the storage facade ----------------------------------------------------------------------
    def test_storage_lives_on_its_device(self, storage: Storage) -> None:
        assert isinstance(storage, CudaStorage)
        assert storage.device == storage.table.device == DEVICE
        assert DEVICE in repr(storage)

    def test_storage_device_keys_give_device_results(self, cp: Any, storage: Storage) -> None:
        keys = np.array([3, 1, 2**50, -4], dtype=np.int64)
        values, found = storage.find_or_insert(cp.asarray(keys))
        assert isinstance(values, cp.ndarray) and isinstance(found, cp.ndarray)
        assert values.device.id == found.device.id == 0
        assert values.dtype == np.float32 and found.dtype == np.bool_
        np.testing.assert_array_equal(values.get(), inits.init_rows(keys, [_RANDOM], WIDTH))
        assert not found.get().any()

    def test_storage_find_hits_writes_a_cupy_out_in_place(self, cp: Any, storage: Storage) -> None:
        storage.insert_or_assign([6], _rows_for([6]))
        out = cp.full((2, WIDTH), 0.5, dtype=cp.float32)
        found = storage.find_hits(cp.asarray([6, 8], dtype=cp.int64), out)
        assert isinstance(found, cp.ndarray)
        np.testing.assert_array_equal(out.get(), [_rows_for([6])[0], [0.5] * WIDTH])
        np.testing.assert_array_equal(found.get(), [True, False])
        with pytest.raises(TypeError, match="CuPy array on cuda:0"):
            storage.find_hits([6], DLPackOnly(cp.zeros((1, WIDTH), dtype=cp.float32)))

    def test_storage_host_keys_give_host_results(self, storage: Storage) -> None:
        keys = [3, 1, 2**50, -4]
        values, found = storage.find_or_insert(keys)
        assert isinstance(values, np.ndarray) and isinstance(found, np.ndarray)
        np.testing.assert_array_equal(values, inits.init_rows(np.array(keys), [_RANDOM], WIDTH))

    def test_storage_takes_torch_tensors(self, cp: Any, torch: Any, storage: Storage) -> None:
        keys = np.arange(20, dtype=np.int64) * 13
        storage.insert_or_assign(torch.as_tensor(keys, device=DEVICE), torch.as_tensor(_rows_for(keys), device=DEVICE))
        values, found = storage.find(torch.as_tensor(keys[::-1].copy(), device=DEVICE))
        assert isinstance(values, cp.ndarray)
        np.testing.assert_array_equal(values.get(), _rows_for(keys[::-1]))
        assert found.get().all()

    @pytest.mark.parametrize("wrap", [CudaArrayInterfaceOnly, DLPackOnly], ids=["cai", "dlpack"])
    def test_storage_takes_single_protocol_objects(self, cp: Any, storage: Storage, wrap: Any) -> None:
        keys = np.arange(50, dtype=np.int64) - 25
        storage.insert_or_assign(wrap(cp.asarray(keys)), wrap(cp.asarray(_rows_for(keys))))
        values, found = storage.find(wrap(cp.asarray(keys)), default=wrap(cp.full(WIDTH, 2.0, cp.float32)))
        assert isinstance(values, cp.ndarray)
        np.testing.assert_array_equal(values.get(), _rows_for(keys))

    def test_storage_mixes_host_and_device_arguments(self, cp: Any, storage: Storage) -> None:
        keys = np.arange(10, dtype=np.int64)
        storage.insert_or_assign(cp.asarray(keys), _rows_for(keys), scores=None)
        storage.accum_or_assign(keys, cp.ones((10, WIDTH), cp.float32))
        values, _ = storage.find(keys, default=cp.zeros(WIDTH, cp.float32))
        assert isinstance(values, np.ndarray)
        np.testing.assert_array_equal(values, _rows_for(keys) + np.float32(1))

    def test_storage_converts_device_keys_of_another_integer_dtype(self, cp: Any, storage: Storage) -> None:
        storage.insert_or_assign(cp.asarray([5, -5], dtype=cp.int32), [[1.0] * WIDTH, [2.0] * WIDTH])
        values, found = storage.find(cp.asarray([5, 2**40], dtype=cp.uint64))
        np.testing.assert_array_equal(found.get(), [True, False])
        np.testing.assert_array_equal(values.get()[0], [1.0] * WIDTH)

    def test_storage_names_device_keys_that_do_not_fit(self, cp: Any, storage: Storage) -> None:
        with pytest.raises(ValueError, match="keys value 9223372036854775808 does not fit int64"):
            storage.find(cp.asarray([1, 2**63], dtype=cp.uint64))

    def test_storage_refuses_float_device_keys(self, cp: Any, storage: Storage) -> None:
        with pytest.raises(TypeError, match=r"keys must be integers \(int64\), got dtype float32"):
            storage.find_or_insert(cp.asarray([1.0, 2.0], dtype=cp.float32))
        assert storage.size() == 0

    def test_storage_refuses_two_dimensional_device_keys(self, cp: Any, storage: Storage) -> None:
        with pytest.raises(ValueError, match=r"\(2, 2\)"):
            storage.find_or_insert(cp.asarray([[1, 2], [3, 4]]))

    def test_storage_refuses_device_values_of_the_wrong_shape(self, cp: Any, storage: Storage) -> None:
        with pytest.raises(ValueError, match=r"got \(2, 3\)"):
            storage.insert_or_assign(cp.asarray([1, 2]), cp.zeros((2, 3), cp.float32))
        with pytest.raises(ValueError, match=r"scores must hold one integer per key \(2\), got shape \(3,\)"):
            storage.insert_or_assign(cp.asarray([1, 2]), cp.zeros((2, WIDTH)), scores=cp.asarray([1, 2, 3]))
        assert storage.size() == 0

    def test_storage_takes_non_contiguous_device_arrays(self, cp: Any, storage: Storage) -> None:
        keys = cp.arange(40, dtype=cp.int64)[::2]
        rows = cp.asfortranarray(cp.asarray(_rows_for(keys.get())))
        storage.insert_or_assign(keys, rows)
        np.testing.assert_array_equal(storage.find(keys)[0].get(), _rows_for(keys.get()))

    def test_storage_work_on_a_non_default_stream(self, cp: Any, storage: Storage) -> None:
        keys = np.arange(3000, dtype=np.int64) * 17
        with cp.cuda.Stream(non_blocking=True) as stream:
            d_keys = cp.asarray(keys)
            storage.insert_or_assign(d_keys, cp.asarray(_rows_for(keys)))
            storage.accum_or_assign(d_keys, cp.ones((keys.size, WIDTH), cp.float32))
            values, found = storage.find(d_keys)
            assert storage.size() == keys.size
        stream.synchronize()
        np.testing.assert_array_equal(values.get(), _rows_for(keys) + np.float32(1))
        assert found.get().all()

    def test_storage_erase_import_export_and_evict(self, cp: Any, storage: Storage) -> None:
        keys = np.arange(100, dtype=np.int64)
        storage.import_batch(cp.asarray(keys), cp.asarray(_rows_for(keys)), cp.asarray(keys.astype(np.uint64) + 1))
        assert storage.erase(cp.asarray(keys[:10])) == 10
        evicted = storage.insert_and_evict(cp.asarray([500]), cp.zeros((1, WIDTH), cp.float32))
        assert all(isinstance(part, cp.ndarray) for part in evicted) and evicted[0].size == 0
        exported_keys, exported_rows = snapshot(storage)
        assert isinstance(exported_keys, np.ndarray)
        np.testing.assert_array_equal(exported_keys, np.append(keys[10:], 500))
        np.testing.assert_array_equal(exported_rows[:-1], _rows_for(keys[10:]))

    def test_cpu_storage_refuses_device_arrays(self, cp: Any, var_type: str) -> None:
        storage = create_storage(var_type, row_width=WIDTH)
        with pytest.raises(ValueError, match="keys is a CUDA device array"):
            storage.find(cp.asarray([1, 2]))
        with pytest.raises(ValueError, match="values is a CUDA device array"):
            storage.insert_or_assign([1, 2], cp.zeros((2, WIDTH), cp.float32))
        assert storage.size() == 0
