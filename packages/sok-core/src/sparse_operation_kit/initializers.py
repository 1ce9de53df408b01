"""How new rows of a storage are filled, and the NumPy reference of the random stream.

An initializer fills columns ``[begin, end)`` of every newly inserted row. Random values are a
pure function of ``(seed, key, column)``: the same on every backend, device, thread count and
batch order, so a table can be rebuilt or resharded and get the same initial rows. The stream is
defined in ``sok/kit/initializers.hpp`` (C++); :func:`init_rows` here is its NumPy mirror, used by
pure-Python backends and as the oracle of the conformance suite.

Example::

    >>> import numpy as np
    >>> init_rows(np.array([1, 2]), [constant(3.0)], width=2)
    array([[3., 3.],
           [3., 3.]], dtype=float32)
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "InitKind",
    "Initializer",
    "constant",
    "uniform",
    "normal",
    "truncated_normal",
    "from_string",
    "init_rows",
]

#: What ``"random"`` means for every backend: U[-0.05, 0.05), as NVIDIA SOK's DET.
RANDOM_RANGE = 0.05


class InitKind(enum.IntEnum):
    """Kinds of initializers, numbered as ``sok_init_kind`` in the C ABI."""

    CONSTANT = 0
    UNIFORM = 1
    NORMAL = 2
    TRUNCATED_NORMAL = 3


@dataclass(frozen=True)
class Initializer:
    """Fills columns ``columns`` (all when None) of new rows.

    Args:
        kind: the distribution.
        a: constant value, uniform low, or normal mean.
        b: uniform high or normal stddev (unused for constants).
        seed: seed of the random stream (unused for constants).
        columns: ``(begin, end)`` column range, or None for the whole row.
    """

    kind: InitKind
    a: float = 0.0
    b: float = 0.0
    seed: int = 0
    columns: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and math.isfinite(self.b)):
            raise ValueError(f"initializer parameters must be finite, got a={self.a!r}, b={self.b!r}")
        if self.kind == InitKind.UNIFORM and self.a > self.b:
            raise ValueError(f"uniform initializer needs low <= high, got low={self.a!r}, high={self.b!r}")
        if self.kind in (InitKind.NORMAL, InitKind.TRUNCATED_NORMAL) and self.b < 0:
            raise ValueError(f"normal initializer needs stddev >= 0, got {self.b!r}")
        if not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed!r}")

    def resolve(self, width: int) -> tuple[int, int, int, float, float, int]:
        """The ABI tuple ``(kind, begin, end, a, b, seed)`` for rows of ``width`` floats."""
        begin, end = self.columns if self.columns is not None else (0, width)
        if not 0 <= begin <= end <= width:
            raise ValueError(f"initializer columns {self.columns!r} do not fit rows of width {width}")
        return (int(self.kind), begin, end, float(self.a), float(self.b), int(self.seed))


def constant(value: float, columns: tuple[int, int] | None = None) -> Initializer:
    """Every value is ``value``."""
    return Initializer(InitKind.CONSTANT, float(value), 0.0, 0, columns)


def uniform(low: float, high: float, seed: int = 0, columns: tuple[int, int] | None = None) -> Initializer:
    """U[low, high)."""
    return Initializer(InitKind.UNIFORM, float(low), float(high), seed, columns)


def normal(
    mean: float = 0.0, stddev: float = 1.0, seed: int = 0, columns: tuple[int, int] | None = None
) -> Initializer:
    """N(mean, stddev)."""
    return Initializer(InitKind.NORMAL, float(mean), float(stddev), seed, columns)


def truncated_normal(
    mean: float = 0.0, stddev: float = 1.0, seed: int = 0, columns: tuple[int, int] | None = None
) -> Initializer:
    """N(mean, stddev) redrawn outside mean +- 2 stddev (Keras ``TruncatedNormal``)."""
    return Initializer(InitKind.TRUNCATED_NORMAL, float(mean), float(stddev), seed, columns)


_NAMED = ("random", "uniform", "normal", "zeros", "ones")


def from_string(spec: str, seed: int = 0) -> Initializer:
    """The initializer named by an SOK initializer string.

    ``"random"`` and ``"uniform"`` are U[-0.05, 0.05) on every backend, ``"normal"`` is N(0, 1),
    ``"zeros"``/``"ones"`` and a number such as ``"13"`` are constants.

    Example::

        >>> from_string("13")
        Initializer(kind=<InitKind.CONSTANT: 0>, a=13.0, b=0.0, seed=0, columns=None)
    """
    text = spec.strip().lower()
    if text in ("", "random", "uniform"):
        return uniform(-RANDOM_RANGE, RANDOM_RANGE, seed)
    if text == "normal":
        return normal(0.0, 1.0, seed)
    if text == "zeros":
        return constant(0.0)
    if text == "ones":
        return constant(1.0)
    try:
        value = float(text)
    except ValueError:
        raise ValueError(
            f"initializer {spec!r} is not valid; valid: {', '.join(_NAMED)} or a number such as '0.5'"
        ) from None
    if not math.isfinite(value):
        raise ValueError(f"initializer {spec!r} is not a finite number")
    return constant(value)


# --- the NumPy reference of the random stream (mirrors sok/kit/initializers.hpp) ---------------

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _uniform01(seed: int, keys: np.ndarray, col: int, draw: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        base = _mix64(keys ^ _mix64(np.uint64(seed)))
        r = _mix64(base + np.uint64((col << 8) | draw))
    return (r >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _normal01(seed: int, keys: np.ndarray, col: int, attempt: int) -> np.ndarray:
    u1 = 1.0 - _uniform01(seed, keys, col, 2 * attempt)
    u2 = _uniform01(seed, keys, col, 2 * attempt + 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)


_TRUNCATED_ATTEMPTS = 64


def key_bits(keys: np.ndarray) -> np.ndarray:
    """Keys as the 64-bit patterns the storages hash (int32 keys sign-extended)."""
    keys = np.asarray(keys)
    if keys.dtype == np.uint64:
        return keys
    return keys.astype(np.int64).view(np.uint64)


def init_rows(keys: np.ndarray, initializers: Sequence[Initializer], width: int) -> np.ndarray:
    """New rows for ``keys`` as a storage makes them: zeros, then each initializer in order."""
    bits = key_bits(keys)
    rows = np.zeros((bits.shape[0], width), dtype=np.float32)
    for init in initializers:
        kind, begin, end, a, b, seed = init.resolve(width)
        for col in range(begin, end):
            if kind == InitKind.CONSTANT:
                rows[:, col] = np.float32(a)
            elif kind == InitKind.UNIFORM:
                rows[:, col] = (a + (b - a) * _uniform01(seed, bits, col, 0)).astype(np.float32)
            elif kind == InitKind.NORMAL:
                rows[:, col] = (a + b * _normal01(seed, bits, col, 0)).astype(np.float32)
            else:
                z = _normal01(seed, bits, col, 0)
                for attempt in range(1, _TRUNCATED_ATTEMPTS):
                    redraw = np.abs(z) > 2.0
                    if not redraw.any():
                        break
                    z = np.where(redraw, _normal01(seed, bits, col, attempt), z)
                rows[:, col] = (a + b * np.clip(z, -2.0, 2.0)).astype(np.float32)
    return rows
