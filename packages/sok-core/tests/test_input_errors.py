"""Bad input to DynamicVariable, create_storage and OptimizerWrapper: a Python exception that names
the argument, its value, what is valid and how to fix it (never a pybind11 signature dump, a bare
std::bad_alloc or a TensorFlow Reshape error), and nothing half-changed.
"""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import optimizer as optimizer_module  # noqa: E402
from sparse_operation_kit.dtypes import KEY_DTYPES  # noqa: E402
from sparse_operation_kit.storage import MAX_ROW_WIDTH, create_storage  # noqa: E402
from sparse_operation_kit.testing.abi_fields import field_offset  # noqa: E402

VAR_TYPES = ["hbm", "hybrid"]
OPTIONS = {"hbm": {}, "hybrid": {"init_capacity": 1024, "max_capacity": 1 << 16}}
#: Rows of 2**30 floats (4 GiB) for 2**20 keys: 4 PiB, beyond any address space, so the allocation
#: fails whatever the machine's overcommit setting.
HUGE = {"dimension": 2**30, "init_capacity": 2**20}


def make_var(var_type: str, dimension: int = 4, **kwargs) -> sok.DynamicVariable:
    return sok.DynamicVariable(dimension=dimension, var_type=var_type, **OPTIONS[var_type], **kwargs)


def sorted_rows(var) -> tuple[np.ndarray, np.ndarray]:
    keys, values = sok.export(var)
    order = np.argsort(keys.numpy(), kind="stable")
    return keys.numpy()[order], values.numpy()[order]


# -- a gradient of the wrong width --------------------------------------------------------------


def seeded(var_type: str) -> sok.DynamicVariable:
    v = make_var(var_type, dimension=3, initializer="zeros", name="table")
    sok.assign(v, tf.constant([1, 2], tf.int64), np.arange(6, dtype=np.float32).reshape(2, 3))
    return v


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_gradient_of_the_wrong_width_names_the_variable_shape_and_width(var_type, mode):
    v = seeded(var_type)
    before = sorted_rows(v)
    opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1))

    def step():
        opt.apply_gradients([(tf.IndexedSlices(tf.ones([2, 4]), tf.constant([1, 2], tf.int64)), v)])

    step = tf.function(step) if mode == "function" else step
    with pytest.raises(ValueError, match=r"gradient of table:0 has values of shape \(2, 4\).* dimension 3.*\[n, 3\]"):
        step()
    for a, b in zip(sorted_rows(v), before, strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(opt.iterations.numpy()) == 0


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_gradient_width_known_only_when_the_step_runs_is_checked_then(var_type):
    v = seeded(var_type)
    before = sorted_rows(v)
    opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def step(values):
        opt.apply_gradients([(tf.IndexedSlices(values, tf.constant([1, 2], tf.int64)), v)])

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"gradient of table:0 has values of shape .*\[n, 3\]"):
        step(tf.ones([2, 4]))
    for a, b in zip(sorted_rows(v), before, strict=True):
        np.testing.assert_array_equal(a, b)
    step(tf.ones([2, 3]))  # the right width passes the same check
    np.testing.assert_allclose(sorted_rows(v)[1], before[1] - 0.1)


def test_gradient_with_more_rows_than_ids_is_refused():
    v = seeded("hbm")
    opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match=r"gradient of table:0 has 3 rows .* but 2 ids"):
        opt.apply_gradients([(tf.IndexedSlices(tf.ones([3, 3]), tf.constant([1, 2], tf.int64)), v)])


def test_a_bad_dynamic_gradient_leaves_the_dense_variables_of_the_call_alone():
    v = seeded("hbm")
    w = tf.Variable([1.0, 2.0])
    opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.5))
    bad = tf.IndexedSlices(tf.ones([2, 5]), tf.constant([1, 2], tf.int64))
    with pytest.raises(ValueError, match="gradient of table:0"):
        opt.apply_gradients([(tf.constant([1.0, 1.0]), w), (bad, v)])
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])


# -- dimension: the C ABI's limit, and allocation failures --------------------------------------


@pytest.mark.parametrize("dimension", [2**31, 0, -1, True, 2.0, "4", None])
def test_dimension_out_of_range_or_not_an_int_names_the_limit(dimension):
    pattern = rf"dimension must be an integer in 1 \.\. {MAX_ROW_WIDTH} .*got {re.escape(repr(dimension))}"
    with pytest.raises(ValueError, match=pattern):
        sok.DynamicVariable(dimension=dimension)


