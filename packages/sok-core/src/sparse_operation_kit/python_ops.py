"""Graph ops that call Python functions by name, so that a SavedModel can keep them.

``tf.py_function`` records a token that only the process that traced it knows, so a SavedModel
holding one does not run anywhere else. :func:`py_call` records ``"module:qualname"`` and a context
string; its kernel (``SokPyCall``) imports the module where the graph runs and calls
``function(context, *arrays)`` with NumPy copies of the inputs. :func:`resolved_table_inputs` makes
the first two inputs of the storage ops from such a function, which returns the
:class:`~sparse_operation_kit.table_ref.TableRef` of a table: the kernel (``SokResolveTable``) calls
it the first time it runs and again only when that reference has died, so a graph holding it serves
in another process (a loaded SavedModel) and after its table is replaced, with no Python on the
path in between.

Both kernels run only in a Python process (``tf.saved_model.load`` from Python; not a C++ model
server). A function that raises ``ValueError`` or ``TypeError`` fails the op with
``InvalidArgumentError``, ``RuntimeError`` with ``FailedPreconditionError``, any other exception
with ``UnknownError``; the message names the function, the exception and its text.

Example::

    # mypkg/rows.py
    def scaled(context, keys):                 # context: the string given to py_call
        return np.full((len(keys), 4), float(context), np.float32)

    rows, = py_call("mypkg.rows:scaled", "0.5", [keys], [tf.float32])     # float32 [n, 4]
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from sparse_operation_kit import tf_ops
from sparse_operation_kit.table_ref import TableRef

__all__ = ["py_call", "resolved_table_inputs"]


def py_call(
    function: str, context: str, inputs: Sequence[Any], dtypes: Sequence[tf.DType], name: str | None = None
) -> list[tf.Tensor]:
    """``function(context, *inputs)`` as a graph op (on the host of any device); its results, one
    tensor per dtype of ``dtypes`` (their shapes unknown to the graph).

    Args:
        function: ``"module:qualname"``, importable where the graph runs.
        context: a string the function receives first (e.g. JSON naming what it serves).
        inputs: tensors of numeric or bool dtypes; the function receives NumPy copies.
        dtypes: the results' dtypes. The function returns one array (one dtype) or a sequence;
            each is converted only where NumPy casts it safely (else ``TypeError``).

    Example::

        keys = tf.constant([3, 1], tf.int64)
        found, = py_call("mypkg.rows:known", "", [keys], [tf.bool])
    """
    _function(function)  # a wrong name fails here, where the graph is made
    return tf_ops.python_library().sok_py_call(
        args=list(inputs), Tout=list(dtypes), function=function, context=context, name=name
    )


def resolved_table_inputs(function: str, context: str) -> tuple[tf.Tensor, tf.Tensor]:
    """``(handle, table)``, the first two inputs of a storage op, for the table that
    ``function(context)`` returns (a :class:`TableRef`), made in the graph on the current device.

    The handle is a fresh resource of its own, not a variable's: the graph captures nothing of
    this process (it orders no op on the table after another, which a reader that never writes
    does not need)."""
    _function(function)
    handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[0], shared_name="sok_resolved_table")
    table = tf_ops.python_library().sok_resolve_table(function=function, context=context)
    return handle, table


@functools.cache
def _function(name: str) -> Any:
    """The callable named ``"module:qualname"``."""
    module_name, sep, qualname = name.partition(":")
    if not sep or not module_name or not qualname:
        raise ValueError(f"a Python function for a graph op is named 'module:qualname', got {name!r}")
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"the Python function {name!r} of a graph op cannot be found: {error}") from error
    if not callable(target):
        raise ValueError(f"{name!r} names a {type(target).__name__}, not a function")
    return target


# -- called by the kernels (python_ops.cc) -------------------------------------------------------
def kernel_call(
    function: str, context: str, inputs: list[tuple[memoryview, str, tuple[int, ...]]], dtypes: list[str]
) -> list[np.ndarray]:
    """SokPyCall's body: the inputs (each a view of the tensor's bytes, its NumPy dtype and shape)
    copied into arrays, the function called, its results checked and made C-contiguous."""
    arrays = [np.frombuffer(view, dtype=dtype).reshape(shape).copy() for view, dtype, shape in inputs]
    results = _function(function)(context, *arrays)
    if len(dtypes) == 1 and not isinstance(results, (tuple, list)):
        results = (results,)
    elif results is None:
        results = ()
    if len(results) != len(dtypes):
        raise ValueError(f"{function} returned {len(results)} results; the graph takes {len(dtypes)} ({dtypes})")
    out = []
    for i, (result, dtype) in enumerate(zip(results, dtypes, strict=True)):
        array = np.asarray(result)
        if array.dtype != dtype:
            if not np.can_cast(array.dtype, dtype, casting="safe"):
                raise TypeError(
                    f"{function} returned result {i} of dtype {array.dtype}; the graph takes {dtype}, to which "
                    f"{array.dtype} does not cast safely: return {dtype}"
                )
            array = array.astype(dtype)
        out.append(np.ascontiguousarray(array))
    return out


def kernel_resolve(function: str, context: str) -> int:
    """SokResolveTable's body: the address of the TableRef that ``function(context)`` returns."""
    ref = _function(function)(context)
    if not isinstance(ref, TableRef):
        raise TypeError(f"{function} must return a sparse_operation_kit.table_ref.TableRef, got {type(ref).__name__}")
    return ref.address
