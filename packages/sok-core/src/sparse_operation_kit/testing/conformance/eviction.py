"""The storage conformance suite, eviction: ``insert_and_evict`` (nothing evicted while there is room;
every displaced row reported whole), each eviction policy on a table of one bucket of
:data:`~sparse_operation_kit.testing.conformance.base.BUCKET_SLOTS` slots (``one_bucket_options``):
``lru``, ``lfu``, ``custom``, ``epoch_lru``, ``epoch_lfu``, and ``set_global_epoch``. The tests
of a policy not in ``Capabilities.eviction_policies``, and every policy test where
``Capabilities.eviction`` is False, are skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from sparse_operation_kit.dtypes import SCORE_DTYPE
from sparse_operation_kit.plugins.registry import BackendSpec
from sparse_operation_kit.storage import Storage
from sparse_operation_kit.testing.conformance.base import (
    BUCKET_SLOTS,
    ConformanceFixtures,
    MakeStorage,
    _keys,
    _rows_for,
)
from sparse_operation_kit.testing.model import assert_same_contents, snapshot

__all__ = ["EvictionConformance"]


class EvictionConformance(ConformanceFixtures):
    """``insert_and_evict`` and the eviction policies: a concern of :class:`StorageConformance`, also
    usable alone."""

    @pytest.fixture
    def one_bucket(
        self, spec: BackendSpec, make_storage: MakeStorage, one_bucket_options: dict[str, Any]
    ) -> Callable[..., Storage]:
        """``make(policy, row_width=2, **kwargs)``: a one-bucket evicting table, or a skip when the
        backend does not evict or lacks ``policy``."""

        def make(policy: str, row_width: int = 2, **kwargs: Any) -> Storage:
            if not spec.capabilities.eviction:
                pytest.skip(f"backend {spec.name!r} does not evict")
            if policy not in spec.capabilities.eviction_policies:
                pytest.skip(f"backend {spec.name!r} has no eviction policy {policy!r}")
            return make_storage(row_width=row_width, evict_strategy=policy, **{**one_bucket_options, **kwargs})

        return make

    # -- insert_and_evict -----------------------------------------------------------------------
    def test_insert_and_evict_with_room_evicts_nothing(
        self, make_storage: MakeStorage, no_eviction_options: dict[str, Any]
    ) -> None:
        storage = make_storage(row_width=3, **no_eviction_options)
        keys = _keys(np.arange(200))
        evicted_keys, evicted_rows, evicted_scores = storage.insert_and_evict(keys, _rows_for(keys, 3))
        assert evicted_keys.size == 0 and evicted_rows.shape == (0, 3) and evicted_scores.size == 0
        assert evicted_keys.dtype == np.int64 and evicted_scores.dtype == np.dtype(SCORE_DTYPE)
        np.testing.assert_array_equal(storage.find(keys)[0], _rows_for(keys, 3))

    def test_insert_and_evict_reports_every_displaced_row(
        self, spec: BackendSpec, one_bucket: Callable[..., Storage]
    ) -> None:
        policy = next((p for p in ("lru", "lfu") if p in spec.capabilities.eviction_policies), "lru")
        storage = one_bucket(policy, row_width=4, initializer=7.0)
        old = _keys(np.arange(BUCKET_SLOTS))
        storage.insert_or_assign(old, _rows_for(old, 4))
        new = _keys(np.arange(1000, 1064))
        evicted_keys, evicted_rows, _ = storage.insert_and_evict(new, -np.ones((64, 2), np.float32), columns=(0, 2))
        stored = storage.export()[0]
        assert storage.size() == BUCKET_SLOTS
        assert len(evicted_keys) == 64
        assert set(evicted_keys.tolist()).isdisjoint(stored.tolist())
        assert sorted(evicted_keys.tolist() + stored.tolist()) == sorted(old.tolist() + new.tolist())
        # Evicted rows are whole rows (optimizer columns included) as they were stored.
        written = {int(k): row for k, row in zip(old, _rows_for(old, 4), strict=True)}
        written.update({int(k): np.array([-1, -1, 7, 7], np.float32) for k in new})
        np.testing.assert_array_equal(evicted_rows, [written[int(k)] for k in evicted_keys])

    # -- eviction -------------------------------------------------------------------------------
    def _fill_one_by_one(self, storage: Storage, keys: range, **kwargs: Any) -> None:
        """One call per key, so every key gets its own (later) score."""
        for key in keys:
            storage.insert_or_assign(_keys([key]), _rows_for([key], storage.row_width), **kwargs)

    def test_eviction_keeps_size_at_the_maximum(self, spec: BackendSpec, one_bucket: Callable[..., Storage]) -> None:
        policy = next((p for p in ("lru", "lfu") if p in spec.capabilities.eviction_policies), "lru")
        storage = one_bucket(policy)
        keys = _keys(np.arange(3 * BUCKET_SLOTS))
        storage.insert_or_assign(keys, _rows_for(keys, 2))
        assert storage.size() == BUCKET_SLOTS
        assert storage.capacity() == BUCKET_SLOTS

    def test_unknown_eviction_policy_is_refused(self, spec: BackendSpec, make_storage: MakeStorage) -> None:
        if not spec.capabilities.eviction:
            pytest.skip(f"backend {spec.name!r} does not evict")
        with pytest.raises(ValueError, match="no_such_policy"):
            make_storage(row_width=2, evict_strategy="no_such_policy")

    def test_lru_evicts_the_least_recently_written(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("lru")
        self._fill_one_by_one(storage, range(BUCKET_SLOTS))
        storage.insert_or_assign(_keys([0]), _rows_for([0], 2))
        evicted, rows, _ = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [1])
        np.testing.assert_array_equal(rows, _rows_for([1], 2))
        evicted, _, _ = storage.insert_and_evict(_keys([1001]), _rows_for([1001], 2))
        np.testing.assert_array_equal(evicted, [2])
        np.testing.assert_array_equal(
            storage.find(_keys([0, 1, 2, 3, 1000, 1001]))[1], [True, False, False, True, True, True]
        )

    def test_lru_find_or_insert_counts_as_use(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("lru")
        self._fill_one_by_one(storage, range(BUCKET_SLOTS))
        storage.find_or_insert(_keys([0]))
        evicted, _, _ = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [1])

    def test_lru_find_does_not_count_as_use(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("lru")
        self._fill_one_by_one(storage, range(BUCKET_SLOTS))
        storage.find(_keys([0]))
        evicted, _, _ = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [0])

    def test_lfu_evicts_the_least_frequently_used(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("lfu")
        keys = _keys(np.arange(BUCKET_SLOTS))
        storage.insert_or_assign(keys, _rows_for(keys, 2))
        again = keys[keys != 77]
        storage.accum_or_assign(again, np.zeros((again.size, 2), np.float32))
        storage.find_or_insert(again)
        evicted, rows, scores = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [77])
        np.testing.assert_array_equal(rows, _rows_for([77], 2))
        np.testing.assert_array_equal(scores, [1])

    def test_lfu_counts_find_or_insert(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("lfu")
        keys = _keys(np.arange(BUCKET_SLOTS))
        storage.find_or_insert(keys)
        storage.find_or_insert(keys[keys != 5])
        storage.find(_keys([5]))  # not a use
        evicted, _, _ = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [5])

    def test_lfu_scores_count_uses(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("lfu")
        storage.find_or_insert(_keys([1, 2]))
        storage.insert_or_assign(_keys([1]), _rows_for([1], 2))
        storage.accum_or_assign(_keys([1]), _rows_for([1], 2))
        keys, _, scores = storage.export()
        assert dict(zip(keys.tolist(), scores.tolist(), strict=True)) == {1: 3, 2: 1}

    def _custom_scores(self) -> tuple[np.ndarray, np.ndarray]:
        keys = _keys(np.arange(BUCKET_SLOTS))
        scores = (1000 + (keys * 37 + 11) % BUCKET_SLOTS).astype(np.uint64)
        return keys, scores

    def test_custom_evicts_the_lowest_caller_score(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("custom")
        keys, scores = self._custom_scores()
        storage.insert_or_assign(keys, _rows_for(keys, 2), scores=scores)
        lowest = int(keys[np.argmin(scores)])
        evicted, rows, evicted_scores = storage.insert_and_evict(_keys([5000]), _rows_for([5000], 2), scores=[2000])
        np.testing.assert_array_equal(evicted, [lowest])
        np.testing.assert_array_equal(rows, _rows_for([lowest], 2))
        np.testing.assert_array_equal(evicted_scores, [1000])
        assert storage.find(_keys([5000]))[1][0]

    def test_custom_refuses_a_newcomer_below_the_bucket_minimum(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("custom", initializer=3.0)
        keys, scores = self._custom_scores()
        storage.insert_or_assign(keys, _rows_for(keys, 2), scores=scores)
        before = snapshot(storage)
        evicted, rows, evicted_scores = storage.insert_and_evict(_keys([5000]), [[-1.0]], columns=(1, 2), scores=[999])
        np.testing.assert_array_equal(evicted, [5000])
        np.testing.assert_array_equal(rows, [[3.0, -1.0]])  # the row it would have had
        np.testing.assert_array_equal(evicted_scores, [999])
        assert not storage.find(_keys([5000]))[1][0]
        assert_same_contents(snapshot(storage), before)

    def test_custom_admits_a_newcomer_equal_to_the_bucket_minimum(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("custom")
        keys, scores = self._custom_scores()
        storage.insert_or_assign(keys, _rows_for(keys, 2), scores=scores)
        evicted, _, _ = storage.insert_and_evict(_keys([5000]), _rows_for([5000], 2), scores=[1000])
        np.testing.assert_array_equal(evicted, keys[np.argmin(scores)])
        assert storage.find(_keys([5000]))[1][0]

    def test_custom_keeps_the_highest_scores_of_one_large_batch(self, one_bucket: Callable[..., Storage]) -> None:
        """Refusals and evictions together keep the top scores: a streaming top-k per bucket."""
        storage = one_bucket("custom", row_width=1)
        keys = _keys(np.arange(20_000))
        scores = np.random.default_rng(9).permutation(keys.size).astype(np.uint64) + np.uint64(10)
        evicted, rows, evicted_scores = storage.insert_and_evict(keys, keys[:, None].astype(np.float32), scores=scores)
        stored = storage.export()[0]
        assert sorted(stored.tolist()) == sorted(keys[np.argsort(scores)[-BUCKET_SLOTS:]].tolist())
        assert sorted(evicted.tolist() + stored.tolist()) == keys.tolist()
        np.testing.assert_array_equal(evicted_scores, scores[evicted])
        np.testing.assert_array_equal(rows[:, 0], evicted)

    def test_custom_scores_are_the_caller_scores(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("custom")
        storage.insert_or_assign(_keys([1, 2]), _rows_for([1, 2], 2), scores=np.array([17, 2**64 - 1], np.uint64))
        keys, _, scores = storage.export()
        assert dict(zip(keys.tolist(), scores.tolist(), strict=True)) == {1: 17, 2: 2**64 - 1}

    def test_epoch_lru_evicts_from_the_oldest_epoch(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("epoch_lru")
        storage.set_global_epoch(1)
        keys = _keys(np.arange(BUCKET_SLOTS))
        storage.insert_or_assign(keys, _rows_for(keys, 2))
        storage.set_global_epoch(2)
        again = keys[keys != 9]
        storage.insert_or_assign(again, _rows_for(again, 2))
        evicted, _, scores = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [9])
        assert int(scores[0]) >> 32 == 1
        assert storage.find(_keys([1000]))[1][0]

    def test_epoch_lru_refuses_a_newcomer_of_an_older_epoch(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("epoch_lru")
        storage.set_global_epoch(2)
        keys = _keys(np.arange(BUCKET_SLOTS))
        storage.insert_or_assign(keys, _rows_for(keys, 2))
        storage.set_global_epoch(1)
        evicted, _, _ = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [1000])
        assert storage.size() == BUCKET_SLOTS and not storage.find(_keys([1000]))[1][0]

    def test_epoch_lfu_evicts_the_least_frequent_of_the_oldest_epoch(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("epoch_lfu")
        storage.set_global_epoch(1)
        keys = _keys(np.arange(BUCKET_SLOTS))
        storage.insert_or_assign(keys, _rows_for(keys, 2))
        again = keys[keys != 9]
        storage.insert_or_assign(again, _rows_for(again, 2))
        storage.set_global_epoch(2)
        evicted, _, scores = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [9])
        np.testing.assert_array_equal(scores, [(1 << 32) | 1])

    def test_epoch_lfu_refuses_a_newcomer_of_an_older_epoch(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("epoch_lfu")
        storage.set_global_epoch(2)
        keys = _keys(np.arange(BUCKET_SLOTS))
        storage.insert_or_assign(keys, _rows_for(keys, 2))
        storage.set_global_epoch(1)
        evicted, _, _ = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [1000])
        assert not storage.find(_keys([1000]))[1][0]

    def test_set_global_epoch_needs_an_epoch_policy(self, storage: Storage) -> None:
        with pytest.raises(NotImplementedError, match="epoch"):
            storage.set_global_epoch(1)
