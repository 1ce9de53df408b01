"""Capacities that hkv cannot take as given are rounded up, as NVIDIA SOK rounds them.

NVIDIA's own DLRM scripts make hybrid tables with capacities such as ``randint(1000, 1200)`` or 64;
hkv's table takes powers of two >= max_bucket_size. The backend declares the rounding
(``Capabilities.adjust_options``); the core logs one line per table naming it and each change, and
the variable's ``repr`` shows them. What cannot be served is still refused.
"""

from __future__ import annotations

import logging

import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit.plugins import Capabilities  # noqa: E402
from sparse_operation_kit.storage import create_storage  # noqa: E402

REASON = "(hkv takes powers of two >= max_bucket_size 128)"
STORAGE_LOGGER = "sparse_operation_kit.storage"


def _logged(caplog) -> list[str]:
    """The INFO lines of sok-core's storage module."""
    return [text for name, level, text in caplog.record_tuples if (name, level) == (STORAGE_LOGGER, logging.INFO)]


@pytest.mark.parametrize(
    ("init", "max_", "init_used", "max_used"),
    [(1000, 1200, 1024, 2048), (64, 64, 128, 128), (1100, 1100, 2048, 2048), (1000, 1024, 1024, 1024)],
)
def test_hybrid_capacities_are_rounded_up_logged_once_and_shown(init, max_, init_used, max_used, caplog):
    with caplog.at_level(logging.INFO, logger=STORAGE_LOGGER):
        v = sok.DynamicVariable(dimension=4, var_type="hybrid", name="emb", init_capacity=init, max_capacity=max_)
    assert v.storage.capacity() == init_used
    assert f"capacity {init_used} of max {max_used} " in repr(v.storage)  # the table's repr: what it uses
    changes = [f"{n}={given} rounded up to {used} {REASON}" for n, given, used in
               (("init_capacity", init, init_used), ("max_capacity", max_, max_used)) if given != used]  # fmt: skip
    assert _logged(caplog) == [f"hybrid table 'emb' (backend hkv): {'; '.join(changes)}"]
    assert v.storage.adjustments == tuple(changes)
    assert repr(v).endswith(f" options: {'; '.join(changes)}>")
    sok.assign(v, tf.constant([1, 2, 3], tf.int64), tf.ones([3, 4]))  # the table works
    assert v.storage.size() == 3


def test_a_storage_without_a_name_is_logged_by_its_var_type(caplog):
    with caplog.at_level(logging.INFO, logger=STORAGE_LOGGER):
        create_storage("hybrid", row_width=1, init_capacity=1000)
    assert _logged(caplog) == [f"hybrid table (backend hkv): init_capacity=1000 rounded up to 1024 {REASON}"]


def test_only_the_capacity_that_needs_it_is_rounded():
    v = sok.DynamicVariable(dimension=2, var_type="hybrid", init_capacity=1024, max_capacity=1100)
    assert v.storage.adjustments == (f"max_capacity=1100 rounded up to 2048 {REASON}",)
    assert v.storage.capacity() == 1024


def test_valid_capacities_are_taken_as_given_and_not_logged(caplog):
    with caplog.at_level(logging.INFO, logger=STORAGE_LOGGER):
        v = sok.DynamicVariable(dimension=2, var_type="hybrid", init_capacity=1024, max_capacity=4096)
    assert v.storage.adjustments == () and "options:" not in repr(v)
    assert _logged(caplog) == []


def test_an_init_capacity_past_max_capacity_after_rounding_is_refused():
    # Both are rounded, then checked: init 1100 rounds to 2048, past max_capacity 1024.
    with pytest.raises(
        ValueError,
        match=r"init_capacity=2048 must be a power of two between .* and max_capacity \(1024\).*"
        r"\(the options given were adjusted first: init_capacity=1100 rounded up to 2048 ",
    ):
        sok.DynamicVariable(dimension=2, var_type="hybrid", init_capacity=1100, max_capacity=1024)


