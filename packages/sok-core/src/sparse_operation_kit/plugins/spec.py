"""What a backend registers: :class:`BackendSpec`, its :class:`Capabilities` and the storage API
version they are checked against.

The contract's data types, apart from the registry that holds them and the hooks that deliver them:
:mod:`.hookspecs` and :mod:`.registry` both build on this module, which imports neither.

Example::

    >>> from sparse_operation_kit.plugins import BackendSpec, Capabilities
    >>> BackendSpec(name="mybackend", var_types=("mine",), c_api="my_sok_backend._core:storage_api",
    ...             capabilities=Capabilities(devices=("cpu",))).api_version
    1
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sparse_operation_kit.dtypes import KEY_DTYPES

#: The version of the storage contract (C ABI ``SOK_STORAGE_API_VERSION`` and the Python table
#: protocol) this sok-core speaks. A backend built for another version is refused at registration.
STORAGE_API_VERSION = 1


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; callers check these instead of the backend's name.

    Args:
        eviction: full tables evict rows (``insert_and_evict`` may return rows).
        export_if: rows carry scores and ``export_if(threshold)`` filters by them.
        host_memory: rows can live in host memory beside device memory.
        devices: where tables can live: ``"cpu"``, ``"cuda"``.
        key_dtypes: the key dtypes accepted (NumPy names).
        eviction_policies: the ``evict_strategy`` values accepted (empty without eviction).
        distinct_lookups: ``find_or_insert`` leaves the same rows and scores whether a key repeats
            in a batch or not (no per-occurrence counts), so lookups may pass each distinct key once;
            or a function of a storage's backend options (strings) that says so for that storage
            (hkv: under LRU policies, not LFU ones). See :meth:`lookups_distinct`.
        adjust_options: None, or the backend's own reading of options it serves in another form: a
            function of a storage's backend options (strings) that returns the options to create it
            with and one note per change (hkv rounds a capacity up to a power of two). The core logs
            each note and shows it in the table's ``repr``; options it cannot serve, the backend
            still refuses. See :meth:`adjusted_options`.
    """

    eviction: bool = False
    export_if: bool = True
    host_memory: bool = False
    devices: tuple[str, ...] = ("cpu",)
    key_dtypes: tuple[str, ...] = KEY_DTYPES
    eviction_policies: tuple[str, ...] = ()
    distinct_lookups: bool | Callable[[Mapping[str, str]], bool] = False
    adjust_options: Callable[[Mapping[str, str]], tuple[dict[str, str], tuple[str, ...]]] | None = None

    def lookups_distinct(self, options: Mapping[str, str]) -> bool:
        """``distinct_lookups`` of a storage made with these backend options.

        Example::

            >>> Capabilities(distinct_lookups=lambda o: o.get("evict_strategy", "lru") == "lru").lookups_distinct({})
            True
        """
        if callable(self.distinct_lookups):
            return bool(self.distinct_lookups(options))
        return self.distinct_lookups

    def adjusted_options(self, options: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
        """``(options to create the storage with, notes on what changed)`` by ``adjust_options``.

        Example::

            >>> Capabilities().adjusted_options({"init_capacity": "1100"})
            ({'init_capacity': '1100'}, ())
        """
        if self.adjust_options is None:
            return dict(options), ()
        adjusted, notes = self.adjust_options(options)
        return dict(adjusted), tuple(notes)


@dataclass(frozen=True)
class BackendSpec:
    """One storage backend, as a plugin registers it.

    Args:
        name: the backend's short name (``"det"``).
        var_types: the ``var_type`` strings it serves (``("hbm",)``).
        factory: for a backend written in Python, ``"module:attribute"`` (imported lazily) or a
            callable ``factory(key_dtype: str, row_width: int, options: dict[str, str])`` returning a
            table that follows the storage protocol (see :mod:`sparse_operation_kit.storage`);
            backends that declare ``"cuda"`` in ``capabilities.devices`` also take
            ``device="cuda:N"``. None (the default) for a native backend: its tables are sok-core's
            binding of its ``c_api`` (:class:`~sparse_operation_kit.plugins.NativeTableFactory`).
        capabilities: what the backend can do.
        package: the distribution that provides it (for messages).
        version: that distribution's version.
        api_version: the storage API version it was built for.
        build_info: ``"module:attribute"`` or callable giving a dict of build facts (CUDA, archs).
        c_api: ``"module:attribute"`` of a function returning the backend's ``sok_storage_api``
            capsule (native backends); it is imported once, when the backend loads, and its
            ``api_version`` checked then.
    """

    name: str
    var_types: tuple[str, ...]
    factory: str | Callable[..., Any] | None = None
    capabilities: Capabilities = field(default_factory=Capabilities)
    package: str = ""
    version: str = ""
    api_version: int = STORAGE_API_VERSION
    build_info: str | Callable[[], dict] | None = None
    c_api: str | None = None
