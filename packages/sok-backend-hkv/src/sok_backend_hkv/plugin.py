"""Registers the hkv backend with sok-core (entry point ``sok.backends: hkv``)."""

from collections.abc import Mapping

from sparse_operation_kit.plugins import BackendSpec, Capabilities, hookimpl

from sok_backend_hkv import __version__

#: evict_strategy values (as hkv_table.cpp spells them) whose scores ignore repeats within a call:
#: LRU scores are the time of the call; LFU ones count every occurrence.
_REPEAT_FREE_POLICIES = ("lru", "kLru", "epoch_lru", "kEpochLru")


def _lookups_distinct(options: Mapping[str, str]) -> bool:
    """Whether a table with these options may look each distinct key of a batch up once
    (the default policy is lru)."""
    return options.get("evict_strategy", "lru") in _REPEAT_FREE_POLICIES


#: hkv_table.cpp's default max_bucket_size: the smallest capacity it takes.
DEFAULT_BUCKET_SIZE = 128
#: hkv_table.cpp's default init_capacity (the rows allocated up front when none is given).
DEFAULT_INIT_CAPACITY = 8192
#: The largest power of two an int64 holds: capacities above it cannot be rounded up.
_LARGEST_ROUNDED = 1 << 62


def rounded_capacity(value: int, bucket_size: int = DEFAULT_BUCKET_SIZE) -> int | None:
    """The capacity an hkv table uses for a requested ``value`` >= 1: the smallest power of two
    >= ``value`` and >= ``bucket_size`` (hkv_table.cpp takes only those, and checks again); None
    when that is above 2**62, the largest power of two an int64 holds.

    Example::

        >>> rounded_capacity(1000), rounded_capacity(64), rounded_capacity(1200), rounded_capacity(2**62 + 1)
        (1024, 128, 2048, None)
    """
    target = max(bucket_size, 1 << (value - 1).bit_length())
    return target if target <= _LARGEST_ROUNDED else None


def _positive_int(text: str | None) -> int | None:
    try:
        value = int(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def _round_capacities(options: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """hkv's table takes capacities that are powers of two >= max_bucket_size; NVIDIA SOK rounds
    others up (its own scripts pass, e.g., ``randint(1000, 1200)`` or 64), so this does too: each
    positive ``init_capacity`` / ``max_capacity`` is replaced by :func:`rounded_capacity` of it.
    Both are rounded, then hkv_table.cpp checks them: an ``init_capacity`` above ``max_capacity``
    after rounding is refused, as are zero, negative, malformed and unroundable (> 2**62)
    capacities and sizes beyond memory. An ``init_capacity`` not given (hkv's default, 8192) is
    lowered to a smaller ``max_capacity``, which would refuse it otherwise.
    """
    out = dict(options)
    bucket = _positive_int(options.get("max_bucket_size")) or DEFAULT_BUCKET_SIZE
    notes = []
    for name in ("init_capacity", "max_capacity"):
        value = _positive_int(options.get(name))
        target = None if value is None else rounded_capacity(value, bucket)
        if target is not None and target != value:
            out[name] = str(target)
            notes.append(f"{name}={value} rounded up to {target} (hkv takes powers of two >= max_bucket_size {bucket})")
    # A positive max_capacity is rounded by now: one below the default init_capacity is a valid one.
    limit = _positive_int(out.get("max_capacity"))
    if "init_capacity" not in options and limit is not None and limit < DEFAULT_INIT_CAPACITY:
        out["init_capacity"] = str(limit)
        notes.append(f"init_capacity (not given, default {DEFAULT_INIT_CAPACITY}) set to max_capacity {limit}")
    return out, tuple(notes)


@hookimpl
def sok_register_backends(registry):
    registry.register(
        BackendSpec(
            name="hkv",
            var_types=("hybrid",),
            capabilities=Capabilities(
                eviction=True,
                export_if=True,
                host_memory=True,
                devices=("cpu", "cuda"),
                eviction_policies=("lru", "lfu", "epoch_lru", "epoch_lfu", "custom"),
                distinct_lookups=_lookups_distinct,
                adjust_options=_round_capacities,
            ),
            package="sok-backend-hkv",
            version=__version__,
            build_info="sok_backend_hkv._core:BUILD_INFO",
            c_api="sok_backend_hkv._core:storage_api",
        )
    )
