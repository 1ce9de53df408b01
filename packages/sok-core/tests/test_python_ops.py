"""Graph ops that call Python by name (sparse_operation_kit.python_ops): SokPyCall and SokResolveTable.

* Only registered functions run: a name that no one registered (``builtins:exec``, ``os:system``,
  a function of this module left unregistered) is refused where a graph is made and, in a graph
  made with the raw op, when it runs (eager, and in a SavedModel served by a fresh process),
  without the function being called.
* SokPyCall passes NumPy copies of its inputs (every dtype it takes, empty and 0-d ones) and
  returns the function's arrays, eager and in tf.function; results convert only where NumPy casts
  safely; a Python exception fails the op with the mapped TensorFlow error and the function's
  message; a name that cannot be found fails where the graph is made.
* A SavedModel with SokPyCall serves in a fresh process (tf.py_function's cannot).
* SokResolveTable: the storage ops read the table the function returns; the kernel calls the
  function once while that table lives and again once it is released (a replaced table is served
  by the same graph); a function that returns something else, or a dead table, fails cleanly.
"""

from __future__ import annotations

import importlib
import shlex
import subprocess
import sys
import textwrap

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import python_ops, tf_ops  # noqa: E402

HERE = __name__  # the functions below are registered by this name

DTYPES = [tf.float32, tf.float64, tf.float16, tf.int8, tf.uint8, tf.int16, tf.uint16, tf.int32, tf.uint32]
DTYPES += [tf.int64, tf.uint64, tf.bool]


@python_ops.register
def echo_plus_one(context, *arrays):
    """Each array + 1 (bools negated), and the context as a float."""
    out = [np.logical_not(a) if a.dtype == bool else a + a.dtype.type(1) for a in arrays]
    return (*out, np.float32(float(context)))


@python_ops.register
def keys_and_width(context, keys):
    return np.full((len(keys), int(context)), 2.5, np.float32), keys.astype(np.int64) * 10


@python_ops.register
def returns_float64(context, keys):
    return keys.astype(np.float64)


@python_ops.register
def returns_two(context, keys):
    return keys, keys


@python_ops.register
def raises(context, keys):
    kind = {"value": ValueError, "runtime": RuntimeError, "key": KeyError}[context]
    raise kind(f"no rows for {keys.tolist()}")


def not_registered(context, keys):
    return keys


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_py_call_passes_copies_of_every_dtype_and_returns_the_functions_arrays(graph):
    rng = np.random.default_rng(0)
    inputs = [
        tf.constant(rng.integers(0, 2 if d == tf.bool else 100, size=(2, 3)).astype(d.as_numpy_dtype)) for d in DTYPES
    ]
    inputs += [tf.zeros([0, 4], tf.int64), tf.constant(7, tf.int32)]  # empty, 0-d
    dtypes = [t.dtype for t in inputs] + [tf.float32]

    def call(*args):
        return python_ops.py_call(f"{HERE}:echo_plus_one", "0.25", list(args), dtypes)

    results = (tf.function(call) if graph else call)(*inputs)
    want = echo_plus_one("0.25", *[t.numpy() for t in inputs])
    assert len(results) == len(want)
    for got, expected, dtype in zip(results, want, dtypes, strict=True):
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.numpy(), expected)


def test_py_call_converts_results_only_where_numpy_casts_safely():
    keys = tf.constant([3, 1, 2], tf.int32)
    rows, scaled = python_ops.py_call(f"{HERE}:keys_and_width", "4", [keys], [tf.float32, tf.int64])
    np.testing.assert_array_equal(rows.numpy(), np.full((3, 4), 2.5, np.float32))
    np.testing.assert_array_equal(scaled.numpy(), [30, 10, 20])  # int64 result: the graph's dtype
    with pytest.raises(tf.errors.InvalidArgumentError, match="returned 2 results; the graph takes 1"):
        python_ops.py_call(f"{HERE}:returns_two", "", [keys], [tf.int64])
    with pytest.raises(tf.errors.InvalidArgumentError, match="dtype float64; the graph takes float32"):
        python_ops.py_call(f"{HERE}:returns_float64", "", [keys], [tf.float32])


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("value", tf.errors.InvalidArgumentError),
        ("runtime", tf.errors.FailedPreconditionError),
        ("key", tf.errors.UnknownError),
    ],
)
def test_a_python_exception_fails_the_op_with_its_message(kind, error):
    step = tf.function(lambda keys: python_ops.py_call(f"{HERE}:raises", kind, [keys], [tf.float32]))
    with pytest.raises(error, match=r"SokPyCall of .*:raises: \w+Error: .*no rows for \[4, 2\]"):
        step(tf.constant([4, 2], tf.int64))


