"""Graph ops that call registered Python functions by name, so that a SavedModel can keep them.

``tf.py_function`` records a token that only the process that traced it knows, so a SavedModel
holding one does not run anywhere else. :func:`py_call` records a function's name,
``"module:qualname"``, and a context string; its kernel (``SokPyCall``) calls
``function(context, *arrays)`` with NumPy copies of the inputs. :func:`resolved_table_inputs` makes
the first two inputs of the storage ops from such a function, which returns the
:class:`~sparse_operation_kit.table_ref.TableRef` of a table: the kernel (``SokResolveTable``) calls
it the first time it runs and again only when that reference has died, so a graph holding it serves
in another process (a loaded SavedModel) and after its table is replaced, with no Python on the
path in between.

Only functions registered with :func:`register` run. The name a graph holds is looked up in the
registry and nowhere else: no module is imported and no attribute read on a graph's say, so a
SavedModel naming ``builtins:exec`` or ``os:system`` runs nothing. The module that registers a
function must be imported where the graph runs, before it runs (``import
hierarchical_parameter_server`` registers the functions of HPS's lookup graphs). A name that is not
registered fails :func:`py_call` where the graph is made and the op where it runs, with
:class:`UnregisteredFunctionError` (``InvalidArgumentError`` in the graph).

Both kernels run only in a Python process (``tf.saved_model.load`` from Python; not a C++ model
server). A function that raises ``ValueError`` or ``TypeError`` fails the op with
``InvalidArgumentError``, ``RuntimeError`` with ``FailedPreconditionError``, any other exception
with ``UnknownError``; the message names the function, the exception and its text.

Example::

    # mypkg/rows.py
    from sparse_operation_kit import python_ops

    @python_ops.register                      # named "mypkg.rows:scaled"
    def scaled(context, keys):                # context: the string given to py_call
        return np.full((len(keys), 4), float(context), np.float32)

    rows, = py_call("mypkg.rows:scaled", "0.5", [keys], [tf.float32])     # float32 [n, 4]
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import tensorflow as tf

from sparse_operation_kit import tf_ops
from sparse_operation_kit.table_ref import TableRef

__all__ = ["UnregisteredFunctionError", "py_call", "register", "resolved_table_inputs"]

F = TypeVar("F", bound=Callable[..., Any])

#: ``"module:qualname"`` -> the function, for every function that graphs may call.
_registry: dict[str, Callable[..., Any]] = {}
_registry_lock = threading.Lock()


class UnregisteredFunctionError(ValueError):
    """A graph names a function that was not registered with :func:`register`."""


def _name_of(function: Callable[..., Any]) -> str:
    """The name graphs call ``function`` by: ``"module:qualname"``."""
    module, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise ValueError(
            f"graphs call functions by 'module:qualname', and {function!r} has no such name that another process "
            f"can register too (module {module!r}, qualname {qualname!r}): register a function defined at the "
            "top level of a module, or a method of a class defined there"
        )
    return f"{module}:{qualname}"


def register(function: F) -> F:
    """Let graphs call ``function`` by its name, ``"module:qualname"``; returns it (a decorator). The
    module that registers it must be imported wherever a graph naming it runs. Registering a name
    again (a reloaded module) replaces the function.

    Raises:
        ValueError: ``function`` has no ``module:qualname`` name (a lambda, a local function).

    Example::

        @python_ops.register
        def known(context, keys):            # named "mypkg.rows:known" in mypkg/rows.py
            return np.isin(keys, [1, 2])
    """
    name = _name_of(function)
    with _registry_lock:
        _registry[name] = function
    return function


def py_call(
    function: str, context: str, inputs: Sequence[Any], dtypes: Sequence[tf.DType], name: str | None = None
) -> list[tf.Tensor]:
    """``function(context, *inputs)`` as a graph op (on the host of any device); its results, one
    tensor per dtype of ``dtypes`` (their shapes unknown to the graph).

    Args:
        function: ``"module:qualname"`` of a function registered with :func:`register` (also
            where the graph runs).
        context: a string the function receives first (e.g. JSON naming what it serves).
        inputs: tensors of numeric or bool dtypes; the function receives NumPy copies.
        dtypes: the results' dtypes. The function returns one array (one dtype) or a sequence;
            each is converted only where NumPy casts it safely (else ``TypeError``).

    Raises:
        UnregisteredFunctionError: ``function`` is not registered.

    Example::

        keys = tf.constant([3, 1], tf.int64)
        found, = py_call("mypkg.rows:known", "", [keys], [tf.bool])
    """
    _function(function)  # an unregistered name fails here, where the graph is made
    tf_ops.python_library()  # the Python dispatch of the op
    return tf_ops.library().sok_py_call(
        args=list(inputs), Tout=list(dtypes), function=function, context=context, name=name
    )


def resolved_table_inputs(function: str, context: str) -> tuple[tf.Tensor, tf.Tensor]:
    """``(handle, table)``, the first two inputs of a storage op, for the table that
    ``function(context)`` returns (a :class:`TableRef`; ``function`` registered as for
    :func:`py_call`), made in the graph on the current device.

    The handle is a fresh resource of its own, not a variable's: the graph captures nothing of
    this process (it orders no op on the table after another, which a reader that never writes
    does not need).

    Raises:
        UnregisteredFunctionError: ``function`` is not registered."""
    _function(function)
    handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[0], shared_name="sok_resolved_table")
    tf_ops.python_library()  # the Python dispatch of the op
    table = tf_ops.library().sok_resolve_table(function=function, context=context)
    return handle, table


def _function(name: str) -> Callable[..., Any]:
    """The registered function of ``name``; never imported or looked up anywhere else, for the
    name may come from a graph."""
    with _registry_lock:
        function = _registry.get(name)
    if function is None:
        raise UnregisteredFunctionError(
            f"the Python function {name!r} is not registered: only functions registered with "
            "sparse_operation_kit.python_ops.register run in a graph. Decorate the function with "
            "@python_ops.register in its module and import that module before the graph runs (for HPS's "
            "graphs: import hierarchical_parameter_server); a graph naming any other function is refused"
        )
    return function


# -- called by the kernels (python_ops.cc) -------------------------------------------------------
def kernel_call(
    function: str, context: str, inputs: list[tuple[memoryview, str, tuple[int, ...]]], dtypes: list[str]
) -> list[np.ndarray]:
    """SokPyCall's body: the registered function found, the inputs (each a view of the tensor's
    bytes, its NumPy dtype and shape) copied into arrays, the function called, its results checked
    and made C-contiguous."""
    call = _function(function)
    arrays = [np.frombuffer(view, dtype=dtype).reshape(shape).copy() for view, dtype, shape in inputs]
    results = call(context, *arrays)
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
    """SokResolveTable's body: the address of the TableRef that the registered ``function(context)``
    returns."""
    ref = _function(function)(context)
    if not isinstance(ref, TableRef):
        raise TypeError(f"{function} must return a sparse_operation_kit.table_ref.TableRef, got {type(ref).__name__}")
    return ref.address
