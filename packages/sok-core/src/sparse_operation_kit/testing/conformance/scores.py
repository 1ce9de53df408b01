"""The storage conformance suite, scores as times: under the default policy a write scores a row
with its time (ns), ``find_or_insert`` refreshes the score of an existing key, and ``export_if``
returns the rows written since a time. Skipped where ``Capabilities.export_if`` is False.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from sparse_operation_kit.plugins.registry import BackendSpec
from sparse_operation_kit.storage import Storage
from sparse_operation_kit.testing.conformance.base import ConformanceFixtures, _keys, _rows_for, _sleep_past_clock

__all__ = ["ScoreConformance"]


class ScoreConformance(ConformanceFixtures):
    """Scores of the default policy are times of the last write; ``export_if`` selects by them: a
    concern of :class:`StorageConformance`, also usable alone."""

    def test_scores_are_times_of_the_last_write(self, spec: BackendSpec, storage: Storage) -> None:
        if not spec.capabilities.export_if:
            pytest.skip(f"backend {spec.name!r} keeps no scores")
        before = time.time_ns()
        storage.insert_or_assign(_keys([1, 2]), np.zeros((2, 4), np.float32))
        after = time.time_ns()
        scores = storage.export()[2]
        assert scores.dtype == np.uint64
        assert ((scores >= before) & (scores <= after)).all(), (before, scores, after)

    def test_export_if_returns_rows_written_since_a_time(self, spec: BackendSpec, storage: Storage) -> None:
        if not spec.capabilities.export_if:
            pytest.skip(f"backend {spec.name!r} keeps no scores")
        storage.insert_or_assign(_keys([1, 2, 3]), _rows_for([1, 2, 3], 4))
        storage.find_or_insert(_keys([4]))
        _sleep_past_clock()
        since = time.time_ns()
        _sleep_past_clock()
        storage.insert_or_assign(_keys([2, 5]), _rows_for([2, 5], 4))
        storage.accum_or_assign(_keys([3]), np.ones((1, 4), np.float32))
        storage.find_or_insert(_keys([6]))
        keys, values, scores = storage.export_if(since)
        assert sorted(keys.tolist()) == [2, 3, 5, 6]
        assert (scores >= since).all()
        expected = dict(zip([2, 3, 5, 6], storage.find(_keys([2, 3, 5, 6]))[0], strict=True))
        np.testing.assert_array_equal(values, [expected[int(k)] for k in keys])

    def test_find_or_insert_refreshes_the_scores_of_existing_keys(self, spec: BackendSpec, storage: Storage) -> None:
        if not spec.capabilities.export_if:
            pytest.skip(f"backend {spec.name!r} keeps no scores")
        storage.find_or_insert(_keys([1, 2]))
        _sleep_past_clock()
        since = time.time_ns()
        storage.find_or_insert(_keys([2]))
        np.testing.assert_array_equal(storage.export_if(since)[0], [2])

    def test_export_if_threshold_zero_returns_every_row(self, spec: BackendSpec, storage: Storage) -> None:
        if not spec.capabilities.export_if:
            pytest.skip(f"backend {spec.name!r} keeps no scores")
        storage.find_or_insert(_keys(np.arange(10)))
        assert sorted(storage.export_if(0)[0].tolist()) == list(range(10))