def test_max_row_width_is_the_c_abi_int32():
    assert MAX_ROW_WIDTH == np.iinfo(np.int32).max


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_row_width_beyond_the_c_abi_is_a_value_error_not_a_signature_dump(var_type):
    with pytest.raises(ValueError, match=rf"row_width {MAX_ROW_WIDTH + 1} is too wide; valid: 1 \.\. {MAX_ROW_WIDTH}"):
        create_storage(var_type, row_width=MAX_ROW_WIDTH + 1)


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_table_too_large_to_allocate_is_a_memory_error_with_its_size(var_type):
    with pytest.raises(MemoryError) as caught:
        sok.DynamicVariable(var_type=var_type, name="huge", **HUGE)
    message = str(caught.value)
    assert "bad_alloc" not in message
    assert "DynamicVariable 'huge' of dimension 1,073,741,824" in message
    # The capacity is the backend's for these options: that of a narrow table made with them.
    capacity = create_storage(var_type, row_width=1, init_capacity=HUGE["init_capacity"]).capacity()
    row_bytes = 4 * HUGE["dimension"]
    assert f"capacity {capacity:,} x rows of 1,073,741,824 floats ({row_bytes:,} bytes)" in message
    assert f"about {capacity * row_bytes:,} bytes" in message
    assert "pass a smaller init_capacity" in message and "smaller dimension" in message


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_storage_too_large_to_allocate_is_a_memory_error_chained_to_the_backends(var_type):
    # (TensorFlow drops the chain of exceptions raised in a variable's constructor; a storage keeps it.)
    with pytest.raises(MemoryError, match=rf"out of memory allocating a var_type '{var_type}' table") as caught:
        create_storage(var_type, row_width=HUGE["dimension"], init_capacity=HUGE["init_capacity"])
    assert "bytes" in str(caught.value)
    assert isinstance(caught.value.__cause__, MemoryError)
    assert "out of memory" in str(caught.value.__cause__)


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_native_table_reports_out_of_memory_with_the_backends_message(var_type):
    # the binding (csrc/table/py_table.hpp): SOK_ERROR_OUT_OF_MEMORY is a MemoryError carrying last_error.
    from sparse_operation_kit.plugins import get_registry

    make = get_registry().factory(var_type)
    with pytest.raises(MemoryError, match="out of memory") as caught:
        make("int64", HUGE["dimension"], {"init_capacity": str(HUGE["init_capacity"])})
    assert "bad_alloc" not in str(caught.value)


def test_optimizer_state_beyond_the_row_limit_names_the_largest_dimension(monkeypatch):
    # A real variable that wide cannot be allocated: the limit is lowered to the width of a small one.
    monkeypatch.setattr(optimizer_module, "MAX_ROW_WIDTH", 10)
    v = sok.DynamicVariable(dimension=4, initializer="zeros", name="wide")
    opt = sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.1))  # 2 slots: rows of 12 floats
    grad = tf.IndexedSlices(tf.ones([1, 4]), tf.constant([7], tf.int64))
    with pytest.raises(ValueError, match=r"wide:0 \(dimension 4\) is too wide for Adam.*12 floats.*at most 3"):
        opt.apply_gradients([(grad, v)])
    assert v.storage.row_width == 4  # not widened


# -- ids and key types --------------------------------------------------------------------------

VALID_KEY_TYPES = ", ".join(f"tf.{name}" for name in KEY_DTYPES)


@pytest.mark.parametrize("key_type", [tf.float32, tf.string, "float64", "foo"])
def test_key_type_that_is_not_an_integer_names_the_valid_ones_and_the_fix(key_type):
    with pytest.raises(ValueError) as caught:
        sok.DynamicVariable(dimension=2, key_type=key_type)
    message = str(caught.value)
    assert message.startswith(f"key_type {key_type!r} is not supported; valid: {VALID_KEY_TYPES};")
    assert "tf.cast(ids, tf.int64)" in message


