"""``sok.DynamicVariable``: a hash-table embedding that behaves as a ``tf.Variable`` where SOK's does.

Rows live in a storage of the backend chosen by ``var_type`` (``"hbm"``: det, ``"hybrid"``: hkv, or a
plugin's name). Every read is a find-or-insert: looking up a new key inserts it with the
initializer's row. ``tf.nn.embedding_lookup``, ``sparse_read``, ``tf.GradientTape`` (gradients are
``tf.IndexedSlices`` over raw keys) and ``tf.function`` work; updates go through
``sok.OptimizerWrapper``.

Example::

    >>> import tensorflow as tf
    >>> import sparse_operation_kit as sok
    >>> v = sok.DynamicVariable(dimension=3, initializer="13")
    >>> tf.nn.embedding_lookup(v, tf.constant([0, 1, 2**40], dtype=tf.int64)).numpy()[0]
    array([13., 13., 13.], dtype=float32)
    >>> v.size.numpy()
    array([3, 3], dtype=int32)
"""

from __future__ import annotations

import abc
import itertools
import re
import secrets
import weakref
from typing import Any, Protocol

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import tape as tape_lib
from tensorflow.python.framework import indexed_slices as indexed_slices_lib
from tensorflow.python.framework import ops as tf_ops_lib
from tensorflow.python.framework import random_seed
from tensorflow.python.ops import resource_variable_ops

from sparse_operation_kit import communication, device_ops, placement, tf_ops
from sparse_operation_kit import initializers as inits
from sparse_operation_kit.dtypes import KEY_DTYPES
from sparse_operation_kit.row_layout import RowLayout
from sparse_operation_kit.serving_table import ServingCopy, saving, writing_saved_model
from sparse_operation_kit.storage import MAX_ROW_WIDTH, Storage, create_storage
from sparse_operation_kit.table_ref import TableRef
from sparse_operation_kit.validate import is_positive_int

__all__ = ["DynamicVariable", "export", "assign", "sparse_read_and_evict"]

#: var_type when none is given (the seed API's documented default).
DEFAULT_VAR_TYPE = "hbm"

#: The key dtypes of a DynamicVariable (those of every storage, ``dtypes.KEY_DTYPES``) → their names.
_KEY_TYPES = {tf.as_dtype(name): name for name in KEY_DTYPES}
_VALID_KEY_TYPES = ", ".join(f"tf.{name}" for name in KEY_DTYPES)
_MODE = re.compile(r"^(distributed|localized:(\d+))$")
#: Numbers the names of unnamed DynamicVariables: sok_dynamic_Variable_0, _1, ...
_unnamed = itertools.count()


def _as_dtype(value: Any) -> tf.DType | None:
    """``tf.as_dtype(value)``, or None where TensorFlow knows no such dtype."""
    try:
        return tf.as_dtype(value)
    except TypeError:
        return None


def _key_dtype(key_type: Any) -> tf.DType:
    dtype = tf.int64 if key_type is None else _as_dtype(key_type)
    if dtype not in _KEY_TYPES:
        raise ValueError(
            f"key_type {key_type!r} is not supported; valid: {_VALID_KEY_TYPES}; keys are integers: keep "
            f"key_type=tf.int64 (the default) and cast the ids to int64 (tf.cast(ids, tf.int64))"
        )
    return dtype


def _filter_ratio(value: Any) -> float:
    """The ``filter_ratio`` option: a number in [0, 1]."""
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not 0.0 <= float(value) <= 1.0
    ):
        raise ValueError(
            f"filter_ratio {value!r} is not valid; valid: a number in [0, 1], the probability that "
            f"sok.lookup_sparse(..., use_low_frequency_filter=True) admits an occurrence of a new key "
            f"(1.0, the default, admits every key; 0 admits none)"
        )
    return float(value)


def _seed() -> int:
    """A seed for random initializers: from tf.random.set_seed when set, else fresh entropy."""
    global_seed, op_seed = random_seed.get_seed(None)
    if global_seed is None:
        return secrets.randbits(63)
    return (int(global_seed) * 1_000_003 + int(op_seed)) % 2**63


def _keras_initializer(initializer: Any, seed: int) -> inits.Initializer | None:
    """The storage initializer equivalent to a Keras initializer object, or None if unknown."""
    config = initializer.get_config() if hasattr(initializer, "get_config") else {}
    name = type(initializer).__name__
    seed = config.get("seed") if config.get("seed") is not None else seed
    if name in ("Zeros", "zeros"):
        return inits.constant(0.0)
    if name in ("Ones", "ones"):
        return inits.constant(1.0)
    if name == "Constant":
        value = np.asarray(config.get("value", 0.0))
        if value.size == 1:
            return inits.constant(float(value.reshape(-1)[0]))
    if name == "RandomUniform":
        return inits.uniform(config.get("minval", -0.05), config.get("maxval", 0.05), int(seed))
    if name == "RandomNormal":
        return inits.normal(config.get("mean", 0.0), config.get("stddev", 0.05), int(seed))
    if name == "TruncatedNormal":
        return inits.truncated_normal(config.get("mean", 0.0), config.get("stddev", 0.05), int(seed))
    return None