@pytest.mark.parametrize(
    "name",
    ["no_colon", f"{HERE}:missing", "no.such.module:f", f"{HERE}:DTYPES", ":f", f"{HERE}:not_registered", "os:system"],
)
def test_a_function_that_is_not_registered_fails_where_the_graph_is_made(name):
    with pytest.raises(python_ops.UnregisteredFunctionError, match=rf"{name!r} is not registered.*python_ops.register"):
        python_ops.py_call(name, "", [tf.constant([1])], [tf.int32])
    with pytest.raises(python_ops.UnregisteredFunctionError, match=rf"{name!r} is not registered"):
        python_ops.resolved_table_inputs(name, "")


def test_only_functions_with_a_module_level_name_register():
    def local(context):
        return context

    for function in (lambda context: context, local):
        with pytest.raises(ValueError, match="has no such name that another process can register"):
            python_ops.register(function)
    assert python_ops.register(echo_plus_one) is echo_plus_one


#: Functions a graph could name to run anything, and a context that makes them create a file.
ANY_CODE = {
    "builtins:exec": lambda marker: f"open({marker!r}, 'w').close()",
    "builtins:eval": lambda marker: f"open({marker!r}, 'w').close()",
    "os:system": lambda marker: f"touch {shlex.quote(marker)}",
}


@pytest.mark.parametrize("function", sorted(ANY_CODE))
def test_a_graph_naming_an_unregistered_function_is_refused_when_it_runs(tmp_path, function):
    """The raw ops (no Python-side check where the graph is made), eager and in a tf.function."""
    marker = tmp_path / "ran"
    context = ANY_CODE[function](str(marker))
    raw = tf_ops.python_library()
    refused = rf"{function!r} is not registered: only functions registered with .*python_ops.register run"
    calls = {
        "SokPyCall": lambda: raw.sok_py_call(args=[], Tout=[tf.int32], function=function, context=context),
        "SokResolveTable": lambda: raw.sok_resolve_table(function=function, context=context),
    }
    for op, call in calls.items():
        for run in (call, tf.function(call)):
            with pytest.raises(tf.errors.InvalidArgumentError, match=rf"{op} (of|by) {function}: .*{refused}"):
                run()
    assert not marker.exists()


SERVE = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf
    from sparse_operation_kit import tf_ops
    tf_ops.python_library()  # registers the ops the SavedModel names
    sys.path.insert(0, sys.argv[2])
    import rows_of  # registers the function the SavedModel names
    loaded = tf.saved_model.load(sys.argv[1])
    print(loaded.rows(tf.constant([5, 6], tf.int32)).numpy().tolist())
    """
)


def test_a_savedmodel_with_py_call_serves_in_a_fresh_process(tmp_path):
    module_dir = tmp_path / "code"
    module_dir.mkdir()
    (module_dir / "rows_of.py").write_text(
        "import numpy as np\n"
        "from sparse_operation_kit import python_ops\n\n"
        "@python_ops.register\n"
        "def rows(context, keys):\n"
        "    return np.outer(keys, np.ones(2)).astype(np.float32) + float(context)\n"
    )
    sys.path.insert(0, str(module_dir))
    try:
        importlib.import_module("rows_of")
        module = tf.Module()
        module.rows = tf.function(
            lambda keys: python_ops.py_call("rows_of:rows", "0.5", [keys], [tf.float32])[0],
            input_signature=[tf.TensorSpec([None], tf.int32)],
        )
        np.testing.assert_array_equal(module.rows(tf.constant([1], tf.int32)).numpy(), [[1.5, 1.5]])
        tf.saved_model.save(module, str(tmp_path / "saved"))
    finally:
        sys.path.remove(str(module_dir))
        sys.modules.pop("rows_of", None)
    run = subprocess.run(
        [sys.executable, "-c", SERVE, str(tmp_path / "saved"), str(module_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "[[5.5, 5.5], [6.5, 6.5]]"


SERVE_ANY_CODE = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    from sparse_operation_kit import tf_ops
    tf_ops.python_library()  # registers the ops the SavedModel names
    loaded = tf.saved_model.load(sys.argv[1])
    for endpoint in ("call", "resolve"):
        try:
            getattr(loaded, endpoint)()
            print(endpoint, "ran")
        except tf.errors.InvalidArgumentError as error:
            print(endpoint, "refused:", " ".join(error.message.split()))
    """
)


