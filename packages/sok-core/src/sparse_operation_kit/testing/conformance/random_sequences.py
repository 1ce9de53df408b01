"""The storage conformance suite, random operation sequences: a Hypothesis state machine
(:func:`~sparse_operation_kit.testing.stateful.model_state_machine`) runs random sequences of
every verb on a storage and on :class:`~sparse_operation_kit.testing.model.DictModel` and compares
them after each step. Skipped without Hypothesis.
"""

from __future__ import annotations

from typing import Any

import pytest

from sparse_operation_kit import initializers as inits
from sparse_operation_kit.testing.conformance.base import ConformanceFixtures, MakeStorage

__all__ = ["RandomSequenceConformance"]


class RandomSequenceConformance(ConformanceFixtures):
    """Random operation sequences agree with the dict model: a concern of :class:`StorageConformance`,
    also usable alone."""

    def test_random_operations_match_the_dict_model(
        self, make_storage: MakeStorage, no_eviction_options: dict[str, Any]
    ) -> None:
        hypothesis = pytest.importorskip("hypothesis")
        from hypothesis.stateful import run_state_machine_as_test

        from sparse_operation_kit.testing.stateful import ROW_WIDTH, model_state_machine

        initializer = inits.uniform(-1.0, 1.0, seed=77)
        machine = model_state_machine(
            lambda: make_storage(row_width=ROW_WIDTH, initializer=initializer, **no_eviction_options), [initializer]
        )
        settings = hypothesis.settings(
            max_examples=50,
            stateful_step_count=25,
            deadline=None,
            database=None,
            suppress_health_check=list(hypothesis.HealthCheck),
        )
        run_state_machine_as_test(machine, settings=settings)
