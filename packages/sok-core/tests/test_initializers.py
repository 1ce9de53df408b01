"""Initializer strings and the NumPy reference of the random stream."""

from __future__ import annotations

import numpy as np
import pytest
from sparse_operation_kit import initializers as inits


@pytest.mark.parametrize(
    ("spec", "kind", "a", "b"),
    [
        ("random", inits.InitKind.UNIFORM, -0.05, 0.05),
        ("", inits.InitKind.UNIFORM, -0.05, 0.05),
        ("uniform", inits.InitKind.UNIFORM, -0.05, 0.05),
        ("normal", inits.InitKind.NORMAL, 0.0, 1.0),
        ("zeros", inits.InitKind.CONSTANT, 0.0, 0.0),
        ("ones", inits.InitKind.CONSTANT, 1.0, 0.0),
        ("13", inits.InitKind.CONSTANT, 13.0, 0.0),
        (" -0.5 ", inits.InitKind.CONSTANT, -0.5, 0.0),
    ],
)
def test_from_string(spec, kind, a, b):
    init = inits.from_string(spec)
    assert (init.kind, init.a, init.b) == (kind, a, b)


@pytest.mark.parametrize("spec", ["rnd", "nan", "inf", "1e400"])
def test_from_string_rejects(spec):
    with pytest.raises(ValueError, match="initializer"):
        inits.from_string(spec)


def test_invalid_parameters_are_refused():
    with pytest.raises(ValueError, match="low <= high"):
        inits.uniform(1.0, 0.0)
    with pytest.raises(ValueError, match="stddev >= 0"):
        inits.normal(0.0, -1.0)
    with pytest.raises(ValueError, match="seed"):
        inits.uniform(0, 1, seed=-1)


def test_random_stream_depends_on_key_column_and_seed_only():
    keys = np.array([0, 1, -1, 2**40], dtype=np.int64)
    a = inits.init_rows(keys, [inits.uniform(-1, 1, seed=7)], 5)
    b = inits.init_rows(keys[::-1].copy(), [inits.uniform(-1, 1, seed=7)], 5)[::-1]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, inits.init_rows(keys, [inits.uniform(-1, 1, seed=8)], 5))
    assert len(np.unique(a)) == a.size


def test_uniform_and_normal_have_the_right_moments():
    keys = np.arange(200_000, dtype=np.int64)
    u = inits.init_rows(keys, [inits.uniform(-0.05, 0.05, seed=1)], 1)
    assert u.min() >= -0.05 and u.max() < 0.05 and abs(u.mean()) < 1e-3
    n = inits.init_rows(keys, [inits.normal(2.0, 3.0, seed=1)], 1)
    assert abs(n.mean() - 2.0) < 0.05 and abs(n.std() - 3.0) < 0.05
    t = inits.init_rows(keys, [inits.truncated_normal(0.0, 1.0, seed=1)], 1)
    assert np.abs(t).max() <= 2.0 and 0.85 < t.std() < 0.9


def test_later_initializers_override_column_ranges():
    rows = inits.init_rows(np.array([3]), [inits.constant(1.0), inits.constant(2.0, columns=(1, 3))], 4)
    np.testing.assert_array_equal(rows, [[1.0, 2.0, 2.0, 1.0]])


def test_uint64_and_int32_keys_hash_as_their_64_bit_patterns():
    as_int64 = inits.init_rows(np.array([-1, 5], dtype=np.int64), [inits.uniform(0, 1, seed=3)], 2)
    as_uint64 = inits.init_rows(np.array([2**64 - 1, 5], dtype=np.uint64), [inits.uniform(0, 1, seed=3)], 2)
    as_int32 = inits.init_rows(np.array([-1, 5], dtype=np.int32), [inits.uniform(0, 1, seed=3)], 2)
    np.testing.assert_array_equal(as_int64, as_uint64)
    np.testing.assert_array_equal(as_int64, as_int32)