def test_a_savedmodel_naming_an_unregistered_function_is_refused_in_a_fresh_process(tmp_path):
    marker = tmp_path / "ran"
    context = ANY_CODE["builtins:exec"](str(marker))
    raw = tf_ops.python_library()
    module = tf.Module()
    module.call = tf.function(
        lambda: raw.sok_py_call(args=[], Tout=[tf.int32], function="builtins:exec", context=context),
        input_signature=[],
    )
    module.resolve = tf.function(
        lambda: raw.sok_resolve_table(function="builtins:exec", context=context), input_signature=[]
    )
    tf.saved_model.save(module, str(tmp_path / "saved"))
    run = subprocess.run(
        [sys.executable, "-c", SERVE_ANY_CODE, str(tmp_path / "saved")], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()[-2:]
    assert [line.split(" ", 2)[:2] for line in lines] == [["call", "refused:"], ["resolve", "refused:"]], lines
    assert all("'builtins:exec' is not registered" in line for line in lines), lines
    assert not marker.exists()


# -- SokResolveTable -------------------------------------------------------------------------------
_tables: dict[str, sok.DynamicVariable] = {}
_resolutions: list[str] = []


@python_ops.register
def resolve(context):
    _resolutions.append(context)
    return _tables[context].table_ref


@python_ops.register
def resolve_not_a_table(context):
    return 42


def _variable(value: float) -> sok.DynamicVariable:
    var = sok.DynamicVariable(dimension=2, var_type="hbm", initializer=str(value))
    var.sparse_read(tf.constant([1, 2], tf.int64))  # rows 1 and 2 exist
    return var


def test_resolved_tables_are_read_by_the_storage_ops_and_resolved_again_once_released():
    _resolutions.clear()
    _tables["t"] = _variable(1.0)

    @tf.function
    def find(keys):
        inputs = python_ops.resolved_table_inputs(f"{HERE}:resolve", "t")
        return tf_ops.library().sok_find(*inputs, keys, col_begin=0, col_end=2)

    keys = tf.constant([1, 3, 2], tf.int64)
    for _ in range(3):
        values, found = find(keys)
        np.testing.assert_array_equal(found.numpy(), [True, False, True])
        np.testing.assert_array_equal(values.numpy(), [[1, 1], [0, 0], [1, 1]])
    assert _resolutions == ["t"]  # cached while the table lives
    old = _tables["t"]
    _tables["t"] = _variable(7.0)
    old.table_ref.release()
    values, _ = find(keys)
    np.testing.assert_array_equal(values.numpy(), [[7, 7], [0, 0], [7, 7]])
    assert _resolutions == ["t", "t"]
    assert not any(op.type == "EagerPyFunc" for op in find.get_concrete_function(keys).graph.get_operations())


def test_a_resolver_that_returns_no_live_table_fails_cleanly():
    with pytest.raises(tf.errors.InvalidArgumentError, match="must return a sparse_operation_kit.table_ref.TableRef"):
        python_ops.resolved_table_inputs(f"{HERE}:resolve_not_a_table", "")
    _tables["dead"] = _variable(1.0)
    _tables["dead"].table_ref.release()
    with pytest.raises(tf.errors.FailedPreconditionError, match="not alive"):
        python_ops.resolved_table_inputs(f"{HERE}:resolve", "dead")
    with pytest.raises(tf.errors.UnknownError, match="KeyError"):
        python_ops.resolved_table_inputs(f"{HERE}:resolve", "never made")
