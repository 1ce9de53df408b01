"""hkv (var_type "hybrid") against the storage conformance suite on a GPU (``device="cuda:0"``).

Runs where CuPy, a CUDA build of sok-backend-hkv and a GPU are found (``ci/gpu_test.sh``); skipped,
with the reason, elsewhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sok_backend_hkv import _core
from sparse_operation_kit.plugins import get_registry
from sparse_operation_kit.testing import StorageConformance
from sparse_operation_kit.testing.device import DEVICE, cuda_skip_reason

pytestmark = pytest.mark.gpu
if (reason := cuda_skip_reason(_core)) is not None:
    pytest.skip(reason, allow_module_level=True)


class TestHkvConformanceCuda(StorageConformance):
    @pytest.fixture
    def var_type(self) -> str:
        return "hybrid"

    @pytest.fixture
    def device(self) -> str:
        return DEVICE


#: Device memory for 4 KiB of rows: small tables keep some rows on the device and the rest in host
#: memory, so the suite runs over both and over the moves between them.
MIXED_HBM_GB = str(4096 / 2**30)


class TestHkvConformanceCudaHostRows(TestHkvConformanceCuda):
    """The suite again with most rows in pinned host memory (``max_hbm_for_vectors`` 4 KiB)."""

    @pytest.fixture
    def storage_options(self) -> dict[str, str]:
        return {"max_hbm_for_vectors": MIXED_HBM_GB}


def hybrid_table(dim: int, slots: int, device_rows: int) -> Any:
    """A hybrid table of ``slots`` slots in buckets of 128, with device memory for ``device_rows`` rows
    of ``dim`` floats (the low slots of every bucket; the others in pinned host memory)."""
    options = {
        "init_capacity": str(slots),
        "max_capacity": str(slots),
        "max_bucket_size": "128",
        "max_hbm_for_vectors": str(device_rows * dim * 4 / 2**30),
    }
    return get_registry().factory("hybrid")(key_dtype="int64", row_width=dim, options=options, device=DEVICE)


def test_rows_moving_between_device_and_host_memory_keep_their_values() -> None:
    """One bucket of 128 slots, 32 of them with device rows. Newer keys take the device slots and
    move older rows to host memory. Every key keeps its row through the moves, and later writes,
    finds, erases and exports see the moved rows."""
    cp = pytest.importorskip("cupy")
    dim = 4
    table = hybrid_table(dim, 128, 32)
    old = cp.arange(32, dtype=cp.int64)
    new = cp.arange(100, 132, dtype=cp.int64)

    def rows(keys: object) -> object:
        return cp.repeat(keys.astype(cp.float32)[:, None], dim, axis=1) + cp.arange(dim, dtype=cp.float32)

    table.insert_or_assign(old, 0, dim, rows(old), None, [])
    table.insert_or_assign(new, 0, dim, rows(new), None, [])
    both = cp.concatenate([new, old, old])
    out = cp.empty((both.shape[0], dim), dtype=cp.float32)
    found = cp.empty(both.shape[0], dtype=cp.bool_)
    for step in range(24):
        table.insert_or_assign(old, 0, dim, rows(old) + step, None, [])
        table.find(both, 0, dim, out, None, found)
        assert bool(found.all())
        cp.testing.assert_array_equal(out[:32], rows(new))
        cp.testing.assert_array_equal(out[32:], rows(both[32:]) + step)
    assert table.size() == 64
    assert table.erase(new[:4]) == 4
    keys = cp.empty(128, dtype=cp.int64)
    values = cp.empty((128, dim), dtype=cp.float32)
    count = table.export_batch(0, 128, 0, dim, keys, values, None, None)
    assert count == 60
    order = cp.argsort(keys[:count])
    cp.testing.assert_array_equal(keys[:count][order], cp.concatenate([old, new[4:]]))
    cp.testing.assert_array_equal(values[:count][order], cp.concatenate([rows(old) + 23, rows(new[4:])]))


def test_the_newcomers_of_one_call_all_take_device_rows() -> None:
    """One bucket of 128 slots, 32 of them with device rows, filled by 32 old keys. 32 newer keys
    come in one call: all of them contend for the same lowest-score device row at once, and every
    one must end up in a device slot (the losers of a lock choose the next row), moving each old row
    to host memory. export_batch walks slots in order and a bucket's device slots come first, so
    slots 0-31 hold exactly the new keys."""
    cp = pytest.importorskip("cupy")
    dim = 4
    table = hybrid_table(dim, 128, 32)

    def rows(keys: object) -> object:
        return keys.astype(cp.float32)[:, None] * 10 + cp.arange(dim, dtype=cp.float32)

    old = cp.arange(32, dtype=cp.int64)
    new = cp.arange(1000, 1032, dtype=cp.int64)
    table.insert_or_assign(old, 0, dim, rows(old), None, [])
    table.insert_or_assign(new, 0, dim, rows(new), None, [])
    for offset, limit, expected in ((0, 32, new), (32, 96, old)):
        keys = cp.empty(limit, dtype=cp.int64)
        values = cp.empty((limit, dim), dtype=cp.float32)
        count = table.export_batch(offset, limit, 0, dim, keys, values, None, None)
        assert count == 32
        order = cp.argsort(keys[:count])
        cp.testing.assert_array_equal(keys[:count][order], expected)
        cp.testing.assert_array_equal(values[:count][order], rows(expected))


def test_an_upsert_moving_many_wide_rows_keeps_every_row() -> None:
    """Rows that leave device memory during an upsert go straight to their host slots. 256 KiB rows:
    2,048 old keys fill the device halves of 32 buckets, then 1,300 new keys take device slots and
    move about 1,200 old rows out (300 MiB over PCIe in one call). Every key found has its row; new
    keys are all found (LRU evicts only old ones, from the few buckets that fill)."""
    cp = pytest.importorskip("cupy")
    dim = 65536
    table = hybrid_table(dim, 4096, 2048)

    def rows(keys: object) -> object:
        return keys.astype(cp.float32)[:, None] + cp.arange(dim, dtype=cp.float32)

    old = cp.arange(2048, dtype=cp.int64)
    new = cp.arange(10**6, 10**6 + 1300, dtype=cp.int64)
    table.insert_or_assign(old, 0, dim, rows(old), None, [])
    table.insert_or_assign(new, 0, dim, rows(new), None, [])
    found_old = found_new = 0
    for keys in [old[i : i + 512] for i in range(0, 2048, 512)] + [new[i : i + 512] for i in range(0, 1300, 512)]:
        out = cp.empty((keys.shape[0], dim), dtype=cp.float32)
        found = cp.empty(keys.shape[0], dtype=cp.bool_)
        table.find_hits(keys, 0, dim, out, found)
        cp.testing.assert_array_equal(out[found], rows(keys[found]))
        if int(keys[0]) < 10**6:
            found_old += int(found.sum())
        else:
            found_new += int(found.sum())
    assert found_new == 1300
    assert found_old >= 1900
    assert table.size() == found_old + found_new


def test_keys_outside_their_home_window_are_found() -> None:
    """One pure-device bucket of 128 slots filled to the last slot: its four 32-slot home windows
    overflow, so keys land outside their window (the window's spill bit makes lookups read the whole
    bucket). Every key is found with its row, through erases and refills of the freed slots: finds
    of the full bucket scan it whole, those at half load read the home window first."""
    cp = pytest.importorskip("cupy")
    options = {"init_capacity": "128", "max_capacity": "128", "max_bucket_size": "128"}
    table = get_registry().factory("hybrid")(key_dtype="int64", row_width=2, options=options, device=DEVICE)

    def rows(keys: object) -> object:
        return cp.stack([keys.astype(cp.float32), -keys.astype(cp.float32)], axis=1)

    def check(present: object, absent: object) -> None:
        both = cp.concatenate([present, absent])
        out = cp.full((both.shape[0], 2), 0.5, dtype=cp.float32)
        found = cp.empty(both.shape[0], dtype=cp.bool_)
        table.find_hits(both, 0, 2, out, found)
        cp.testing.assert_array_equal(found, cp.arange(both.shape[0]) < present.shape[0])
        cp.testing.assert_array_equal(out[: present.shape[0]], rows(present))
        assert bool((out[present.shape[0] :] == 0.5).all())

    keys = cp.arange(1, 129, dtype=cp.int64) * 7919
    for start in range(0, 128, 16):  # one batch after another, as windows fill up
        table.insert_or_assign(keys[start : start + 16], 0, 2, rows(keys[start : start + 16]), None, [])
    assert table.size() == 128
    check(keys, cp.arange(1, 5, dtype=cp.int64))
    evens, odds = cp.ascontiguousarray(keys[::2]), cp.ascontiguousarray(keys[1::2])
    assert table.erase(evens) == 64
    check(odds, evens)
    refill = evens + 1
    table.insert_or_assign(refill, 0, 2, rows(refill), None, [])
    assert table.size() == 128
    check(cp.concatenate([odds, refill]), evens)


@pytest.mark.parametrize("device_rows", [8192, 4096], ids=["device-rows", "half-in-host-memory"])
def test_a_broken_unique_keys_promise_in_a_full_table_keeps_every_key_once(device_rows: int) -> None:
    """insert_or_assign_hinted with SOK_HINT_UNIQUE_KEYS writes the keys present without
    deduplicating them. Given 20,000 keys drawn with repeats from 4,096 present and 4,096 new ones
    (every occurrence's row a value of its own) in a full table of 8,192 slots that evicts: no key is
    stored twice, the size is what an export finds, each stored key of the batch holds the row of one
    of its occurrences, and every other stored key keeps its own."""
    from sparse_operation_kit import _table

    cp = pytest.importorskip("cupy")
    dim = 8
    table = hybrid_table(dim, 8192, device_rows)
    old = cp.arange(8192, dtype=cp.int64)
    table.insert_or_assign(old, 0, dim, cp.repeat(-old.astype(cp.float32)[:, None], dim, axis=1), None, [])
    pool = np.concatenate([np.arange(4096), np.arange(10**6, 10**6 + 4096)]).astype(np.int64)
    batch = np.random.default_rng(7).choice(pool, 20000)
    values = np.repeat(np.arange(batch.size, dtype=np.float32)[:, None], dim, axis=1)
    table.insert_or_assign_hinted(cp.asarray(batch), 0, dim, cp.asarray(values), None, [], _table.HINT_UNIQUE_KEYS)
    keys = cp.empty(8192, dtype=cp.int64)
    rows = cp.empty((8192, dim), dtype=cp.float32)
    count = table.export_batch(0, 8192, 0, dim, keys, rows, None, None)
    keys, rows = cp.asnumpy(keys[:count]), cp.asnumpy(rows[:count])
    assert np.unique(keys).size == count == table.size()
    assert (rows == rows[:, :1]).all()
    occurrences: dict[int, set[float]] = {}
    for i, k in enumerate(batch.tolist()):
        occurrences.setdefault(k, set()).add(float(i))
    for k, value in zip(keys.tolist(), rows[:, 0].tolist()):
        assert value in occurrences.get(k, {float(-k)}), (k, value)


@pytest.mark.parametrize("threshold", [None, 2**40], ids=["every-row", "threshold"])
def test_an_export_over_many_chunks_is_the_exports_of_its_parts_in_order(threshold: int | None) -> None:
    """export_batch selects live slots 2**24 at a time. Over a table of 2**25 slots holding 200,000
    keys spread by their hash (scores 0 .. 2**41, so a threshold keeps about half), one export from
    an offset inside the first chunk to the end returns every such row once, and exactly the rows of
    three exports of its parts (one ending and one starting mid-chunk) laid end to end."""
    cp = pytest.importorskip("cupy")
    slots = 2**25
    table = get_registry().factory("hybrid")(
        key_dtype="int64",
        row_width=2,
        options={"init_capacity": str(slots), "max_capacity": str(slots), "evict_strategy": "customized"},
        device=DEVICE,
    )
    keys = cp.arange(200_000, dtype=cp.int64) * 104_729 + 3
    rows = cp.stack([keys.astype(cp.float32), -keys.astype(cp.float32)], axis=1)
    scores = (keys.astype(cp.uint64) * cp.uint64(7_919)) % cp.uint64(2**41)
    table.insert_or_assign(keys, 0, 2, rows, scores, [])

    def export(offset: int, limit: int) -> tuple[Any, Any, Any]:
        limit = min(limit, slots - offset)  # the outputs hold `limit` rows
        out_keys = cp.empty(limit, dtype=cp.int64)
        out_rows = cp.empty((limit, 2), dtype=cp.float32)
        out_scores = cp.empty(limit, dtype=cp.uint64)
        n = table.export_batch(offset, limit, 0, 2, out_keys, out_rows, out_scores, threshold)
        return out_keys[:n], out_rows[:n], out_scores[:n]

    start = 12_345
    whole = export(start, slots)
    parts = [export(start, 2**24 - 1000 - start), export(2**24 - 1000, 5000), export(2**24 + 4000, slots)]
    for got, expected in zip(whole, (cp.concatenate([p[i] for p in parts]) for i in range(3)), strict=True):
        cp.testing.assert_array_equal(got, expected)
    out_keys, out_rows, out_scores = whole
    assert out_keys.shape[0] == int(cp.unique(out_keys).shape[0])
    cp.testing.assert_array_equal(out_rows[:, 0], out_keys.astype(cp.float32))
    cp.testing.assert_array_equal(out_scores, (out_keys.astype(cp.uint64) * cp.uint64(7_919)) % cp.uint64(2**41))
    first = export(0, start)[0]
    kept = keys if threshold is None else keys[scores >= cp.uint64(threshold)]
    assert first.shape[0] + out_keys.shape[0] == kept.shape[0]
    cp.testing.assert_array_equal(cp.sort(cp.concatenate([first, out_keys])), cp.sort(kept))
    assert 0.4 < kept.shape[0] / keys.shape[0] <= 1.0
