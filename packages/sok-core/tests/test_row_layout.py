"""RowLayout: the column ranges of rows ``[embedding | slot 1 | slot 2 ...]``.

The oracle for the value is NumPy: a row numbered ``0 .. width-1`` cut at the layout's ranges
must give back consecutive ``dim``-wide blocks. The oracle for the optimizer's use of it is the
public paths that existed before it: a ``DynamicSlot``'s columns, the storage's row width, and
the raw rows ``sok.assign`` on a slot writes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sparse_operation_kit.row_layout import RowLayout

LAYOUTS = [(1, ()), (4, ()), (4, ("accumulator",)), (3, ("m", "v")), (2, ("m", "v", "vhat"))]


@pytest.mark.parametrize("dim, slots", LAYOUTS)
def test_width_is_the_embedding_and_one_block_per_slot(dim, slots):
    assert RowLayout(dim, slots).width == dim * (1 + len(slots))


@pytest.mark.parametrize("dim, slots", LAYOUTS)
def test_parts_tile_the_row_in_order(dim, slots):
    layout = RowLayout(dim, slots)
    row = np.arange(layout.width)
    blocks = np.split(row, 1 + len(slots))
    assert [tuple(row[b:e]) for b, e in layout.parts] == [tuple(block) for block in blocks]
    assert layout.parts[0] == layout.embedding == (0, dim)


@pytest.mark.parametrize("dim, slots", LAYOUTS)
def test_columns_by_name_and_by_position_agree_with_parts(dim, slots):
    layout = RowLayout(dim, slots)
    for i, name in enumerate(slots):
        assert layout.columns(name) == layout.columns(i) == layout.columns(np.int64(i)) == layout.parts[i + 1]


@pytest.mark.parametrize("dim, slots", LAYOUTS)
def test_split_numpy_gives_views_of_each_part(dim, slots):
    layout = RowLayout(dim, slots)
    rows = np.arange(2 * layout.width, dtype=np.float32).reshape(2, layout.width)
    parts = layout.split(rows)
    assert len(parts) == 1 + len(slots)
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), rows)
    assert all(np.shares_memory(part, rows) for part in parts)


def test_split_tensor():
    tf = pytest.importorskip("tensorflow")
    layout = RowLayout(2, ("m", "v"))
    rows = tf.reshape(tf.range(12, dtype=tf.float32), [2, 6])
    parts = layout.split(rows)
    np.testing.assert_array_equal(tf.concat(parts, axis=1).numpy(), rows.numpy())
    assert [p.shape.as_list() for p in parts] == [[2, 2]] * 3


def test_unknown_slot_name_names_it_and_the_valid_ones():
    with pytest.raises(ValueError, match=r"no slot 'u' in these rows; valid: \['m', 'v'\]"):
        RowLayout(4, ("m", "v")).columns("u")


@pytest.mark.parametrize("position", [2, -1, True, 1.0])
def test_slot_position_out_of_range_names_the_valid_ones(position):
    with pytest.raises(ValueError, match=rf"no slot at position {position!r}.*valid: .*\['m', 'v'\].*0 \.\. 1"):
        RowLayout(4, ("m", "v")).columns(position)


def test_rows_without_slots_have_no_slot_columns():
    with pytest.raises(ValueError, match=r"no slot at position 0 .*none \(these rows hold no slots\)"):
        RowLayout(4).columns(0)


@pytest.mark.parametrize("dim", [0, -1, 2.5, True, "4", None])
def test_dim_must_be_a_positive_integer(dim):
    with pytest.raises(ValueError, match=rf"RowLayout dim must be an integer >= 1 .*got {dim!r}"):
        RowLayout(dim)


def test_numpy_integer_dim_and_list_slots_are_normalised():
    layout = RowLayout(np.int64(4), ["m", "v"])
    assert type(layout.dim) is int and layout.slots == ("m", "v")
    assert layout == RowLayout(4, ("m", "v")) and hash(layout) == hash(RowLayout(4, ("m", "v")))


@pytest.mark.parametrize("slots", ["mv", ("m", "m"), ("m", 1), 3])
def test_slots_must_be_distinct_names(slots):
    with pytest.raises(ValueError, match="RowLayout slots must be"):
        RowLayout(4, slots)


def test_is_immutable():
    layout = RowLayout(4, ("m",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.dim = 8


# -- the optimizer's rows, through the public paths that predate RowLayout ----------------------


@pytest.mark.parametrize("legacy", [False, True])
def test_bound_variable_reports_the_layout_columns(legacy):
    tf = pytest.importorskip("tensorflow")
    import sparse_operation_kit as sok

    if legacy:
        tf_keras = pytest.importorskip("tf_keras")
        optimizer = tf_keras.optimizers.legacy.Adamax(0.1)  # its slots: "m", "v" (the wrapper's "m", "u")
    else:
        optimizer = tf.keras.optimizers.Adam(0.1)  # slots "m", "v"
    v = sok.DynamicVariable(dimension=3, var_type="hbm", initializer="zeros")
    wrapper = sok.OptimizerWrapper(optimizer)
    keys = tf.constant([1, 5], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, keys))
    wrapper.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    layout = RowLayout(v.dimension, wrapper.get_slot_names())
    assert v.storage.row_width == layout.width == 9
    for name in wrapper.get_slot_names():
        slot = wrapper.slot_view(v, name)
        assert slot.columns == layout.columns(name)
        sok.assign(slot, keys, tf.fill([2, 3], float(layout.slots.index(name) + 7)))

    raw_keys, raw_rows, _ = v.storage.export(columns=(0, layout.width))
    exported_keys, embeddings = (t.numpy() for t in sok.export(v))
    weights, *states = layout.split(raw_rows[np.argsort(raw_keys)])
    np.testing.assert_array_equal(weights, embeddings[np.argsort(exported_keys)])
    for i, state in enumerate(states):
        np.testing.assert_array_equal(state, np.full((2, 3), i + 7, np.float32))


@pytest.mark.parametrize("dim, widths", [(4, (1,)), (3, (3, 1)), (2, (1, 1, 2))])
def test_slot_widths_tile_the_row_in_order(dim, widths):
    """A per-row slot (sok.RowWiseAdagrad's accumulator) is one column wide: the parts are the
    NumPy split of the row at the cumulative widths."""
    slots = tuple(f"s{i}" for i in range(len(widths)))
    layout = RowLayout(dim, slots, widths)
    assert layout.width == dim + sum(widths)
    assert layout.part_widths == (dim, *widths)
    row = np.arange(layout.width)
    blocks = np.split(row, np.cumsum((dim, *widths))[:-1])
    assert [tuple(row[b:e]) for b, e in layout.parts] == [tuple(block) for block in blocks]
    assert [layout.columns(name) for name in slots] == list(layout.parts[1:])
    assert [part.shape for part in layout.split(np.zeros((2, layout.width)))] == [(2, w) for w in (dim, *widths)]


def test_default_widths_are_the_dimension_and_equal_given_ones():
    assert RowLayout(3, ("m", "v")).widths == (3, 3)
    assert RowLayout(3, ("m", "v")) == RowLayout(3, ("m", "v"), (3, 3))


@pytest.mark.parametrize("widths", [(), (1, 1), (0,), (-1,), (1.5,), (True,), "1"])
def test_widths_must_be_one_positive_integer_per_slot(widths):
    with pytest.raises(ValueError, match=r"RowLayout widths must be one integer >= 1 per slot of \['m'\]"):
        RowLayout(4, ("m",), widths)
