"""``RowLayout``: where the embedding and each optimizer slot sit in a dynamic variable's rows.

A ``sok.DynamicVariable`` that a ``sok.OptimizerWrapper`` updates keeps the optimizer's state in
extra columns of its own storage rows, ``[embedding | slot 1 | slot 2 ...]``, each slot ``dim``
floats wide unless the optimizer keeps less per row (``sok.RowWiseAdagrad``: one float), so that
eviction, export and checkpoints never separate a key's weight from its state. The optimizer
(widening rows, updating them, slot views) and checkpoints (chunk buffers, dumps, loads) take the
column ranges of that layout from here.

This module imports nothing of the package, so any module may use it.

Example::

    >>> layout = RowLayout(4, ("m", "v"))  # Adam's rows for a variable of dimension 4
    >>> layout.width
    12
    >>> layout.embedding
    (0, 4)
    >>> layout.columns("v"), layout.columns(0)
    ((8, 12), (4, 8))
    >>> layout.parts  # the embedding, then each slot: the order of a checkpoint's files
    ((0, 4), (4, 8), (8, 12))
    >>> import numpy as np
    >>> [part.shape for part in layout.split(np.zeros((2, 12)))]
    [(2, 4), (2, 4), (2, 4)]
    >>> RowLayout(4, ("accumulator",), widths=(1,)).parts  # one float of state per row
    ((0, 4), (4, 5))
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["RowLayout"]


@dataclass(frozen=True)
class RowLayout:
    """The column ranges of rows ``[embedding | slot 1 | slot 2 ...]``.

    Args:
        dim: the embedding's width (the variable's dimension), an integer >= 1.
        slots: the optimizer's slot names in row order (none for a variable no optimizer has
            updated); any iterable of distinct strings, kept as a tuple.
        widths: each slot's width in floats, in the order of ``slots``; None (the default) for
            ``dim`` each (an element-wise optimizer's state).

    Raises:
        ValueError: ``dim`` is not an integer >= 1, ``slots`` is not distinct strings, or
            ``widths`` is not one integer >= 1 per slot.
    """

    dim: int
    slots: tuple[str, ...] = ()
    widths: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        dim = self.dim
        try:
            valid = not isinstance(dim, bool) and operator.index(dim) >= 1
        except TypeError:
            valid = False
        if not valid:
            raise ValueError(f"RowLayout dim must be an integer >= 1 (the embedding's width), got {dim!r}")
        object.__setattr__(self, "dim", operator.index(dim))
        slots = self.slots
        if isinstance(slots, str) or not isinstance(slots, Iterable):
            raise ValueError(f"RowLayout slots must be a sequence of slot names, got {slots!r}; pass e.g. ('m', 'v')")
        slots = tuple(slots)
        if not all(isinstance(s, str) for s in slots) or len(set(slots)) != len(slots):
            raise ValueError(f"RowLayout slots must be distinct strings, got {slots!r}")
        object.__setattr__(self, "slots", slots)
        widths = (self.dim,) * len(slots) if self.widths is None else self.widths
        try:
            widths = tuple(operator.index(w) for w in widths if not isinstance(w, bool))
        except TypeError:
            widths = ()
        if len(widths) != len(slots) or any(w < 1 for w in widths):
            raise ValueError(
                f"RowLayout widths must be one integer >= 1 per slot of {list(slots)}, got {self.widths!r}"
            )
        object.__setattr__(self, "widths", widths)

    @property
    def width(self) -> int:
        """Floats per row: ``dim`` plus every slot's width."""
        return self.dim + sum(self.widths)

    @property
    def embedding(self) -> tuple[int, int]:
        """``(0, dim)``: the embedding's column range."""
        return (0, self.dim)

    @property
    def parts(self) -> tuple[tuple[int, int], ...]:
        """The column ranges of the embedding, then of each slot, in row order."""
        bounds = list(itertools.accumulate((self.dim,) + self.widths, initial=0))
        return tuple(zip(bounds[:-1], bounds[1:]))

    @property
    def part_widths(self) -> tuple[int, ...]:
        """The width of the embedding, then of each slot: the row widths of a checkpoint's files."""
        return (self.dim,) + self.widths

    def columns(self, slot: str | int) -> tuple[int, int]:
        """``(begin, end)`` of one slot's columns.

        Args:
            slot: a slot name, or its position in :attr:`slots` (``0`` is the first slot, not the
                embedding; see :attr:`embedding`).

        Raises:
            ValueError: no slot has that name or position; the message names the valid ones.
        """
        if isinstance(slot, str):
            if slot not in self.slots:
                raise ValueError(
                    f"no slot {slot!r} in these rows; valid: {list(self.slots)} (the optimizer's slot names)"
                )
            index = self.slots.index(slot)
        else:
            try:
                index = None if isinstance(slot, bool) else operator.index(slot)
            except TypeError:
                index = None
            if index is None or not 0 <= index < len(self.slots):
                valid = f"0 .. {len(self.slots) - 1}" if self.slots else "none (these rows hold no slots)"
                raise ValueError(
                    f"no slot at position {slot!r} in these rows; valid: a name of {list(self.slots)} "
                    f"or a position {valid}"
                )
        return self.parts[index + 1]

    def split(self, rows: Any) -> list[Any]:
        """``rows [n, width]`` (a NumPy array or a tensor) as ``[embedding [n, dim], slot 1 [n, width 1], ...]``:
        column slices, views where the array type has them."""
        return [rows[:, begin:end] for begin, end in self.parts]
