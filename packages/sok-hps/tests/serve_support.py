"""Helpers of the serving tests: model files, ps_configs, an initialised HPS.

Tables are written in HPS's sparse-model layout (``key`` int64, ``emb_vector`` float32 rows); the
oracle of a lookup is the table as a dense ``[rows + extra, dim]`` array whose rows past the stored
keys hold the default value, so ``tf.nn.embedding_lookup(oracle, ids)`` is what HPS must return
for ids up to ``rows + extra - 1``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

DISABLED_DBS = {"volatile_db": {"type": "disabled"}, "persistent_db": {"type": "disabled"}}


def write_table(directory: str | os.PathLike, rows: int, dim: int, seed: int = 0) -> tuple[str, np.ndarray]:
    """A table of keys ``0 .. rows-1`` with random rows (row i = key i) in HPS's layout:
    ``(folder, weights [rows, dim])``."""
    os.makedirs(directory, exist_ok=True)
    weights = np.random.default_rng(seed).random((rows, dim), dtype=np.float32)
    np.arange(rows, dtype=np.int64).tofile(os.path.join(directory, "key"))
    weights.tofile(os.path.join(directory, "emb_vector"))
    return os.fspath(directory), weights


def oracle(weights: np.ndarray, default: float, extra: int) -> np.ndarray:
    """``weights`` with ``extra`` rows of ``default`` after it (ids no tier has)."""
    return np.concatenate([weights, np.full((extra, weights.shape[1]), default, np.float32)])


def model_entry(name: str, folders: list[str], dims: list[int], **overrides: Any) -> dict[str, Any]:
    """One ``models[]`` entry, exact (hit_rate_threshold 1.0), cache of every row unless overridden."""
    entry = {
        "model": name,
        "sparse_files": folders,
        "embedding_vecsize_per_table": dims,
        "maxnum_catfeature_query_per_table_per_sample": [64] * len(folders),
        "default_value_for_each_table": [0.5] * len(folders),
        "deployed_device_list": [0],
        "max_batch_size": 1024,
        "hit_rate_threshold": 1.0,
        "gpucacheper": 1.0,
        "gpucache": True,
    }
    entry.update(overrides)
    return entry


def ps_config(models: list[dict[str, Any]], supportlonglong: bool = True, **top: Any) -> dict[str, Any]:
    """A ps_config object; ``top`` adds or replaces top-level keys (volatile_db, ...)."""
    config = {"supportlonglong": supportlonglong, "models": models}
    config.update(top)
    return config


def require_rocksdict() -> None:
    """Skips the calling test (or module) where rocksdict, the rocks_db tier's library, is not
    installed (CI installs it; a GPU host may not)."""
    pytest.importorskip("rocksdict", reason="rocksdict is not installed: pip install 'sok-hps[rocksdb]'")


def write_config(path: str | os.PathLike, config: dict[str, Any]) -> str:
    """Writes ``config`` as JSON to ``path``; skips the test where it names the ``rocks_db`` tier
    and rocksdict is not installed (require_rocksdict)."""
    if config.get("persistent_db", {}).get("type") == "rocks_db":
        require_rocksdict()
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    return os.fspath(path)


@contextlib.contextmanager
def served(config_path: str, global_batch_size: int = 1024) -> Iterator[Any]:
    """HPS initialised from ``config_path`` for the block: yields the parameter server, shut down after."""
    from hierarchical_parameter_server import init

    init.shutdown()
    init.Init(ps_config_file=config_path, global_batch_size=global_batch_size)
    try:
        yield init.get_server()
    finally:
        init.shutdown()


def tier_setup(kind: str, tmp_path: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(models[] overrides, top-level keys) of a tier setup named ``kind``; RocksDB under ``tmp_path``."""
    rocks = {"type": "rocks_db", "path": str(tmp_path / "rocks")}
    hash_map = {"type": "hash_map", "num_partitions": 4}
    disabled = {"type": "disabled"}
    return {
        "hash_map": ({"gpucache": False}, {"volatile_db": hash_map, "persistent_db": disabled}),
        "parallel_hash_map": ({"gpucache": False}, {"volatile_db": {"type": "parallel_hash_map"}}),
        "evicting_hash_map": ({"gpucache": False}, {"volatile_db": {**hash_map, "overflow_margin": 10**6}}),
        "hash_map+rocks_db": ({"gpucache": False}, {"volatile_db": hash_map, "persistent_db": rocks}),
        "rocks_db": ({"gpucache": False}, {"volatile_db": disabled, "persistent_db": rocks}),
        # NVIDIA HPS's spelling of "no cache": gpucache true, gpucacheper 0.0
        "no_cache+rocks_db": ({"gpucacheper": 0.0}, {"volatile_db": disabled, "persistent_db": rocks}),
        "cache": ({"gpucacheper": 1.0}, DISABLED_DBS),
        "chain": ({"gpucacheper": 0.01}, {"volatile_db": hash_map, "persistent_db": rocks}),
        "cache+rocks_db": ({"gpucacheper": 0.01}, {"volatile_db": disabled, "persistent_db": rocks}),
    }[kind]