def lookups(var):
    ids = {"float32": tf.constant([1.0, 2.0]), "float64": tf.constant([1.0], tf.float64), "string": tf.constant(["a"])}
    return [
        ("embedding_lookup float32", lambda: tf.nn.embedding_lookup(var, ids["float32"]), "float32"),
        ("embedding_lookup of a list of floats", lambda: tf.nn.embedding_lookup(var, [1.5]), "float32"),
        ("sparse_read float64", lambda: var.sparse_read(ids["float64"]), "float64"),
        ("sparse_read string", lambda: var.sparse_read(ids["string"]), "string"),
        (
            "embedding_lookup in tf.function",
            lambda: tf.function(lambda: tf.nn.embedding_lookup(var, ids["float32"]))(),
            "float32",
        ),
    ]


@pytest.mark.parametrize("case", range(5))
def test_ids_that_are_not_integers_name_the_valid_key_types_and_the_cast(case):
    v = sok.DynamicVariable(dimension=2, name="emb")
    _, read, dtype = lookups(v)[case]
    with pytest.raises(TypeError) as caught:
        read()
    message = str(caught.value)
    assert f"ids (indices) of emb:0 have dtype {dtype}, which is not a key type" in message
    assert f"valid key types: {VALID_KEY_TYPES}" in message
    assert "key_type=" not in message  # no key_type to suggest: none takes these ids
    if dtype == "string":
        assert "tf.strings.to_number(ids, tf.int64)" in message
        assert "tf.strings.to_hash_bucket_fast" in message
    else:
        assert "tf.cast(ids, tf.int64)" in message
    assert int(v.size.numpy()[0]) == 0  # nothing inserted


def test_ids_of_another_key_type_suggest_that_key_type():
    v = sok.DynamicVariable(dimension=2, name="emb")
    with pytest.raises(TypeError, match=r"dtype uint64 but its key_type is int64; .*key_type=tf\.uint64"):
        v.sparse_read(tf.constant([1], tf.uint64))
    # and the suggestion is valid:
    u = sok.DynamicVariable(dimension=2, key_type=tf.uint64)
    assert u.sparse_read(tf.constant([1], tf.uint64)).shape == (1, 2)


