"""One record per optimizer (optimizer.OPTIMIZERS), and its native rules against the op libraries.

Each record's slots, Keras slot attributes and legacy slot names name the same slots as its rule;
each native rule a record's rule gives (``Rule.native``) is one the op libraries run
(``SOK_SPARSE_RULES`` of csrc/tf_ops/sparse_rules.h, embedded in each library as text), with the
same state (blocks as wide as the embedding, floats per row) and hyper-parameters; and every rule
the libraries run is given by some record.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from sparse_operation_kit import optimizer as opt_lib  # noqa: E402
from sparse_operation_kit import tf_ops  # noqa: E402

#: Keras 3 optimizers that give every native rule, and the one they give.
NATIVE_CASES = [
    (lambda: tf.keras.optimizers.SGD(0.1), "sgd"),
    (lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9), "momentum"),
    (lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True), "momentum"),
    (lambda: tf.keras.optimizers.Adagrad(0.1), "adagrad"),
    (lambda: __import__("sparse_operation_kit").RowWiseAdagrad(0.1), "rowwise_adagrad"),
]


def _library_rules(path: Path) -> dict[str, tuple[int, int, int]]:
    """``name -> (state blocks as wide as the embedding, state floats per row, hyper-parameters)``
    of the rule list a library embeds."""
    found = re.findall(rb"sok_tf sparse rules: ([a-z0-9_:,]*)\x00", path.read_bytes())
    assert len(set(found)) == 1, f"{path} embeds {len(found)} rule lists: {found}"
    rules = {}
    for entry in found[0].decode().split(","):
        if entry:
            name, blocks, floats, hyper = entry.split(":")
            rules[name] = (int(blocks), int(floats), int(hyper))
    return rules


def _libraries() -> list[Path]:
    tf_ops.library()
    libs = [Path(tf_ops._LIB_DIR) / "libsok_tf_ops.so"]
    gpu = Path(tf_ops._LIB_DIR) / tf_ops.GPU_LIBRARY
    return libs + ([gpu] if gpu.is_file() else [])


@pytest.mark.parametrize("name", sorted(opt_lib.OPTIMIZERS))
def test_a_record_names_its_rule_slots_everywhere(name: str) -> None:
    import sparse_operation_kit as sok

    record = opt_lib.OPTIMIZERS[name]
    optimizer = (getattr(tf.keras.optimizers, name, None) or getattr(sok, name))()  # sok.RowWiseAdagrad
    rule = record.rule(opt_lib.Settings(optimizer))
    assert rule.name == name
    # The rule's slots of this configuration are among those the record maps (SGD's momentum slot
    # only with momentum, Adam's vhat only with amsgrad); no legacy names where no tf_keras legacy
    # optimizer exists (SOK's own).
    assert {slot for slot, _ in rule.slots} <= set(record.keras_slots)
    assert set(record.legacy_slots) in (set(record.keras_slots), set())
    assert set(rule.per_row) <= {slot for slot, _ in rule.slots}
    for slot, aliases in record.checkpoint_aliases.items():
        assert slot in record.keras_slots and all(len(alias) == 2 for alias in aliases)


@pytest.mark.parametrize("make,native", NATIVE_CASES, ids=[f"{n}-{i}" for i, (_, n) in enumerate(NATIVE_CASES)])
@pytest.mark.parametrize("library", _libraries(), ids=lambda p: p.name)
def test_native_rules_are_the_op_libraries(make, native: str, library: Path) -> None:
    rules = _library_rules(library)
    optimizer = make()
    record = opt_lib.OPTIMIZERS[type(optimizer).__name__]
    rule = record.rule(opt_lib.Settings(optimizer))
    assert rule.native is not None and rule.native[0] == native and native in record.natives
    per_row = len(rule.per_row)
    assert rules[native] == (len(rule.slots) - per_row, per_row, len(rule.native[1]))


@pytest.mark.parametrize("library", _libraries(), ids=lambda p: p.name)
def test_every_library_rule_is_given_by_a_record(library: Path) -> None:
    given = {native for record in opt_lib.OPTIMIZERS.values() for native in record.natives}
    assert set(_library_rules(library)) == given == {native for _, native in NATIVE_CASES}


def test_checkpoint_aliases_come_from_the_records() -> None:
    assert opt_lib.checkpoint_aliases("Adamax", "u") == (("Adamax", "v"), ("Adam", "v"))
    assert opt_lib.checkpoint_aliases("Adam", "m") == ()
    assert opt_lib.checkpoint_aliases("NotAnOptimizer", "m") == ()


def test_an_unknown_native_rule_is_refused_with_the_valid_ones() -> None:
    import sparse_operation_kit as sok

    v = sok.DynamicVariable(dimension=2)
    lib = tf_ops.library()
    keys = tf.constant([1, 2], tf.int64)
    positions = tf.constant([0, 1], tf.int32)
    valid = "valid: sgd, momentum, adagrad, rowwise_adagrad"
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"unknown rule 'adam'; {valid}"):
        lib.sok_sparse_apply(*v.table_inputs, keys, positions, tf.ones([2, 2]), tf.constant(0.1), rule="adam")
