"""Serving of the demo's checkpoint through HPS, in a fresh process: the tables are read by HPS from
the ``sok.dump`` checkpoint, the dense layers from ``dense.npz``; the eval set is served and its
predictions must equal those of the trained model (and so its AUC, to 1e-6).

HPS reads the checkpoint's tables directly: each ``sparse_files`` entry of the ``ps_config`` is
``<checkpoint>/<table name>``. Static tables' keys in the checkpoint are their row ids; dynamic
tables' are the keys they were trained with (:func:`~.dlrm.dynamic_keys` of the ids), so serving
feeds each table what training fed it.

Example::

    python -m sparse_operation_kit.demo.serve build/demo      # after sok demo --part train
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np

__all__ = ["MODEL_NAME", "PS_CONFIG_FILE", "ps_config", "serve", "hps_serving_available", "AUC_TOLERANCE"]

MODEL_NAME = "dlrm_demo"
PS_CONFIG_FILE = "ps_config.json"
#: How far the served AUC may be from the trained model's.
AUC_TOLERANCE = 1e-6


def hps_serving_available() -> str | None:
    """None when HPS's ``Init`` and ``SparseLookupLayer`` can be imported; else why not."""
    try:
        import hierarchical_parameter_server as hps
    except ImportError as error:
        return f"sok-hps is not installed ({error}); pip install 'sok-core[hps]'"
    missing = [name for name in ("Init", "SparseLookupLayer") if not hasattr(hps, name)]
    if missing:
        return (
            f"this sok-hps ({getattr(hps, '__version__', '?')}) has no hps.{' / hps.'.join(missing)}; install the "
            f"sok-hps of sok-core's version (pip install 'sok-core[hps]')"
        )
    return None