def resolve_initializer(initializer: Any) -> tuple[inits.Initializer, str]:
    """The storage initializer and its SOK string for a DynamicVariable's ``initializer`` argument."""
    seed = _seed()
    if initializer is None:
        initializer = "random"
    if isinstance(initializer, str):
        return inits.from_string(initializer, seed=seed), initializer
    if isinstance(initializer, (int, float, np.number)) and not isinstance(initializer, bool):
        return inits.constant(float(initializer)), str(float(initializer))
    if isinstance(initializer, inits.Initializer):
        return initializer, repr(initializer)
    resolved = _keras_initializer(initializer, seed)
    if resolved is None:
        raise ValueError(
            f"initializer {initializer!r} is not supported; valid: 'random' (U[-0.05, 0.05)), 'normal', "
            f"'uniform', 'zeros', 'ones', a number or a number as a string, or a Keras Zeros, Ones, Constant "
            f"(scalar), RandomUniform, RandomNormal or TruncatedNormal initializer"
        )
    return resolved, type(initializer).__name__


class OptimizerOwner(Protocol):
    """What a dynamic variable knows of the optimizer wrapper whose state columns its rows hold:
    ``sok.OptimizerWrapper`` (:mod:`sparse_operation_kit.optimizer`, which builds on this module) is
    the one kind. The variable keeps it as :attr:`DynamicVariable.optimizer_wrapper` and reads only
    its name, for messages."""

    @property
    def name(self) -> str:
        """The optimizer's name in SOK checkpoints (``"Adagrad"``)."""