def test_a_bucket_size_below_128_is_the_smallest_capacity():
    v = sok.DynamicVariable(dimension=2, var_type="hybrid", init_capacity=40, max_capacity=100, max_bucket_size=32)
    assert (v.storage.capacity(), v.storage.adjustments) == (
        64,
        (
            "init_capacity=40 rounded up to 64 (hkv takes powers of two >= max_bucket_size 32)",
            "max_capacity=100 rounded up to 128 (hkv takes powers of two >= max_bucket_size 32)",
        ),
    )


@pytest.mark.parametrize(("max_", "used"), [(64, 128), (1000, 1024), (1024, 1024), (4000, 4096)])
def test_a_max_capacity_alone_below_the_default_init_capacity_is_the_init_capacity(max_, used, caplog):
    # hkv's default init_capacity is 8192: with a smaller max_capacity given alone it would be refused.
    with caplog.at_level(logging.INFO, logger=STORAGE_LOGGER):
        v = sok.DynamicVariable(dimension=2, var_type="hybrid", name="alone", max_capacity=max_)
    assert v.storage.capacity() == used
    assert f"capacity {used} of max {used} " in repr(v.storage)
    assert v.storage.adjustments[-1] == f"init_capacity (not given, default 8192) set to max_capacity {used}"
    assert _logged(caplog) == [f"hybrid table 'alone' (backend hkv): {'; '.join(v.storage.adjustments)}"]


@pytest.mark.parametrize(("max_", "changes"), [(8191, (f"max_capacity=8191 rounded up to 8192 {REASON}",)), (8192, ())])
def test_a_max_capacity_alone_at_least_the_default_init_capacity_leaves_it(max_, changes):
    v = sok.DynamicVariable(dimension=2, var_type="hybrid", max_capacity=max_)
    assert (v.storage.capacity(), v.storage.adjustments) == (8192, changes)


def test_a_backend_without_the_capability_gets_the_options_unchanged():
    v = sok.DynamicVariable(dimension=2, var_type="hbm", init_capacity=1000)
    assert v.storage.adjustments == () and "options:" not in repr(v)
    assert Capabilities().adjusted_options({"init_capacity": "1000"}) == ({"init_capacity": "1000"}, ())


@pytest.mark.parametrize("option", ["init_capacity", "max_capacity"])
@pytest.mark.parametrize(
    ("value", "named"),
    [
        (0, r"{option}=0 must be a power of two"),
        (-1, r"{option}=-1 must be a power of two"),
        (True, r"{option}='true' is not an integer"),
        (1.5, r"{option}='1\.5' is not an integer"),
        ("lots", r"{option}='lots' is not an integer"),
        (2**62 + 1, r"{option}=4611686018427387905 must be a power of two"),
        (2**70, r"{option}='1180591620717411303424' is not an integer"),
    ],
)
def test_capacities_that_cannot_be_served_are_refused_naming_the_value(option, value, named, caplog):
    with caplog.at_level(logging.INFO, logger=STORAGE_LOGGER):
        with pytest.raises(ValueError, match=named.format(option=option)) as caught:
            sok.DynamicVariable(dimension=2, var_type="hybrid", **{option: value})
    assert "adjusted" not in str(caught.value) and _logged(caplog) == []


def test_a_rounded_capacity_beyond_memory_is_refused_naming_the_value_given():
    # Rows of 2**30 floats (4 GiB) for 2**20 keys: 4 PiB, beyond any address space.
    with pytest.raises(MemoryError) as caught:
        create_storage("hybrid", row_width=2**30, init_capacity=2**20 - 1, max_capacity=2**20)
    message = str(caught.value)
    assert f"capacity {2**20:,} x rows of 1,073,741,824 floats" in message
    assert f"(the options given were adjusted first: init_capacity={2**20 - 1} rounded up to {2**20} " in message
