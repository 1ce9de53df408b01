"""``create_storage``: the backend of a ``var_type`` through the registry, its options and
initializers checked, the table made on the CPU or a GPU (errors name what was adjusted and, for
memory, how much was asked)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from sparse_operation_kit import initializers as inits
from sparse_operation_kit.device_arrays import (
    parse_device,
)
from sparse_operation_kit.dtypes import VALUE_DTYPE, normalize_key_dtype
from sparse_operation_kit.plugins.registry import BackendSpec, get_registry
from sparse_operation_kit.storage.cuda import CudaStorage
from sparse_operation_kit.storage.facade import (
    Storage,
    _options_as_strings,
)
from sparse_operation_kit.storage.table import MAX_ROW_WIDTH
from sparse_operation_kit.validate import positive_int

# The package's logger: its records name "sparse_operation_kit.storage", as before the split.
logger = logging.getLogger(__package__)


def _initializers(initializer: Any, row_width: int, seed: int) -> list[inits.Initializer]:
    if initializer is None:
        return []
    if isinstance(initializer, str):
        return [inits.from_string(initializer, seed=seed)]
    if isinstance(initializer, (int, float)) and not isinstance(initializer, bool):
        return [inits.constant(float(initializer))]
    if isinstance(initializer, inits.Initializer):
        return [initializer]
    if isinstance(initializer, (list, tuple)) and all(isinstance(i, inits.Initializer) for i in initializer):
        return list(initializer)
    raise TypeError(
        f"initializer {initializer!r} is not valid; valid: a string ('random', 'normal', 'zeros', "
        f"'ones', '0.5'), a number, or sparse_operation_kit.initializers.Initializer objects"
    )


def create_storage(
    var_type: str = "hbm",
    row_width: int = 1,
    key_dtype: Any = "int64",
    initializer: Any = None,
    seed: int = 0,
    factory: Callable[..., Any] | None = None,
    device: str = "cpu",
    name: str | None = None,
    **options: Any,
) -> Storage:
    """A new storage of the backend serving ``var_type``.

    Args:
        var_type: ``"hbm"`` (det), ``"hybrid"`` (hkv) or a plugin's name.
        row_width: floats per row (embedding width plus optimizer state), 1 .. :data:`MAX_ROW_WIDTH`.
        key_dtype: ``"int64"``, ``"uint64"`` or ``"int32"`` (or a NumPy/TF dtype).
        initializer: how new rows are filled: a string (``"random"`` = U[-0.05, 0.05),
            ``"normal"``, ``"zeros"``, ``"ones"``, ``"13"``), a number, or Initializer objects.
        seed: seed of random initializers given as strings.
        factory: use this table factory instead of the registry's (tests, tools).
        device: where the table lives: ``"cpu"``, ``"cuda"`` (GPU 0) or ``"cuda:N"``. A GPU table
            needs a backend built with CUDA and CuPy; its storage is a :class:`CudaStorage`.
        name: what the log line names the table by (a DynamicVariable passes its name), if any.
        **options: backend options (``init_capacity``, ``max_capacity``, ``evict_strategy``, ...),
            validated by the backend. Options the backend serves in another form (hkv rounds
            capacities up to powers of two) are changed as it says: one INFO log line names the
            table and each change, and :attr:`Storage.adjustments` keeps them.

    Raises:
        ValueError: an argument or backend option is not valid (the message names it).
        MemoryError: the table could not be allocated; the message gives its capacity and the
            bytes it needed.

    Example::

        >>> s = create_storage("hybrid", row_width=8, evict_strategy="lfu", max_capacity=1024,
        ...                    init_capacity=1024)
    """
    kind, device_id = parse_device(device)
    registry = get_registry()
    spec = registry.spec(var_type)
    row_width = positive_int(row_width, "row_width")
    if row_width > MAX_ROW_WIDTH:
        raise ValueError(
            f"row_width {row_width!r} is too wide; valid: 1 .. {MAX_ROW_WIDTH} (2**31 - 1: the storage C ABI "
            f"holds a row width in an int32); pass a smaller row_width"
        )
    dtype = normalize_key_dtype(key_dtype)
    if dtype.name not in spec.capabilities.key_dtypes:
        raise ValueError(
            f"backend {spec.name!r} (var_type {var_type!r}) does not take {dtype.name} keys; "
            f"valid: {', '.join(spec.capabilities.key_dtypes)}"
        )
    init_list = _initializers(initializer, int(row_width), seed)
    make = factory or registry.factory(var_type)
    texts, adjustments = spec.capabilities.adjusted_options(_options_as_strings(options))
    if adjustments:
        named = "" if name is None else f" {name!r}"
        logger.info("%s table%s (backend %s): %s", var_type, named, spec.name, "; ".join(adjustments))
    distinct = spec.capabilities.lookups_distinct(texts)
    if kind == "cpu":  # no device argument: three-argument factories keep working
        try:
            table = make(dtype.name, int(row_width), texts)
        except MemoryError as error:
            raise _out_of_memory(error, make, spec, var_type, dtype.name, int(row_width), texts, adjustments) from error
        except ValueError as error:
            raise _with_adjustments(error, adjustments) from error
        logger.debug("created %s storage: %s", var_type, table.describe())
        return Storage(table, spec, var_type, init_list, distinct_lookups=distinct, adjustments=adjustments)
    device = f"cuda:{device_id}"
    if "cuda" not in spec.capabilities.devices:
        raise NotImplementedError(
            f"backend {spec.name!r} (var_type {var_type!r}) has no GPU support: its Capabilities.devices is "
            f"{spec.capabilities.devices}, so its tables cannot live on {device!r}; use device='cpu', or install a "
            f"version of {spec.package or spec.name} with GPU support"
        )
    try:
        table = make(dtype.name, int(row_width), texts, device=device)
    except MemoryError as error:
        raise _out_of_memory(
            error, make, spec, var_type, dtype.name, int(row_width), texts, adjustments, device
        ) from error
    except ValueError as error:
        raise _with_adjustments(error, adjustments) from error
    reported = getattr(table, "device", device)
    if reported != device:
        raise RuntimeError(f"backend {spec.name!r} made a table on {reported!r} when asked for one on {device!r}")
    storage = CudaStorage(table, spec, var_type, init_list, device, distinct_lookups=distinct, adjustments=adjustments)
    if logger.isEnabledFor(logging.DEBUG):  # describe() waits for the GPU
        logger.debug("created %s storage on %s: %s", var_type, device, storage.describe())
    return storage


def _adjusted_text(adjustments: tuple[str, ...]) -> str:
    """What a refusal of adjusted options adds, so that it names the values the caller gave (the
    backend's message names the adjusted ones): ``""`` when nothing was adjusted."""
    return f" (the options given were adjusted first: {'; '.join(adjustments)})" if adjustments else ""


def _with_adjustments(error: ValueError, adjustments: tuple[str, ...]) -> ValueError:
    """The backend's refusal of adjusted options, saying what was adjusted from what the caller
    gave; the error itself when nothing was adjusted."""
    if not adjustments:
        return error
    return ValueError(f"{error}{_adjusted_text(adjustments)}")


def _bytes_text(n: int) -> str:
    """``n`` bytes as ``"68,719,476,736 bytes (64.0 GiB)"``."""
    size, unit = float(n), "bytes"
    for next_unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024:
            break
        size, unit = size / 1024, next_unit
    return f"{n:,} bytes" + ("" if unit == "bytes" else f" ({size:.1f} {unit})")


def _out_of_memory(
    error: MemoryError,
    make: Callable[..., Any],
    spec: BackendSpec,
    var_type: str,
    key_dtype: str,
    row_width: int,
    options: dict[str, str],
    adjustments: tuple[str, ...],
    device: str = "cpu",
) -> MemoryError:
    """The MemoryError of a table that could not be allocated, with its size and what to change.

    The capacity is what the backend gives a table of these options (read from a one-float-wide
    table made with them on the CPU), else the ``init_capacity`` option it was given; the message
    also names what the backend adjusted in the options the caller gave."""
    capacity: int | None = None
    try:
        capacity = int(make(key_dtype, 1, options).capacity())
    except Exception:  # noqa: BLE001 (only for the message: the options as given are named instead)
        logger.debug("could not read the capacity of a %s table with options %r", var_type, options, exc_info=True)
    row_bytes = row_width * np.dtype(VALUE_DTYPE).itemsize
    rows = f"rows of {row_width:,} floats ({row_bytes:,} bytes)"
    if capacity is not None:
        size = f"capacity {capacity:,} x {rows} = about {_bytes_text(capacity * row_bytes)}"
    else:
        given = options.get("init_capacity")
        size = f"init_capacity={given}" if given is not None else f"the {spec.name} backend's default init_capacity"
        size += f" x {rows}"
    where = "" if device == "cpu" else f" on {device}"
    return MemoryError(
        f"out of memory allocating a var_type {var_type!r} table ({spec.name} backend){where}: {size} "
        f"(backend: {error}){_adjusted_text(adjustments)}; pass a smaller init_capacity (a backend option) or a "
        f"smaller dimension / row_width"
    )