class DynamicVariable(resource_variable_ops.UninitializedVariable):
    """An embedding table of unbounded key space, stored in a hash table.

    Args:
        dimension: embedding width, 1 .. 2**31 - 1 (``storage.MAX_ROW_WIDTH``); the rows of a
            variable an optimizer updates also hold its state, so ``dimension * (1 + slots)`` must
            fit too.
        initializer: how new rows are filled: ``"random"`` (U[-0.05, 0.05), the default, on every
            backend), ``"normal"``, ``"uniform"``, ``"zeros"``, ``"ones"``, a number (or one as a
            string, e.g. ``"13"``), or a Keras initializer. Random rows are a function of the key
            and the seed: reproducible under ``tf.random.set_seed``.
        var_type: ``"hbm"`` (det, default), ``"hybrid"`` (hkv) or a plugin's var_type.
        name: variable name; default ``sok_dynamic_Variable_<n>``, n counting the unnamed dynamic
            variables of the process from 0 (static ones are numbered apart).
        constraint: not supported for dynamic variables (must be None).
        trainable: whether GradientTape watches it.
        key_type: ``tf.int64`` (default), ``tf.int32`` or ``tf.uint64`` (``dtypes.KEY_DTYPES``);
            ids of a lookup must have this dtype (int32 ids are cast for int64 keys).
        dtype: ``tf.float32`` (the only one).
        mode: None or ``"distributed"`` (one shard per rank) or ``"localized:N"`` (rank N).
        **kwargs: backend options (``init_capacity``, ``max_capacity``, ``max_hbm_for_vectors``,
            ``evict_strategy``, ...), validated by the backend (hkv rounds capacities up to powers of
            two >= ``max_bucket_size``, as NVIDIA SOK does: an INFO log line names the variable and
            each change, and the ``repr`` shows them); and ``filter_ratio`` (a number in
            [0, 1], default 1.0; every backend), the probability that
            ``sok.lookup_sparse(..., use_low_frequency_filter=True)`` admits an occurrence of a key
            the table does not hold yet (SOK's low-frequency filter).

    Raises:
        ValueError: an argument is not valid (the message names it, the value and the valid ones).
        UnknownVarTypeError: no installed backend serves ``var_type``.
        MemoryError: the table could not be allocated (the message gives its capacity and bytes).
        TypeError: (lookups) ids whose dtype is not the key type.

    Example::

        v = sok.DynamicVariable(dimension=16, var_type="hybrid", init_capacity=1024,
                                max_capacity=1 << 20)
        emb = tf.nn.embedding_lookup(v, ids)      # [batch, 16]; inserts unseen ids

    What ``sok.OptimizerWrapper`` and ``sok.dump`` / ``sok.load`` rely on (and nothing else of
    the variable):

    * :meth:`keys_of`: ids as this table's keys, the one conversion of every read and write (so a
      gradient's ``indices`` are turned into keys as the lookup turned its ids).
    * :attr:`table_inputs`, :attr:`table_device`, :attr:`table_ref`, :attr:`storage`,
      :attr:`embedding_initializer`: the table, where its ops run, and how new rows are filled
      (the optimizer widens the rows through ``table_ref``; the checkpoint reads and writes
      ``storage``).
    * :attr:`optimizer_wrapper`: the one ``sok.OptimizerWrapper`` whose state columns the rows
      hold (``[embedding | slot 1 | slot 2 ...]``), None until one updates the variable or loads
      state into it; set by that wrapper through :meth:`bind_optimizer_wrapper`, never changed.
    * The gradient of a lookup is ``tf.IndexedSlices`` over raw keys; inside the graph that took
      it, :func:`distinct_index_of` of its ``indices`` gives the distinct keys and positions the
      lookup computed (the optimizer reuses them rather than indexing the keys again).
    """

    def __init__(
        self,
        dimension: int,
        initializer: Any = None,
        var_type: str | None = None,
        name: str | None = None,
        constraint: Any = None,
        trainable: bool = True,
        key_type: Any = None,
        dtype: Any = None,
        mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        if not is_positive_int(dimension) or dimension > MAX_ROW_WIDTH:
            raise ValueError(
                f"dimension must be an integer in 1 .. {MAX_ROW_WIDTH} (2**31 - 1, the widest row a storage "
                f"takes), got {dimension!r}; pass the embedding width as an int"
            )
        if dtype is not None and _as_dtype(dtype) != tf.float32:
            raise ValueError(
                f"dtype {dtype!r} is not supported; valid: tf.float32 (or leave dtype=None). A DynamicVariable's "
                f"rows hold its optimizer state beside the embedding, in float32; rows of float16 or bfloat16 are "
                f"for sok.Variable tables (dtype=tf.bfloat16)"
            )
        if constraint is not None:
            raise ValueError("constraint is not supported for a DynamicVariable; pass constraint=None")
        if mode is not None and not (isinstance(mode, str) and _MODE.match(mode)):
            raise ValueError(f"mode {mode!r} is not valid; valid: None, 'distributed' or 'localized:N' (N a rank)")
        if not name:  # NVIDIA SOK's names, numbered apart from static variables' (sok.dump tells them apart)
            name = f"sok_dynamic_Variable_{next(_unnamed)}"
        self._dimension = int(dimension)
        self._key_dtype = _key_dtype(key_type)
        self._var_type = DEFAULT_VAR_TYPE if var_type is None else var_type
        self._mode = mode
        self._filter_ratio = _filter_ratio(kwargs.pop("filter_ratio", 1.0))  # sok-core's, not the backend's
        self._config = dict(kwargs)
        self._optimizer_wrapper: OptimizerOwner | None = None
        initializer, self._initializer_str = resolve_initializer(initializer)
        # The embedding's initializer covers columns [0, dimension); optimizer state columns
        # added later bring their own.
        layout = RowLayout(self._dimension)  # no optimizer state yet: attaching one widens the rows
        self._initializer = inits.Initializer(
            initializer.kind, initializer.a, initializer.b, initializer.seed, layout.embedding
        )
        tf_ops.library()  # fail now, with the fix, if the op library is missing or stale
        self._placement = placement.of_scope(self._var_type)
        try:
            storage = create_storage(
                self._var_type,
                row_width=layout.width,
                key_dtype=_KEY_TYPES[self._key_dtype],
                initializer=self._initializer,
                device=self._placement.storage,
                name=name,
                **kwargs,
            )
        except MemoryError as error:
            raise MemoryError(
                f"could not create DynamicVariable {name!r} of dimension {self._dimension:,} on "
                f"{self._placement.storage}: {error}"
            ) from error
        self._table = TableRef(storage)
        with tf_ops_lib.init_scope():
            self._table_address = tf.constant(self._table.address, dtype=tf.int64)
        #: graph -> the name of its SokTableAddress output for this table (table_inputs)
        self._graph_addresses: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        with tf.device(self._placement.tf_device):  # the handle, and so every op on the table
            super().__init__(
                trainable=trainable,
                name=name,
                shape=tf.TensorShape([None, self._dimension]),
                dtype=tf.float32,
            )
        # What a SavedModel's lookups read (serving_table): made from the table when one is saved.
        constant = self._initializer.kind == inits.InitKind.CONSTANT
        default = np.full(self._dimension, self._initializer.a if constant else 0.0, np.float32)
        self._serving = ServingCopy(name, self._dimension, default, lambda: export(self))

    # -- properties of SOK's DynamicVariable ----------------------------------------------------
    @property
    def dimension(self) -> int:
        return self._dimension

    @property
    def key_type(self) -> tf.DType:
        return self._key_dtype

    @property
    def backend_type(self) -> str:
        return self._var_type

    @property
    def config_dict(self) -> dict:
        return dict(self._config)

    @property
    def mode(self) -> str | None:
        return self._mode

    @property
    def filter_ratio(self) -> float:
        """The low-frequency filter's probability of admitting an occurrence of a new key."""
        return self._filter_ratio

    @property
    def target_gpu(self) -> int:
        match = _MODE.match(self._mode or "")
        return int(match.group(2)) if match and match.group(2) is not None else -1

    @property
    def initializer_str(self) -> str:
        return self._initializer_str

    @property
    def storage(self) -> Storage:
        """The local shard's storage (the Python face of the backend's table)."""
        return self._table.storage

    @property
    def table_device(self) -> str:
        """The TensorFlow device of the table, of its handle and of every op on it
        (``"/device:GPU:0"``, ``"/device:CPU:0"``); ``storage.device`` names it as the storage does."""
        return self._placement.tf_device

    @property
    def table_ref(self) -> TableRef:
        """The reference the ops use; the optimizer widens rows through it."""
        return self._table

    @property
    def embedding_initializer(self) -> inits.Initializer:
        """How the embedding columns of new rows are filled."""
        return self._initializer

    @property
    def table_inputs(self) -> tuple[tf.Tensor, tf.Tensor]:
        """``(handle, table_address)``: the first two inputs of every storage op. The handle orders
        the ops on one table inside ``tf.function`` (automatic control dependencies follow resources).

        Inside a graph the address is a ``SokTableAddress`` op on the table's device (a host scalar
        there): a captured CPU tensor would make a ``tf.function`` of GPU ops a function of two
        devices, which TensorFlow runs as two parts with a transfer between them on every call. One
        such op per graph: the step's lookups and updates of the table share it."""
        if not tf.inside_function():
            return self.handle, self._table_address
        graph = tf.compat.v1.get_default_graph()
        name = self._graph_addresses.get(graph)
        if name is not None:
            return self.handle, graph.get_tensor_by_name(name)
        with tf.control_dependencies(None), tf.device(self._placement.tf_device):  # no context's deps
            address = tf_ops.library().sok_table_address(address=self._table.address)
        if not tf.executing_eagerly():  # (a Python callback of a running graph executes eagerly)
            self._graph_addresses[graph] = address.name  # a name: a tensor would keep its graph alive
        return self.handle, address

    @property
    def optimizer_wrapper(self) -> OptimizerOwner | None:
        """The ``sok.OptimizerWrapper`` whose optimizer state the rows hold (in the columns after
        the embedding), or None while none has updated the variable or loaded state into it.

        One wrapper per variable, for the variable's life: another wrapper refuses to update it,
        and ``sok.dump`` / ``sok.load`` name and check the state by this wrapper.

        Example::

            opt = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.1))
            opt.apply_gradients([(grad, v)])
            assert v.optimizer_wrapper is opt
        """
        return self._optimizer_wrapper

    def bind_optimizer_wrapper(self, wrapper: OptimizerOwner) -> None:
        """Record ``wrapper`` as :attr:`optimizer_wrapper`. ``sok.OptimizerWrapper`` calls it once
        the rows have its state columns (``OptimizerWrapper.attach``); binding the same wrapper
        again does nothing.

        Raises:
            ValueError: another wrapper is bound already (its state lives in the rows).
        """
        owner = self._optimizer_wrapper
        if owner is not None and owner is not wrapper:
            raise ValueError(
                f"{self.name} is bound to a sok.OptimizerWrapper ({owner.name}) already, whose state its rows "
                f"hold; a variable's wrapper does not change: update it with that wrapper"
            )
        self._optimizer_wrapper = wrapper

    def is_static(self) -> bool:
        return False

    def key_map(self, indices: Any) -> Any:
        return indices

    @property
    def size(self) -> tf.Tensor:
        """``[rows in this shard, dimension]`` as an int32 tensor (as SOK's ``v.size``)."""
        rows = tf.cast(tf_ops.library().sok_size(*self.table_inputs), tf.int32)
        return tf.stack([rows, tf.constant(self._dimension, tf.int32)])

    def __repr__(self) -> str:
        storage = getattr(self, "storage", None)
        adjusted = "; ".join(getattr(storage, "adjustments", ()))
        return (
            f"<sok.DynamicVariable '{self.name}' shape=(None, {self._dimension}) dtype=float32 "
            f"var_type={self._var_type!r} device={self._placement.storage!r}"
            + (f" options: {adjusted}" if adjusted else "")
            + ">"
        )

    # -- reads ----------------------------------------------------------------------------------
    def keys_of(self, indices: Any) -> tf.Tensor:
        """``indices`` (ids of any shape) as this table's keys: the same tensor when its dtype is
        :attr:`key_type`, int32 ids cast to int64 for an int64 table. Every read and write of the
        variable (and the optimizer's update of a gradient's ``indices``) converts ids with it.

        Raises:
            TypeError: ids of another dtype (the message says how to convert them).

        Example::

            v.keys_of(tf.constant([1, 2], tf.int32))   # int64 [1, 2] for key_type tf.int64
        """
        ids = tf.convert_to_tensor(indices)
        if ids.dtype == self._key_dtype:
            return ids
        if ids.dtype == tf.int32 and self._key_dtype == tf.int64:
            return tf.cast(ids, tf.int64)
        key_type = self._key_dtype.name
        if ids.dtype in _KEY_TYPES:
            raise TypeError(
                f"ids (indices) of {self.name} have dtype {ids.dtype.name} but its key_type is {key_type}; cast "
                f"them (tf.cast(ids, tf.{key_type})), or create the variable with key_type=tf.{ids.dtype.name}"
            )
        fix = f"cast them to integer keys: tf.cast(ids, tf.{key_type})"
        if ids.dtype == tf.string:
            fix = (
                f"map them to integer keys: tf.strings.to_number(ids, tf.{key_type}) for numbers written as "
                f"text, or tf.strings.to_hash_bucket_fast(ids, 2**63 - 1) to hash them"
            )
        raise TypeError(
            f"ids (indices) of {self.name} have dtype {ids.dtype.name}, which is not a key type; valid key "
            f"types: {_VALID_KEY_TYPES} (this variable's key_type is {key_type}); {fix}"
        )

    def sparse_read(self, indices: Any, name: str | None = None) -> tf.Tensor:
        """Rows of ``indices`` (any shape; result shape ``indices.shape + [dimension]``), inserting
        unseen keys with the initializer. Differentiable: the gradient is IndexedSlices over keys.
        While a SavedModel is saved, the rows of the variable's serving copy instead (see
        :meth:`serving_read`): nothing is inserted."""
        if saving():
            return self.serving_read(indices)
        with tf.name_scope(name or "SokLookup"), tf.device(self.table_device):
            if self.trainable:
                tape_lib.variable_accessed(self)
            lib, keys = tf_ops.library(), self.keys_of(indices)
            if self.storage.distinct_lookups:
                distinct, positions = lib.sok_unique_index(tf.reshape(keys, [-1]))
                return lib.sok_lookup_distinct(
                    *self.table_inputs, keys, distinct, positions, col_begin=0, col_end=self._dimension
                )
            return lib.sok_lookup(*self.table_inputs, keys, col_begin=0, col_end=self._dimension)

    def serving_read(self, indices: Any) -> tf.Tensor:
        """Rows of ``indices`` from the variable's serving copy (:mod:`~sparse_operation_kit.serving_table`):
        every row the table holds, copied once per SavedModel save into constants of the saved
        functions; the default row for a key the table does not hold (its constant initializer's
        value, else zeros). TensorFlow ops only: what a SavedModel's lookups of this variable are,
        so that a process without Python or SOK's tables serves them.

        Raises:
            ValueError: several ranks hold shards of the table (save the model from one process:
                ``sok.dump`` on the ranks, ``sok.load`` in one process, then save), or the copy is
                larger than a SavedModel's graph can hold (``serving_table.MAX_COPY_BYTES``).
        """
        ranks = communication.num_ranks()
        if ranks > 1:
            raise ValueError(
                f"{self.name} is saved for serving from {ranks} ranks, but a SavedModel serves the whole "
                f"table from one process; sok.dump it on the ranks, sok.load it in one process (np 1), "
                f"then save the model there"
            )
        with tf.name_scope("SokServingLookup"):
            # The handle, read for nothing: a function that reads the copy then names the variable,
            # so a save refuses an untracked one (TensorFlow's "untracked resource") and checks a
            # tracked one (_export_to_saved_model_graph) instead of passing it by.
            with tf.control_dependencies([tf.raw_ops.VarIsInitializedOp(resource=self.handle)]):
                return tf.identity(self._serving.lookup(self.keys_of(indices)))

    # -- writes through IndexedSlices (SOK's scatter_* for dynamic variables) ------------------
    def _write(self, sparse_delta: Any, accumulate: bool, negate: bool = False) -> None:
        if not isinstance(sparse_delta, indexed_slices_lib.IndexedSlices):
            raise TypeError(f"sparse_delta is not IndexedSlices: {sparse_delta!r}")
        values = tf.reshape(tf.convert_to_tensor(sparse_delta.values, tf.float32), [-1, self._dimension])
        if negate:
            values = -values
        op = tf_ops.library().sok_accum_or_assign if accumulate else tf_ops.library().sok_insert_or_assign
        op(
            *self.table_inputs,
            tf.reshape(self.keys_of(sparse_delta.indices), [-1]),
            values,
            col_begin=0,
            col_end=self._dimension,
        )

    def scatter_update(self, sparse_delta: Any, use_locking: bool = False, name: str | None = None) -> DynamicVariable:
        """Assign rows: ``IndexedSlices(values, keys)``."""
        self._write(sparse_delta, accumulate=False)
        return self

    def scatter_add(self, sparse_delta: Any, use_locking: bool = False, name: str | None = None) -> DynamicVariable:
        """Add to rows: ``IndexedSlices(deltas, keys)``."""
        self._write(sparse_delta, accumulate=True)
        return self

    def scatter_sub(self, sparse_delta: Any, use_locking: bool = False, name: str | None = None) -> DynamicVariable:
        """Subtract from rows: ``IndexedSlices(deltas, keys)``."""
        self._write(sparse_delta, accumulate=True, negate=True)
        return self

    # -- what a hash table cannot do -------------------------------------------------------------
    def _unsupported(self, what: str) -> NotImplementedError:
        return NotImplementedError(
            f"{what} is not supported by a sok.DynamicVariable (its rows are a hash table of unbounded key "
            f"space); use tf.nn.embedding_lookup / sparse_read to read rows, sok.assign to write them, "
            f"sok.export to get every row, and sok.dump / sok.load to checkpoint"
        )

    def value(self):
        raise self._unsupported("value()")

    def read_value(self):
        raise self._unsupported("read_value()")

    def _read_variable_op(self, *args, **kwargs):
        raise self._unsupported("reading the whole variable")

    def _dense_var_to_tensor(self, *args, **kwargs):
        raise self._unsupported("converting to a dense tensor")

    def numpy(self):
        raise self._unsupported("numpy()")

    def assign(self, *args, **kwargs):
        raise self._unsupported("assign()")

    def assign_add(self, *args, **kwargs):
        raise self._unsupported("assign_add()")

    def assign_sub(self, *args, **kwargs):
        raise self._unsupported("assign_sub()")

    def gather_nd(self, *args, **kwargs):
        raise self._unsupported("gather_nd()")

    def scatter_max(self, *args, **kwargs):
        raise self._unsupported("scatter_max()")

    def scatter_min(self, *args, **kwargs):
        raise self._unsupported("scatter_min()")

    def scatter_mul(self, *args, **kwargs):
        raise self._unsupported("scatter_mul()")

    def scatter_div(self, *args, **kwargs):
        raise self._unsupported("scatter_div()")

    def scatter_nd_update(self, *args, **kwargs):
        raise self._unsupported("scatter_nd_update()")

    def scatter_nd_add(self, *args, **kwargs):
        raise self._unsupported("scatter_nd_add()")

    def scatter_nd_sub(self, *args, **kwargs):
        raise self._unsupported("scatter_nd_sub()")

    def batch_scatter_update(self, *args, **kwargs):
        raise self._unsupported("batch_scatter_update()")

    def _serialize_to_tensors(self):
        if saving() or writing_saved_model():  # a SavedModel: its functions hold the serving copy
            return {}
        raise self._unsupported("tf.train.Checkpoint")

    def _export_to_saved_model_graph(self, object_map, tensor_map, options, **kwargs):
        """The variable's stand-in in a SavedModel's graph (a handle that ops may be colocated
        with), with nothing to save or restore: lookups there read the serving copy
        (``serving_read``), and the checkpoint holds no value for it. Refuses a save whose functions
        TensorFlow traced for an earlier save (they would serve that save's rows)."""
        if self._serving.stale_functions_alive():
            raise ValueError(
                f"{self.name}: functions traced for an earlier SavedModel save still exist, and a save that "
                f"takes one reuses its trace, which holds the table's rows of then; save functions traced "
                f"anew (a new tf.function, a new model object, or model.export, which traces its own) and let "
                f"the earlier ones go (del the earlier model or module) before saving"
            )
        handles = super()._export_to_saved_model_graph(object_map, tensor_map, options, **kwargs)
        object_map[self]._serialize_to_tensors = lambda: {}  # TensorFlow honours the instance's own
        return handles

    def __deepcopy__(self, memo):
        raise self._unsupported("copy.deepcopy()")

    def __reduce__(self):
        raise self._unsupported("pickling")


def _rows_grad(op: tf.Operation, grad: tf.Tensor) -> list:
    """The gradient of a lookup's rows: IndexedSlices over its keys (none for the handle and table)."""
    keys = tf.reshape(op.inputs[2], [-1])
    width = op.get_attr("col_end") - op.get_attr("col_begin")
    values = tf.reshape(grad, [-1, width])
    return [indexed_slices_lib.IndexedSlices(values, keys), None, None]


@tf.RegisterGradient("SokLookup")
def _sok_lookup_grad(op: tf.Operation, grad: tf.Tensor) -> list:
    """``_rows_grad``, handing on the distinct index noted for the keys (:func:`read_distinct` and
    ``try_sparse_read(..., distinct=True)`` note one)."""
    grads = _rows_grad(op, grad)
    if not tf.executing_eagerly():
        _note_distinct_index(grads[0].indices, _noted_distinct_index(op.inputs[2]))
    return grads


# -- the hand-off of a lookup's distinct-key index to the optimizer -------------------------------
# A lookup that indexes its keys (SokLookupDistinct: SokUniqueIndex's distinct keys and positions;
# the multi-rank lookup_sparse: keys that are distinct already) has computed what the optimizer's
# SokSparseApply needs for the gradient's indices. The lookup's gradient function, which makes those
# indices, notes "the flattened indices have this (distinct_keys, positions)"; the optimizer asks
# distinct_index_of(grad.indices). Notes live per graph, weakly keyed by the graph and holding tensor
# names (tensors would keep their graph alive); they are read only in the graph that made them.
# Eagerly there are none: the optimizer indexes the keys itself.

#: graph → {tensor name: (distinct keys name, positions name)}: the index of the tensor's flattened
#: values (a gradient's indices; keys that try_sparse_read(..., distinct=True) was promised distinct).
_DISTINCT_INDEX: weakref.WeakKeyDictionary[tf.Graph, dict[str, tuple[str, str]]] = weakref.WeakKeyDictionary()


def _note_distinct_index(values: tf.Tensor, index: tuple[tf.Tensor, tf.Tensor] | None) -> None:
    """Note ``index`` = ``(distinct_keys, positions)`` of the flattened ``values``: in a graph, and
    where the three are tensors of one graph (a gradient built in another graph gets none)."""
    if index is None or tf.executing_eagerly():
        return
    graph = values.graph
    if all(t.graph is graph for t in index):
        _DISTINCT_INDEX.setdefault(graph, {})[values.name] = (index[0].name, index[1].name)


def _noted_distinct_index(values: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor] | None:
    """The index :func:`_note_distinct_index` noted for ``values`` (a graph tensor), or None."""
    graph = values.graph
    names = _DISTINCT_INDEX.get(graph, {}).get(values.name)
    return None if names is None else (graph.get_tensor_by_name(names[0]), graph.get_tensor_by_name(names[1]))


def distinct_index_of(indices: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor] | None:
    """``(distinct_keys, positions)`` of the flattened ``indices`` of a lookup gradient, as the
    lookup computed them, or None where it did not (the caller indexes the keys itself).

    The gradient functions of the lookups hand them over: ``SokLookupDistinct``'s (its
    ``SokUniqueIndex`` outputs), and ``SokTryLookup``'s when :func:`try_sparse_read` was told its
    keys are distinct (the keys, and positions ``0 .. n-1``). Only for the very ``indices`` tensor
    such a gradient function returned, and only in the graph being built: None eagerly, for another
    graph's tensors, or for indices the tape combined (a variable read twice: a concatenation).

    Example::

        @tf.function
        def step(ids):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.nn.embedding_lookup(v, ids))
            grad = tape.gradient(loss, v)
            distinct, positions = distinct_index_of(grad.indices)   # SokUniqueIndex's outputs
    """
    if tf.executing_eagerly() or not isinstance(indices, tf.Tensor):
        return None
    if indices.graph is not tf.compat.v1.get_default_graph():
        return None
    return _noted_distinct_index(indices)


@tf.RegisterGradient("SokLookupDistinct")
def _sok_lookup_distinct_grad(op: tf.Operation, grad: tf.Tensor) -> list:
    grads = _rows_grad(op, grad)
    _note_distinct_index(grads[0].indices, (op.inputs[3], op.inputs[4]))  # its distinct keys, positions
    return grads + [None, None]


@tf.RegisterGradient("SokTryLookup")
def _sok_try_lookup_grad(op: tf.Operation, grad: tf.Tensor, *unused: tf.Tensor) -> list:
    return _sok_lookup_grad(op, grad)


def _keys_of_read(var: DynamicVariable, indices: Any, distinct: bool) -> tf.Tensor:
    """The keys of a read of ``var`` (the tape told of the access), noted as their own distinct index
    when the caller promises them ``distinct`` inside a graph."""
    if var.trainable:
        tape_lib.variable_accessed(var)
    keys = var.keys_of(indices)
    if distinct and not tf.executing_eagerly():
        with tf.device(var.table_device):  # where the optimizer's update of these keys runs
            flat = tf.reshape(keys, [-1])
            # 0 .. n-1 made where the table is: an int32 range under a GPU runs on the host and would
            # be copied to the device for every update; an int64 range and a cast stay there.
            positions = tf.cast(device_ops.arange(device_ops.length(flat)), tf.int32)
            _note_distinct_index(keys, (flat, positions))
    return keys


def read_distinct(var: DynamicVariable, keys: Any) -> tf.Tensor:
    """``var.sparse_read(keys)`` of keys the caller promises distinct (``tf.unique``'s first output,
    say): each is looked up once, with no indexing of its own, and inside a graph the gradient hands
    them to the optimizer as their own distinct index (:func:`distinct_index_of`). Raises as
    ``sparse_read`` does.

    Example::

        distinct, positions = tf.unique(ids)
        rows = read_distinct(v, distinct)   # [len(distinct), v.dimension]
    """
    var = _check_dynamic(var, "read_distinct")
    if saving():
        return var.serving_read(keys)
    with tf.name_scope("SokLookup"), tf.device(var.table_device):
        keys = _keys_of_read(var, keys, distinct=True)
        return tf_ops.library().sok_lookup(*var.table_inputs, keys, col_begin=0, col_end=var.dimension)


def try_sparse_read(
    var: DynamicVariable, indices: Any, distinct: bool = False
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``var.sparse_read(indices)`` that does not raise when the table fails (e.g. a full ``"hbm"``
    table): ``(rows, status_code, status_message)``, where ``status_code`` is the TensorFlow error
    code (an int32 scalar, 0 when the lookup worked; rows are zeros otherwise) and ``status_message``
    the backend's message. Differentiable as ``sparse_read``.

    The multi-rank ``sok.lookup_sparse`` reads with it, so that a rank whose lookup fails still
    joins the exchange and every rank raises together.

    Args:
        var: the dynamic variable to read.
        indices: its ids, any shape.
        distinct: the caller's promise that ``indices`` hold no id twice (e.g. ``tf.unique``'s
            first output): inside a graph, the gradient then hands them over as their own distinct
            index (:func:`distinct_index_of`), and the optimizer's step does not index them again.

    Example::

        rows, code, message = try_sparse_read(v, tf.constant([1, 2], tf.int64))
    """
    var = _check_dynamic(var, "try_sparse_read")
    if saving():
        return var.serving_read(indices), tf.constant(0, tf.int32), tf.constant("", tf.string)
    with tf.name_scope("SokTryLookup"):
        keys = _keys_of_read(var, indices, distinct)
        return tf_ops.library().sok_try_lookup(*var.table_inputs, keys, col_begin=0, col_end=var.dimension)


@tf.RegisterGradient("SokLookupAndEvict")
def _sok_lookup_and_evict_grad(op: tf.Operation, grad: tf.Tensor, *unused: tf.Tensor) -> list:
    return _rows_grad(op, grad)


def sparse_read_and_evict(var: DynamicVariable, indices: Any, name: str | None = None) -> tuple:
    """Rows of ``indices`` from a table with eviction; missing keys are inserted, and the rows
    evicted to make room are returned: ``(embeddings, evicted_keys, evicted_values)``.

    Only backends with eviction (``"hybrid"``) evict; the gradient flows to ``embeddings``. While a
    SavedModel is saved, the rows of the variable's serving copy (:meth:`DynamicVariable.serving_read`)
    and no evicted row: serving inserts nothing, so it evicts nothing.

    Example::

        emb, gone_keys, gone_rows = sok.sparse_read_and_evict(v, ids)
    """
    var = _check_dynamic(var, "sok.sparse_read_and_evict")
    if not var.storage.spec.capabilities.eviction:
        raise TypeError(
            f"sparse_read_and_evict needs a backend with eviction (e.g. var_type 'hybrid'); "
            f"{var.name} uses var_type {var.backend_type!r}, which never evicts"
        )
    if saving():
        return var.serving_read(indices), tf.zeros([0], var.key_type), tf.zeros([0, var.dimension], tf.float32)
    with tf.name_scope(name or "SokLookupAndEvict"):
        if var.trainable:
            tape_lib.variable_accessed(var)
        return tuple(
            tf_ops.library().sok_lookup_and_evict(
                *var.table_inputs, var.keys_of(indices), col_begin=0, col_end=var.dimension
            )
        )


def _check_dynamic(var: Any, what: str) -> DynamicVariable:
    if not isinstance(var, DynamicVariable):
        raise TypeError(f"{what} takes a sok.DynamicVariable, got {type(var).__name__}")
    return var


class ColumnView(abc.ABC):
    """The columns ``[begin, end)`` of a dynamic variable's rows, as something :func:`export` and
    :func:`assign` read and write in place of the embedding columns.

    An optimizer slot (:class:`~sparse_operation_kit.slot_view.DynamicSlot`, which
    ``sok.OptimizerWrapper`` makes) is the one kind; it subclasses this so that this module takes
    slots without depending on the optimizer's modules, which build on it.
    """

    @property
    @abc.abstractmethod
    def variable(self) -> DynamicVariable:
        """The dynamic variable whose rows hold the columns."""

    @property
    @abc.abstractmethod
    def columns(self) -> tuple[int, int]:
        """``(begin, end)``: the column range in the variable's storage rows."""


def _rows_of(var: Any, what: str) -> tuple[DynamicVariable, tuple[int, int]]:
    """The dynamic variable whose rows ``var`` reads and their column range: the embedding columns
    of a variable, the view's columns of a :class:`ColumnView` (an optimizer slot)."""
    if isinstance(var, ColumnView):
        return var.variable, var.columns
    if not isinstance(var, DynamicVariable):
        raise TypeError(
            f"{what} takes a sok.DynamicVariable or one of its optimizer slots (optimizer.get_slot(var, name)), "
            f"got {type(var).__name__}"
        )
    return var, (0, var.dimension)


def export(var: DynamicVariable | ColumnView) -> tuple[tf.Tensor, tf.Tensor]:
    """The keys and embedding rows of the variable's local shard: ``(keys [N], values [N, dim])``.

    ``var`` may also be an optimizer slot of a dynamic variable (a
    :class:`~sparse_operation_kit.slot_view.DynamicSlot`, what the wrapped Keras optimizer's
    ``get_slot(var, name)`` returns): then ``values`` is that slot's state of each row.

    Example::

        keys, values = sok.export(v)
        keys, accumulators = sok.export(optimizer.get_slot(v, "accumulator"))
    """
    rows, (begin, end) = _rows_of(var, "sok.export")
    keys, values, _ = tf_ops.library().sok_export(
        *rows.table_inputs, tf.constant(0, tf.uint64), Tkeys=rows.key_type, col_begin=begin, col_end=end
    )
    return keys, values


def assign(var: DynamicVariable | ColumnView, indices: Any, values: Any) -> DynamicVariable | ColumnView:
    """Insert or overwrite rows of the variable's local shard; returns ``var``.

    ``var`` may also be an optimizer slot of a dynamic variable (a
    :class:`~sparse_operation_kit.slot_view.DynamicSlot`): then only that slot's columns of the rows
    are written (a new key's embedding gets the initializer's row).

    Example::

        sok.assign(v, tf.constant([1, 2], tf.int64), tf.ones([2, v.dimension]))
    """
    rows, (begin, end) = _rows_of(var, "sok.assign")
    width = end - begin  # the embedding's dimension, or a slot's width
    keys = tf.reshape(rows.keys_of(indices), [-1])
    values = tf.convert_to_tensor(values, tf.float32)
    if values.shape.rank is not None and (values.shape.rank != 2 or values.shape[-1] not in (None, width)):
        raise ValueError(f"values must have shape [N, {width}], got {values.shape}")
    tf_ops.library().sok_insert_or_assign(
        *rows.table_inputs, keys, tf.reshape(values, [-1, width]), col_begin=begin, col_end=end
    )
    return var
