"""The storage conformance suite, threads: calls from several Python threads at once on one storage
(disjoint keys checked against :class:`~sparse_operation_kit.testing.model.DictModel`, the same new
keys created once, accumulations that lose no update, overwrites that leave whole rows, large
batches).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from sparse_operation_kit import initializers as inits
from sparse_operation_kit.testing.conformance.base import _RANDOM, ConformanceFixtures, MakeStorage, _keys, _rows_for
from sparse_operation_kit.testing.model import DictModel, assert_same_contents, snapshot

__all__ = ["ConcurrencyConformance"]


def _run_threads(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(i)`` for ``i < count`` in as many threads, started together; re-raise errors."""
    barrier = threading.Barrier(count)

    def start(i: int) -> Any:
        barrier.wait()
        return work(i)

    with ThreadPoolExecutor(count) as pool:
        return [f.result() for f in [pool.submit(start, i) for i in range(count)]]


class ConcurrencyConformance(ConformanceFixtures):
    """Calls from several threads at once on one storage: a concern of :class:`StorageConformance`,
    also usable alone."""

    def test_threads_writing_disjoint_keys(
        self, make_storage: MakeStorage, small_capacity_options: dict[str, Any]
    ) -> None:
        storage = make_storage(row_width=2, initializer=_RANDOM, **small_capacity_options)

        def batches(t: int) -> list[np.ndarray]:
            return np.array_split(_keys(np.arange(t * 10_000, t * 10_000 + 900)), 12)

        def work(t: int) -> None:
            for batch in batches(t):
                storage.insert_or_assign(batch[::2], _rows_for(batch[::2], 2))
                storage.find_or_insert(batch)
                storage.accum_or_assign(batch[1::3], np.ones((batch[1::3].size, 2), np.float32))
                storage.erase(batch[::5])
                values, found = storage.find(batch[::2])
                np.testing.assert_array_equal(found, np.arange(0, batch.size, 2) % 5 != 0)

        _run_threads(4, work)
        model = DictModel(2, "int64", [_RANDOM])
        for t in range(4):
            for batch in batches(t):
                model.insert_or_assign(batch[::2], _rows_for(batch[::2], 2))
                model.find_or_insert(batch)
                model.accum_or_assign(batch[1::3], np.ones((batch[1::3].size, 2), np.float32))
                model.erase(batch[::5])
        assert_same_contents(snapshot(storage), model.contents())

    def test_threads_inserting_the_same_keys_create_each_once(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=3, initializer=_RANDOM)
        keys = _keys(np.arange(800))

        def work(t: int) -> np.ndarray:
            created = np.zeros(keys.size, np.int64)
            order = np.random.default_rng(t).permutation(keys)
            for batch in np.array_split(order, 16):
                values, found = storage.find_or_insert(batch)
                np.testing.assert_array_equal(values, inits.init_rows(batch, [_RANDOM], 3))
                created[batch[~found]] += 1
            return created

        created = sum(_run_threads(4, work))
        np.testing.assert_array_equal(created, np.ones(keys.size))
        assert storage.size() == keys.size

    def test_threads_accumulating_into_the_same_keys_lose_no_update(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=2)
        keys = _keys(np.arange(64))
        rounds = 40

        def work(t: int) -> None:
            for _ in range(rounds):
                storage.accum_or_assign(keys, np.ones((keys.size, 2), np.float32))

        with ThreadPoolExecutor(1) as pool:
            writers = pool.submit(_run_threads, 4, work)
            while not writers.done():  # meanwhile, every row read is whole and a count of updates
                values, found = storage.find(keys)
                seen = values[found]
                np.testing.assert_array_equal(seen[:, 0], seen[:, 1])
                assert ((seen >= 1) & (seen <= 4 * rounds)).all()
            writers.result()
        np.testing.assert_array_equal(storage.find(keys)[0], np.full((keys.size, 2), 4 * rounds))

    def test_threads_overwriting_the_same_keys_leave_whole_rows(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=8)
        keys = _keys(np.arange(200))

        def work(t: int) -> None:
            for _ in range(20):
                storage.insert_or_assign(keys, np.full((keys.size, 8), float(t), np.float32))

        _run_threads(4, work)
        values, found = storage.find(keys)
        assert found.all()
        np.testing.assert_array_equal(values, np.repeat(values[:, :1], 8, axis=1))
        assert set(np.unique(values).tolist()) <= {0.0, 1.0, 2.0, 3.0}

    def test_threads_with_large_batches_lose_no_update(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=2)
        keys = np.random.default_rng(5).integers(0, 5_000, size=20_000)

        def work(t: int) -> None:
            for _ in range(4):
                storage.accum_or_assign(keys, np.ones((keys.size, 2), np.float32))

        _run_threads(3, work)
        unique, counts = np.unique(keys, return_counts=True)
        values, found = storage.find(unique)
        assert found.all() and storage.size() == unique.size
        np.testing.assert_array_equal(values, np.repeat(12.0 * counts[:, None], 2, axis=1))