# -- other constructor arguments ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"dtype": "banana"}, ValueError, r"dtype 'banana' is not supported; valid: tf\.float32"),
        ({"dtype": tf.float64}, ValueError, r"dtype tf\.float64 is not supported; valid: tf\.float32"),
        ({"var_type": "foo"}, ValueError, r"unknown var_type 'foo'; installed var_types: .*'hbm'"),
        ({"initializer": "gaussian"}, ValueError, r"initializer 'gaussian' is not valid; valid: random, "),
        ({"mode": "local"}, ValueError, r"mode 'local' is not valid; valid: None, 'distributed' or 'localized:N'"),
        (
            {"var_type": "hybrid", "init_capacity": 0},
            ValueError,
            r"init_capacity=0 must be a power of two between max_bucket_size \(128\) .*; for example 128",
        ),
        ({"init_capacity": -1}, ValueError, r"init_capacity=-1 is out of range; valid: 1 \.\. 2\*\*40"),
        ({"no_such_option": 1}, ValueError, r"unknown option 'no_such_option' for backend det; valid options: "),
    ],
)
def test_bad_constructor_argument_names_it_and_the_valid_values(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        sok.DynamicVariable(dimension=2, **kwargs)


@pytest.mark.parametrize("optimizer", ["sgd", None])
def test_optimizer_that_is_not_an_optimizer_object_is_named(optimizer):
    with pytest.raises(ValueError, match=rf"optimizer {re.escape(repr(optimizer))} \(not an optimizer\).*valid: "):
        sok.OptimizerWrapper(optimizer)


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_hint_bits_outside_the_abi_are_refused_by_the_binding_and_the_c_abi(var_type):
    # The binding (csrc/table/py_table.hpp) and the ABI adapter (sok/kit/abi_adapter.hpp) both check
    # the bits, in one wording (sok::unknown_hints), naming what is valid; nothing is written.
    from sparse_operation_kit import _table, table_ref

    storage = create_storage(var_type, row_width=4)
    keys, values = np.array([1], np.int64), np.ones((1, 4), np.float32)
    expected = "has bits the storage ABI does not define; valid: a combination of SOK_HINT_UNIQUE_KEYS = 1"
    with pytest.raises(ValueError, match=f"hints=2 {expected}"):
        storage.table.insert_or_assign_hinted(keys, 0, 4, values, None, [], 2)
    api, handle = table_ref.native_pointers(storage)
    hinted = ctypes.c_void_p.from_address(api + field_offset("insert_or_assign_hinted")).value
    last_error = ctypes.c_void_p.from_address(api + field_offset("last_error")).value
    c = ctypes
    call = c.CFUNCTYPE(
        c.c_int, c.c_void_p, c.c_void_p, c.c_int64, c.c_void_p, c.c_int32, c.c_int32,
        c.c_void_p, c.c_void_p, c.c_void_p, c.c_int32, c.c_uint32,
    )(hinted)  # fmt: skip
    context = (c.c_int32 * 4)()  # sok_exec_context: CPU, device 0, null stream
    status = call(handle, c.addressof(context), 1, keys.ctypes.data, 0, 4, values.ctypes.data, None, None, 0, 6)
    message = c.CFUNCTYPE(c.c_char_p, c.c_void_p)(last_error)(handle).decode()
    assert status == 1, message  # SOK_ERROR_INVALID_ARGUMENT
    assert f"hints=6 {expected}" in message
    storage.table.insert_or_assign_hinted(keys, 0, 4, values, None, [], _table.HINT_UNIQUE_KEYS)
    assert storage.size() == 1


# sok_device_rows_visitor: int32 (void* user_data, int64 n, float* const* rows, const sok_exec_context* ctx)
_ROWS_VISITOR = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_find_or_insert_rows_checks_its_arguments_and_a_cpu_table_declines_it(var_type):
    # find_or_insert_rows lends device rows (CUDA tables): the ABI adapter checks the call first,
    # and a CPU table then declines with SOK_ERROR_UNSUPPORTED, inserting nothing and visiting nothing.
    from sparse_operation_kit import table_ref

    storage = create_storage(var_type, row_width=4)
    api, handle = table_ref.native_pointers(storage)
    c = ctypes
    assert c.c_uint32.from_address(api + 4).value > field_offset("find_or_insert_rows")  # struct_size covers it
    call = c.CFUNCTYPE(
        c.c_int, c.c_void_p, c.c_void_p, c.c_int64, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_int32,
        c.c_void_p, c.c_void_p,
    )(c.c_void_p.from_address(api + field_offset("find_or_insert_rows")).value)  # fmt: skip
    last_error = c.CFUNCTYPE(c.c_char_p, c.c_void_p)(c.c_void_p.from_address(api + field_offset("last_error")).value)
    visits = []
    visit = _ROWS_VISITOR(lambda user_data, n, rows, ctx: visits.append(n) or 0)
    context = (c.c_int32 * 4)()  # sok_exec_context: CPU, device 0, null stream
    keys = np.array([1, 2], np.int64)

    status = call(handle, c.addressof(context), 2, keys.ctypes.data, None, None, None, 0, None, None)
    assert status == 1, last_error(handle)  # SOK_ERROR_INVALID_ARGUMENT
    assert "visit is null" in last_error(handle).decode()
    status = call(handle, c.addressof(context), -1, keys.ctypes.data, None, None, None, 0, visit, None)
    assert status == 1 and "n must be >= 0, got -1" in last_error(handle).decode()
    status = call(handle, c.addressof(context), 2, keys.ctypes.data, None, None, None, 0, visit, None)
    assert status == 3, last_error(handle)  # SOK_ERROR_UNSUPPORTED
    assert "no find_or_insert_rows" in last_error(handle).decode()
    assert visits == [] and storage.size() == 0


def test_row_wise_state_beyond_the_row_limit_names_the_largest_dimension(monkeypatch):
    # sok.RowWiseAdagrad keeps one float per row: a dimension of MAX_ROW_WIDTH - 1 still fits.
    monkeypatch.setattr(optimizer_module, "MAX_ROW_WIDTH", 10)
    v = sok.DynamicVariable(dimension=10, initializer="zeros", name="wide_rows")
    opt = sok.OptimizerWrapper(sok.RowWiseAdagrad(0.1))
    grad = tf.IndexedSlices(tf.ones([1, 10]), tf.constant([7], tf.int64))
    with pytest.raises(ValueError, match=r"too wide for RowWiseAdagrad.*11 floats.*at most 9 with"):
        opt.apply_gradients([(grad, v)])
    assert v.storage.row_width == 10  # not widened
