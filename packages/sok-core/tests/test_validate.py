"""sparse_operation_kit.validate: the one definition of "an integer >= 1"."""

from __future__ import annotations

import numpy as np
import pytest
from sparse_operation_kit.validate import is_positive_int, positive_int


@pytest.mark.parametrize("value", [1, 7, 2**40, np.int64(3), np.uint8(1), np.int32(2**31 - 1)])
def test_integers_from_one_up_pass_and_come_back_as_python_ints(value):
    assert is_positive_int(value)
    result = positive_int(value, "row_width")
    assert result == value and type(result) is int


@pytest.mark.parametrize("value", [0, -1, np.int64(0), True, False, np.bool_(True), 1.0, 2.5, "3", None, [1]])
def test_everything_else_is_refused_naming_the_argument_and_the_value(value):
    assert not is_positive_int(value)
    with pytest.raises(ValueError) as error:
        positive_int(value, "slot_num")
    assert str(error.value) == f"slot_num must be an integer >= 1, got {value!r}"


def test_numpy_false_takes_python_ints_only():
    assert is_positive_int(4, numpy=False)
    assert not is_positive_int(np.int64(4), numpy=False)
    assert not is_positive_int(True, numpy=False)
    with pytest.raises(ValueError, match=r"dim must be an integer >= 1, got np\.int64\(4\)"):
        positive_int(np.int64(4), "dim", numpy=False)
