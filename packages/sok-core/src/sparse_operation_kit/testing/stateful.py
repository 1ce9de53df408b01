"""Random operation sequences on a storage, checked against :class:`~.model.DictModel`.

:func:`model_state_machine` builds a Hypothesis ``RuleBasedStateMachine`` whose rules are the
storage operations on batches drawn from a small key pool (so duplicates, re-inserts and erases
collide) and whose invariant compares the whole table with the model after every step.

Example::

    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    machine = model_state_machine(lambda: create_storage("hbm", row_width=3, initializer=INIT),
                                  initializers=[INIT])
    run_state_machine_as_test(machine, settings=settings(max_examples=50))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sparse_operation_kit import initializers as inits
from sparse_operation_kit.storage import Storage
from sparse_operation_kit.testing.model import DictModel, assert_same_contents, snapshot

__all__ = ["model_state_machine", "ROW_WIDTH", "KEY_POOL"]

#: Row width of the machine's storages.
ROW_WIDTH = 3

#: Keys the machine draws from (int64): a few small ones so batches collide, and the extremes.
KEY_POOL: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7, -1, -(2**63), 2**63 - 1, 2**32)

_COLUMNS = st.sampled_from([None, (0, 1), (1, 3), (2, 3), (0, 3)])


def _width(columns: tuple[int, int] | None) -> int:
    return ROW_WIDTH if columns is None else columns[1] - columns[0]


@st.composite
def _writes(draw: st.DrawFn, key_pool: Sequence[int]) -> tuple[np.ndarray, tuple[int, int] | None, np.ndarray]:
    """``(keys, columns, values)`` with small integer values, so float32 sums are exact."""
    keys = np.array(draw(st.lists(st.sampled_from(key_pool), max_size=8)), dtype=np.int64)
    columns = draw(_COLUMNS)
    flat = draw(
        st.lists(st.integers(-8, 8), min_size=keys.size * _width(columns), max_size=keys.size * _width(columns))
    )
    values = np.array(flat, dtype=np.float32).reshape(keys.size, _width(columns))
    return keys, columns, values


def model_state_machine(
    make_storage: Callable[[], Storage], initializers: Sequence[inits.Initializer], key_pool: Sequence[int] = KEY_POOL
) -> type[RuleBasedStateMachine]:
    """A state machine class driving a fresh storage per example alongside a :class:`DictModel`.

    Args:
        make_storage: makes an empty int64-keyed storage of width :data:`ROW_WIDTH` that evicts
            nothing, filling new rows with ``initializers``.
        initializers: the storage's initializers (the model uses the same).
        key_pool: the keys batches are drawn from.
    """
    keys_strategy = st.lists(st.sampled_from(list(key_pool)), max_size=8).map(lambda ks: np.array(ks, dtype=np.int64))
    writes = _writes(list(key_pool))

    class StorageModelMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.storage = make_storage()
            self.model = DictModel(ROW_WIDTH, "int64", initializers)

        @rule(keys=keys_strategy, columns=_COLUMNS)
        def find(self, keys: np.ndarray, columns: tuple[int, int] | None) -> None:
            values, found = self.storage.find(keys, columns)
            expected_values, expected_found = self.model.find(keys, columns)
            np.testing.assert_array_equal(found, expected_found)
            np.testing.assert_array_equal(values, expected_values)

        @rule(keys=keys_strategy, columns=_COLUMNS, fill=st.integers(-8, 8))
        def find_hits(self, keys: np.ndarray, columns: tuple[int, int] | None, fill: int) -> None:
            out = np.full((keys.size, _width(columns)), fill, dtype=np.float32)
            found = self.storage.find_hits(keys, out, columns)
            expected_values, expected_found = self.model.find(keys, columns)
            np.testing.assert_array_equal(found, expected_found)
            np.testing.assert_array_equal(out, np.where(expected_found[:, None], expected_values, np.float32(fill)))

        @rule(keys=keys_strategy, columns=_COLUMNS)
        def find_or_insert(self, keys: np.ndarray, columns: tuple[int, int] | None) -> None:
            values, found = self.storage.find_or_insert(keys, columns)
            expected_values, expected_found = self.model.find_or_insert(keys, columns)
            np.testing.assert_array_equal(found, expected_found)
            np.testing.assert_array_equal(values, expected_values)

        @rule(batch=writes)
        def insert_or_assign(self, batch: tuple[np.ndarray, tuple[int, int] | None, np.ndarray]) -> None:
            keys, columns, values = batch
            self.storage.insert_or_assign(keys, values, columns)
            self.model.insert_or_assign(keys, values, columns)

        @rule(batch=writes)
        def accum_or_assign(self, batch: tuple[np.ndarray, tuple[int, int] | None, np.ndarray]) -> None:
            keys, columns, values = batch
            self.storage.accum_or_assign(keys, values, columns)
            self.model.accum_or_assign(keys, values, columns)

        @rule(batch=writes)
        def insert_and_evict(self, batch: tuple[np.ndarray, tuple[int, int] | None, np.ndarray]) -> None:
            keys, columns, values = batch
            evicted_keys, _, _ = self.storage.insert_and_evict(keys, values, columns)
            self.model.insert_or_assign(keys, values, columns)
            assert evicted_keys.size == 0, f"a table with room evicted {evicted_keys!r}"

        @rule(keys=keys_strategy)
        def erase(self, keys: np.ndarray) -> None:
            assert self.storage.erase(keys) == self.model.erase(keys)

        @precondition(lambda self: len(self.model) >= 6)  # rarely, and only on a fuller table
        @rule()
        def clear(self) -> None:
            self.storage.clear()
            self.model.clear()

        @invariant()
        def contents_match(self) -> None:
            assert self.storage.size() == len(self.model)
            assert_same_contents(snapshot(self.storage), self.model.contents())

    return StorageModelMachine
