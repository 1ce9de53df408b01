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
_DEFAULT_BUCKET_SIZE = 128
#: The largest power of two a capacity is rounded up to (an int64 holds it); larger ones are refused.
_LARGEST_ROUNDED = 1 << 62


def _positive_int(text: str | None) -> int | None:
    try:
        value = int(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def _round_capacities(options: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """hkv's table takes capacities that are powers of two >= max_bucket_size; NVIDIA SOK rounds
    others up (its own scripts pass, e.g., ``randint(1000, 1200)`` or 64), so this does too: each
    positive ``init_capacity`` / ``max_capacity`` that is not such a power is rounded up to the next
    one (up to 2**62), and an ``init_capacity`` that rounding alone took past ``max_capacity`` becomes
    it. Zero, negative, malformed and larger values are left for hkv_table.cpp to refuse, as are
    sizes beyond memory.
    """
    out = dict(options)
    bucket = _positive_int(options.get("max_bucket_size")) or _DEFAULT_BUCKET_SIZE
    notes = []
    for name in ("max_capacity", "init_capacity"):
        value = _positive_int(options.get(name))
        if value is None:
            continue
        target = max(bucket, 1 << (value - 1).bit_length())
        if target != value and target <= _LARGEST_ROUNDED:
            out[name] = str(target)
            notes.append(f"{name}={value} rounded up to {target} (hkv takes powers of two >= max_bucket_size {bucket})")
    given_init, given_max = _positive_int(options.get("init_capacity")), _positive_int(options.get("max_capacity"))
    new_init, new_max = _positive_int(out.get("init_capacity")), _positive_int(out.get("max_capacity"))
    # Only rounding can take an init_capacity that was <= max_capacity past it.
    if given_init and given_max and given_init <= given_max and new_init > new_max:
        out["init_capacity"] = str(new_max)
        notes.append(f"init_capacity={given_init} set to max_capacity {new_max}")
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
