"""The storage conformance suite, bad input: float, 2-D and out-of-range keys, wrong value shapes and
column ranges, non-numeric values, negative or unwanted scores, unknown options and bad option
values, row widths, key dtypes and export ranges are refused with an error that names the value;
a refused call leaves the table as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from sparse_operation_kit.plugins.registry import BackendSpec
from sparse_operation_kit.storage import Storage
from sparse_operation_kit.testing.conformance.base import (
    ConformanceFixtures,
    MakeStorage,
    _keys,
    _rows_for,
    _skip_unless_key_dtype,
)
from sparse_operation_kit.testing.model import assert_same_contents, snapshot

__all__ = ["BadInputConformance"]


class BadInputConformance(ConformanceFixtures):
    """Bad arguments are refused with the value in the message, and leave the table unchanged: a
    concern of :class:`StorageConformance`, also usable alone."""

    @pytest.fixture
    def filled(self, storage: Storage) -> Storage:
        keys = _keys([1, 2, 3])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        return storage

    def _assert_refused(self, storage: Storage, error: type[Exception], match: str, call: Callable[[], Any]) -> None:
        before = snapshot(storage)
        with pytest.raises(error, match=match):
            call()
        assert_same_contents(snapshot(storage), before)

    @pytest.mark.parametrize(
        "op", ["find", "find_or_insert", "insert_or_assign", "accum_or_assign", "erase", "insert_and_evict"]
    )
    def test_float_keys_are_refused(self, filled: Storage, op: str) -> None:
        keys = np.array([4.0, 5.0])
        args = (
            (np.zeros((2, 4), np.float32),) if op in ("insert_or_assign", "accum_or_assign", "insert_and_evict") else ()
        )
        self._assert_refused(filled, TypeError, "float64", lambda: getattr(filled, op)(keys, *args))

    def test_two_dimensional_keys_are_refused(self, filled: Storage) -> None:
        self._assert_refused(filled, ValueError, r"\(2, 2\)", lambda: filled.find_or_insert(_keys([[4, 5], [6, 7]])))

    def test_wrong_value_shape_is_refused(self, filled: Storage) -> None:
        self._assert_refused(
            filled,
            ValueError,
            r"\(2, 3\)",
            lambda: filled.insert_or_assign(_keys([4, 5]), np.zeros((2, 3), np.float32)),
        )

    def test_values_for_the_wrong_column_range_are_refused(self, filled: Storage) -> None:
        self._assert_refused(
            filled,
            ValueError,
            r"\(2, 4\)",
            lambda: filled.accum_or_assign(_keys([1, 5]), np.zeros((2, 4)), columns=(0, 2)),
        )

    def test_non_numeric_values_are_refused(self, filled: Storage) -> None:
        self._assert_refused(
            filled, TypeError, "values", lambda: filled.insert_or_assign(_keys([4]), np.array([["a"] * 4]))
        )

    @pytest.mark.parametrize("columns", [(2, 5), (-1, 2), (3, 3), (3, 1)])
    def test_column_range_outside_the_row_is_refused(self, filled: Storage, columns: tuple[int, int]) -> None:
        self._assert_refused(
            filled,
            ValueError,
            f"\\({columns[0]}, {columns[1]}\\)",
            lambda: filled.insert_or_assign(_keys([1]), np.zeros((1, 1), np.float32), columns=columns),
        )

    def test_column_range_outside_the_row_is_refused_by_reads(self, filled: Storage) -> None:
        self._assert_refused(filled, ValueError, r"\(0, 9\)", lambda: filled.find_or_insert(_keys([9]), columns=(0, 9)))

    @pytest.mark.parametrize(
        ("key_dtype", "bad"),
        [("int64", 2**63), ("int64", 2**64 - 1), ("uint64", -1), ("int32", 2**31), ("int32", -(2**31) - 1)],
    )
    def test_keys_out_of_the_dtype_range_are_refused(
        self, spec: BackendSpec, make_storage: MakeStorage, key_dtype: str, bad: int
    ) -> None:
        _skip_unless_key_dtype(spec, key_dtype)
        storage = make_storage(row_width=1, key_dtype=key_dtype)
        storage.find_or_insert(_keys([1, 2], key_dtype))
        keys = np.array([1, bad], dtype=np.uint64 if bad >= 2**63 else np.int64)
        self._assert_refused(storage, ValueError, str(bad), lambda: storage.insert_or_assign(keys, [[1.0], [2.0]]))

    def test_negative_scores_are_refused(self, filled: Storage) -> None:
        self._assert_refused(
            filled, ValueError, "-3", lambda: filled.insert_or_assign(_keys([4]), np.zeros((1, 4)), scores=[-3])
        )

    def test_scores_are_refused_where_the_backend_computes_them(self, filled: Storage) -> None:
        """The storage of the ``storage`` fixture (default options) computes its own scores."""
        self._assert_refused(
            filled, ValueError, "scores", lambda: filled.insert_or_assign(_keys([4]), np.zeros((1, 4)), scores=[3])
        )

    def test_unknown_option_is_refused(self, make_storage: MakeStorage) -> None:
        with pytest.raises(ValueError, match="no_such_option"):
            make_storage(row_width=2, no_such_option=1)

    def test_bad_option_value_is_refused(
        self, make_storage: MakeStorage, small_capacity_options: dict[str, Any]
    ) -> None:
        name = next(iter(small_capacity_options))
        with pytest.raises(ValueError, match=f"{name}.*not_a_number"):
            make_storage(row_width=2, **{name: "not_a_number"})

    @pytest.mark.parametrize("row_width", [0, -1, 2.5, True])
    def test_bad_row_width_is_refused(self, make_storage: MakeStorage, row_width: Any) -> None:
        with pytest.raises(ValueError, match=f"row_width.*{row_width!r}"):
            make_storage(row_width=row_width)

    @pytest.mark.parametrize("key_dtype", ["float32", "int16", "str"])
    def test_unsupported_key_dtype_is_refused(self, make_storage: MakeStorage, key_dtype: str) -> None:
        with pytest.raises(ValueError, match=key_dtype):
            make_storage(row_width=2, key_dtype=key_dtype)

    def test_bad_export_range_is_refused(self, filled: Storage) -> None:
        with pytest.raises(ValueError, match="-1"):
            filled.export_batch(-1, 10)