def ps_config(output: str, record: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """HPS's ``ps_config`` for the checkpoint of a demo run (``record`` is its ``demo.json``): one
    model, one table per feature, int64 keys, one key per sample and table, exact lookups."""
    from sparse_operation_kit.demo.train import CHECKPOINT_DIR

    names = record["table_names"]
    dim = record["config"]["dim"]
    return {
        "supportlonglong": True,
        "models": [
            {
                "model": MODEL_NAME,
                "sparse_files": [os.path.join(os.path.abspath(output), CHECKPOINT_DIR, name) for name in names],
                "embedding_table_names": names,
                "embedding_vecsize_per_table": [dim] * len(names),
                "maxnum_catfeature_query_per_table_per_sample": [1] * len(names),
                "default_value_for_each_table": [0.0] * len(names),
                "deployed_device_list": [0],
                "max_batch_size": batch_size,
                "hit_rate_threshold": 1.0,
                "gpucacheper": 1.0,
                "gpucache": True,
            }
        ],
    }


def serve(output: str) -> dict[str, float]:
    """Serve the eval set of the demo run in ``output`` through HPS and compare with the trained
    model's predictions. Returns ``auc``, ``trained_auc`` and ``max_abs_diff``. Float32 matmuls
    compute in float32, not TF32, as in :func:`~.train.train` (:func:`~.dlrm.float32_matmuls`).

    Raises:
        ImportError: HPS's layers are not available (:func:`hps_serving_available` says why).
        RuntimeError: HPS is initialised in this process already (serve in a fresh one).
        AssertionError: the served predictions or AUC differ from the trained model's.
    """
    reason = hps_serving_available()
    if reason is not None:
        raise ImportError(f"cannot serve through HPS: {reason}")
    from hierarchical_parameter_server import init as hps_init

    if hps_init.is_initialized():
        raise RuntimeError(
            "HPS is initialised in this process already (hps.Init is once per process, and a later Init keeps the "
            "first ps_config): serve the demo in a fresh process, python -m sparse_operation_kit.demo.serve OUTPUT"
        )

    from sparse_operation_kit.demo.dlrm import float32_matmuls

    with float32_matmuls():  # as train() computed the predictions it saved
        return _serve(output)


def _serve(output: str) -> dict[str, float]:
    """:func:`serve` after its checks, inside :func:`~.dlrm.float32_matmuls`."""
    import hierarchical_parameter_server as hps
    import tensorflow as tf

    from sparse_operation_kit.demo.criteo import NUM_CATEGORICAL
    from sparse_operation_kit.demo.dlrm import DenseTower, dynamic_keys
    from sparse_operation_kit.demo.train import AUC_THRESHOLDS, CONFIG_FILE, DENSE_FILE, PREDICTIONS_FILE, DemoConfig

    with open(os.path.join(output, CONFIG_FILE), encoding="utf-8") as f:
        record = json.load(f)
    config = record["config"]
    batch = config["batch_size"]
    config_path = os.path.join(output, PS_CONFIG_FILE)
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(ps_config(output, record, batch), f, indent=2)
    hps.Init(global_batch_size=batch, ps_config_file=config_path)
    layers = [
        hps.SparseLookupLayer(
            model_name=MODEL_NAME,
            table_id=i,
            emb_vec_size=config["dim"],
            emb_vec_dtype=tf.float32,
            ps_config_file=config_path,
            global_batch_size=batch,
        )
        for i in range(NUM_CATEGORICAL)
    ]
    dynamic = [kind != "static" for kind in record["table_kinds"]]
    tower = DenseTower(config["dim"], config["bottom"], config["top"])
    tower.build_for()
    with np.load(os.path.join(output, DENSE_FILE)) as weights:
        for i, var in enumerate(tower.weights):
            var.assign(weights[f"arr_{i}"])

    def embeddings(ids: tf.Tensor) -> list[tf.Tensor]:
        out = []
        for i, layer in enumerate(layers):
            column = dynamic_keys(ids[:, i]) if dynamic[i] else ids[:, i]
            # One id per sample (tf.sparse.from_dense would drop the ids that are 0).
            sparse = tf.SparseTensor(
                tf.stack([tf.range(tf.shape(column, out_type=tf.int64)[0]), tf.zeros_like(column)], axis=1),
                column,
                [tf.shape(column, out_type=tf.int64)[0], 1],
            )
            out.append(layer(sparse, None, combiner="sum"))
        return out

    auc = tf.keras.metrics.AUC(num_thresholds=AUC_THRESHOLDS)
    served = []
    for dense, ids, labels in DemoConfig(**config).eval_dataset():
        p = tf.sigmoid(tower((dense, embeddings(ids))))
        auc.update_state(labels, p)
        served.append(p.numpy()[:, 0])
    served = np.concatenate(served)
    trained = np.load(os.path.join(output, PREDICTIONS_FILE))
    result = {
        "auc": float(auc.result()),
        "trained_auc": float(record["results"]["eval_auc"][-1]),
        "max_abs_diff": float(np.max(np.abs(served - trained))),
    }
    print(
        f"\n== served the eval set ({served.size:,} samples) through HPS from {output}: AUC {result['auc']:.6f} "
        f"(trained model {result['trained_auc']:.6f}), largest difference of a prediction {result['max_abs_diff']:.2e}"
    )
    if abs(result["auc"] - result["trained_auc"]) > AUC_TOLERANCE or result["max_abs_diff"] > AUC_TOLERANCE:
        raise AssertionError(
            f"HPS's predictions differ from the trained model's: AUC {result['auc']!r} vs {result['trained_auc']!r}, "
            f"largest difference of a prediction {result['max_abs_diff']!r} (tolerance {AUC_TOLERANCE})"
        )
    print("serving check passed: HPS serves the trained model")
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m sparse_operation_kit.demo.serve OUTPUT``: serve a demo run (exit 0 when it passes)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m sparse_operation_kit.demo.serve OUTPUT (the directory of a demo run)", file=sys.stderr)
        return 2
    serve(args[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
