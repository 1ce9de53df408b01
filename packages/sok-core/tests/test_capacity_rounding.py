"""Capacities that hkv cannot take as given are rounded up, as NVIDIA SOK rounds them.

NVIDIA's own DLRM scripts make hybrid tables with capacities such as ``randint(1000, 1200)`` or 64;
hkv's table takes powers of two >= max_bucket_size. The backend declares the rounding
(``Capabilities.adjust_options``); the core logs each change and the variable's ``repr`` shows it.
What cannot be served is still refused.
"""

from __future__ import annotations

import logging

import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit.plugins import Capabilities  # noqa: E402


@pytest.mark.parametrize(
    ("given", "capacity"),
    [({"init_capacity": 1100, "max_capacity": 1100}, 2048), ({"init_capacity": 64, "max_capacity": 64}, 128)],
)
def test_hybrid_capacities_are_rounded_up_logged_and_shown(given, capacity, caplog):
    with caplog.at_level(logging.INFO, logger="sparse_operation_kit.storage"):
        v = sok.DynamicVariable(dimension=4, var_type="hybrid", **given)
    assert v.storage.capacity() == capacity
    notes = [r.getMessage() for r in caplog.records if "rounded up" in r.getMessage()]
    assert len(notes) == 2 and all(f"rounded up to {capacity}" in n for n in notes)
    assert f"init_capacity={given['init_capacity']} rounded up to {capacity}" in repr(v)
    sok.assign(v, tf.constant([1, 2, 3], tf.int64), tf.ones([3, 4]))  # the table works
    assert v.storage.size() == 3


def test_only_the_capacity_that_needs_it_is_rounded():
    v = sok.DynamicVariable(dimension=2, var_type="hybrid", init_capacity=1024, max_capacity=1100)
    assert v.storage.adjustments == (
        "max_capacity=1100 rounded up to 2048 (hkv takes powers of two >= max_bucket_size 128)",
    )
    assert v.storage.capacity() == 1024


def test_an_init_capacity_past_max_capacity_is_still_refused():
    # init 1100 rounds to 2048, past the given max_capacity 1024 (which needs no rounding): the user's
    # init_capacity was already larger than max_capacity, and hkv refuses it.
    with pytest.raises(
        ValueError,
        match=r"init_capacity=2048 must be a power of two between .* and max_capacity \(1024\).*"
        r"\(the options given were adjusted first: init_capacity=1100 rounded up to 2048 ",
    ):
        sok.DynamicVariable(dimension=2, var_type="hybrid", init_capacity=1100, max_capacity=1024)


def test_rounding_never_takes_init_capacity_past_max_capacity():
    v = sok.DynamicVariable(dimension=2, var_type="hybrid", init_capacity=3000, max_capacity=3000)
    assert v.storage.capacity() == 4096
    v = sok.DynamicVariable(dimension=2, var_type="hybrid", init_capacity=100, max_capacity=100, max_bucket_size=64)
    assert v.storage.capacity() == 128  # 100 -> 128, a power of two >= the bucket size 64


def test_a_backend_without_the_capability_gets_the_options_unchanged():
    v = sok.DynamicVariable(dimension=2, var_type="hbm", init_capacity=1000)
    assert v.storage.adjustments == () and "options:" not in repr(v)
    assert Capabilities().adjusted_options({"init_capacity": "1000"}) == ({"init_capacity": "1000"}, ())


def test_a_capacity_too_large_to_round_is_refused_as_given():
    too_large = 2**62 + 1
    with pytest.raises(ValueError, match=rf"max_capacity={too_large} must be a power of two") as caught:
        sok.DynamicVariable(dimension=2, var_type="hybrid", max_capacity=too_large)
    assert "adjusted" not in str(caught.value)
