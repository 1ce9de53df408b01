"""make_volatile_db / make_persistent_db build the tier a loaded ps_config names, with its settings."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hierarchical_parameter_server.config import MAX_PARTITIONS, ConfigError, PSConfig, load_config
from hierarchical_parameter_server.tiers import Tier, make_persistent_db, make_volatile_db

sys.path.insert(0, str(Path(__file__).parent))
import serve_support as support  # noqa: E402


def config(**sections) -> PSConfig:
    """A loaded ps_config of one one-table model with the given top-level sections."""
    return load_config(support.ps_config([support.model_entry("m", ["a"], [4])], **sections))


def test_default_config_gives_a_parallel_hash_map_and_no_persistent_db():
    cfg = config()
    tier = make_volatile_db(cfg.volatile_db)
    assert isinstance(tier, Tier) and tier.name == "parallel_hash_map"
    assert tier.num_partitions == cfg.volatile_db.num_partitions
    assert make_persistent_db(cfg.persistent_db) is None
    tier.close()


def test_hash_map_settings_are_passed_on():
    cfg = config(volatile_db={"type": "hash", "num_partitions": 3, "overflow_margin": 9, "overflow_policy": "oldest"})
    tier = make_volatile_db(cfg.volatile_db)
    assert (tier.name, tier.num_partitions, tier.overflow_margin, tier.overflow_policy, tier.keep_rows) == (
        "hash_map",
        3,
        9,
        "evict_oldest",
        round(9 * 0.8),
    )


def test_num_partitions_up_to_the_bound_builds_a_hash_map_beyond_it_is_refused():
    cfg = config(volatile_db={"num_partitions": MAX_PARTITIONS, "overflow_margin": 1000})
    tier = make_volatile_db(cfg.volatile_db)
    tier.insert("hps_et.m.sparse_embedding0", np.arange(10), np.ones((10, 4), np.float32))
    assert tier.num_partitions == MAX_PARTITIONS and tier.size("hps_et.m.sparse_embedding0") == 10
    assert len(tier._tables["hps_et.m.sparse_embedding0"].partitions) <= 10
    tier.close()
    bound = rf"volatile_db\.num_partitions: expected an integer in \[1, {MAX_PARTITIONS}\]"
    with pytest.raises(ConfigError, match=bound):
        config(volatile_db={"num_partitions": MAX_PARTITIONS + 1})


def test_disabled_volatile_db_is_none():
    assert make_volatile_db(config(volatile_db={"type": "none"}).volatile_db) is None


def test_redis_cluster_from_config(redis_cluster):
    cfg = config(volatile_db={"type": "redis", "address": redis_cluster.address, "num_partitions": 6})
    tier = make_volatile_db(cfg.volatile_db)
    assert tier.name == "redis_cluster" and tier.num_partitions == 6
    tier.insert("hps_et.m.sparse_embedding0", np.arange(3), np.ones((3, 4), np.float32))
    assert tier.fetch("hps_et.m.sparse_embedding0", np.arange(4), 4)[1].tolist() == [True, True, True, False]
    tier.close()


def test_rocks_db_from_config(tmp_path):
    support.require_rocksdict()
    cfg = config(persistent_db={"type": "rocksdb", "path": str(tmp_path / "r"), "num_threads": 2})
    tier = make_persistent_db(cfg.persistent_db)
    assert tier.name == "rocks_db" and tier.path == str(tmp_path / "r") and not tier.read_only
    tier.close()
