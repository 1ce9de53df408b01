"""Serving of sok-core's demo (``sok demo``) through HPS, in a fresh process (``sok demo --part
serve`` runs it: :mod:`.sok_commands` hands it to the ``sok`` command): the tables are read by HPS from
the ``sok.dump`` checkpoint, the dense layers from ``dense.npz``; the eval set is served and its
predictions must equal those of the trained model (and so its AUC, to 1e-6).

(``demo.*`` below: sok-core's ``sparse_operation_kit.demo`` modules.) Both models of the demo are
served, the one ``demo.json`` names (``record["config"]["model"]``): the DLRM (``demo.dlrm``) looks
up one id per feature, the DLRM-DCNv2 (``demo.dcnv2``) a bag of
``hotness[i]`` ids per feature (multi-hot lookups, sum-pooled as in training). The tower and the
function from a batch's ids to the 26 embeddings are built as training builds them
(``train.build_model``), with HPS's lookups (:class:`HpsEmbeddings`) in place of SOK's tables.

HPS reads the checkpoint's tables directly: each ``sparse_files`` entry of the ``ps_config`` is
``<checkpoint>/<table name>``. Static tables' keys in the checkpoint are their row ids; dynamic
tables' are the keys they were trained with (``demo.dlrm.dynamic_keys`` of the ids), so serving
feeds each table what training fed it.

Example::

    python -m hierarchical_parameter_server.demo_serve build/demo      # after sok demo --part train
    python -m hierarchical_parameter_server.demo_serve build/dcnv2     # after sok demo --model dcnv2 --part train
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "MODEL_NAME",
    "PS_CONFIG_FILE",
    "read_record",
    "ps_config",
    "serve",
    "HpsEmbeddings",
    "AUC_TOLERANCE",
]

MODEL_NAME = "dlrm_demo"
PS_CONFIG_FILE = "ps_config.json"
#: How far the served AUC, and each served prediction, may be from the trained model's.
AUC_TOLERANCE = 1e-6


def read_record(output: str) -> dict[str, Any]:
    """The ``demo.json`` of the demo run in ``output``, checked for what serving reads of it: the
    ``config``'s ``model`` (one of ``demo.train.MODELS``) and, for ``"dcnv2"``, its ``hotness``.

    Raises:
        FileNotFoundError: ``output`` holds no ``demo.json`` (no training wrote into it).
        ValueError: ``demo.json`` is not JSON, or its model or hotness is missing or not valid.
    """
    from sparse_operation_kit.demo.criteo import check_hotness
    from sparse_operation_kit.demo.train import CONFIG_FILE, MODELS

    path = os.path.join(output, CONFIG_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} does not exist: {output!r} is not the --output of a demo run; train first "
            f"(sok demo --part train --output {output}) or give the --output of a trained run"
        )
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); train again to rewrite it") from error
    config = record.get("config") if isinstance(record, dict) else None
    model = config.get("model") if isinstance(config, dict) else None
    if model not in MODELS:
        raise ValueError(
            f"{path} names no model the demo serves: config.model is {model!r}; valid: "
            f"{', '.join(map(repr, MODELS))} (the file is corrupted or not written by sok demo; train again)"
        )
    if model == "dcnv2":
        try:
            check_hotness(config.get("hotness"))
        except (TypeError, ValueError) as error:
            raise ValueError(f"{path}: config.hotness of the dcnv2 run is not valid: {error}; train again") from error
    return record


def ps_config(output: str, record: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """HPS's ``ps_config`` for the checkpoint of a demo run (``record`` is its ``demo.json``): one
    model, one table per feature, int64 keys, exact lookups; per sample and table, one key (the
    DLRM) or the feature's hotness (the DCNv2's bags)."""
    from sparse_operation_kit.demo.train import CHECKPOINT_DIR

    names = record["table_names"]
    config = record["config"]
    hotness = list(config["hotness"]) if config["model"] == "dcnv2" else [1] * len(names)
    return {
        "supportlonglong": True,
        "models": [
            {
                "model": MODEL_NAME,
                "sparse_files": [os.path.join(os.path.abspath(output), CHECKPOINT_DIR, name) for name in names],
                "embedding_table_names": names,
                "embedding_vecsize_per_table": [config["dim"]] * len(names),
                "maxnum_catfeature_query_per_table_per_sample": hotness,
                "default_value_for_each_table": [0.0] * len(names),
                "deployed_device_list": [0],
                "max_batch_size": batch_size,
                "hit_rate_threshold": 1.0,
                "gpucacheper": 1.0,
                "gpucache": True,
            }
        ],
    }


class HpsEmbeddings:
    """The 26 tables of a served demo run, one ``hps.SparseLookupLayer`` each, with the lookups of
    ``demo.dlrm.SokEmbeddings`` (one id per feature, or sum-pooled bags of ids per feature), so
    that training's function from ids to embeddings runs on them unchanged.

    Args:
        layers: the 26 lookup layers, table ``i`` of the served model in ``layers[i]``.
        dynamic: whether each feature's table is dynamic (fed ``demo.dlrm.dynamic_keys`` of the ids).

    Example::

        pooled = HpsEmbeddings(layers, dynamic).lookup(split_bags(ids, hotness))   # 26 x [B, dim]
    """

    def __init__(self, layers: Sequence[Any], dynamic: Sequence[bool]) -> None:
        self.layers = list(layers)
        self.dynamic = [bool(d) for d in dynamic]

    def __call__(self, ids: Any) -> list[Any]:
        """26 embeddings ``[B, dim]`` of ids ``int64 [B, 26]`` (one id per feature and sample)."""
        from sparse_operation_kit.demo.dlrm import single_id_bags

        return self.lookup(single_id_bags(ids))

    def lookup(self, sp_ids: Sequence[Any]) -> list[Any]:
        """26 embeddings ``[B, dim]``: per feature, the sum of the served rows of its ids (one
        ``tf.RaggedTensor`` or ``tf.SparseTensor`` of int64 ids ``[B, None]`` per feature, as
        training's lookup takes; keyed as training keyed them, ``demo.dlrm.table_keys``)."""
        from sparse_operation_kit.demo.dlrm import table_keys

        return [layer(keys, None, combiner="sum") for keys, layer in zip(table_keys(sp_ids, self.dynamic), self.layers)]


def serve(output: str, export_to: str | None = None) -> dict[str, float]:
    """Serve the eval set of the demo run in ``output`` (either model) through HPS and compare with
    the trained model's predictions. Returns ``auc``, ``trained_auc`` and ``max_abs_diff``. Float32
    matmuls compute in float32, not TF32, as in ``demo.train.train`` (``demo.dlrm.float32_matmuls``).
    With ``export_to``, the served model is then saved there as a SavedModel (signature
    ``serving_default``: ``dense`` float32 ``[B, 13]`` and ``ids`` int64 ``[B, ids per sample]`` to
    the predictions ``[B, 1]``), which serves from Python or, its ps_config keeping every row in the
    process, from C++ (``graph_calls.serving_libraries()``).

    Raises:
        FileNotFoundError / ValueError: ``output``'s ``demo.json`` is missing or not valid
            (:func:`read_record`), or ``dense.npz`` does not fit the model it names.
        RuntimeError: HPS is initialised in this process already (serve in a fresh one).
        AssertionError: the served predictions or AUC differ from the trained model's.
    """
    record = read_record(output)
    from hierarchical_parameter_server import init as hps_init

    if hps_init.is_initialized():
        raise RuntimeError(
            "HPS is initialised in this process already (hps.Init is once per process, and a later Init keeps the "
            "first ps_config): serve the demo in a fresh process, "
            "python -m hierarchical_parameter_server.demo_serve OUTPUT"
        )

    from sparse_operation_kit.demo.dlrm import float32_matmuls

    with float32_matmuls():  # as train() computed the predictions it saved
        return _serve(output, record, export_to)


def _load_weights(tower: Any, path: str, model: str) -> None:
    """Assign ``dense.npz``'s arrays to the tower's weights, in order; ValueError where they do not fit."""
    with np.load(path) as weights:
        if len(weights.files) != len(tower.weights):
            raise ValueError(
                f"{path} holds {len(weights.files)} arrays, the {model} tower of its demo.json has "
                f"{len(tower.weights)} weights; the files are not of one run: train again"
            )
        for i, var in enumerate(tower.weights):
            value = weights[f"arr_{i}"]
            if tuple(value.shape) != tuple(var.shape):
                raise ValueError(
                    f"{path}: array arr_{i} has shape {value.shape}, the {model} tower's weight {var.name} "
                    f"{tuple(var.shape)}; the files are not of one run: train again"
                )
            var.assign(value)


def _served_model(output: str, record: dict[str, Any]) -> tuple[Any, Any, Any, str]:
    """HPS initialised from the run's ps_config (written into ``output``), and the trained tower over
    HPS's lookups: ``(config, tower, embed, title)``, ``embed`` training's function from a batch's
    ids to the 26 embeddings."""
    import tensorflow as tf
    from sparse_operation_kit.demo.criteo import NUM_CATEGORICAL
    from sparse_operation_kit.demo.train import DENSE_FILE, DemoConfig, build_model

    import hierarchical_parameter_server as hps

    config = DemoConfig(**record["config"])
    batch = config.batch_size
    config_path = os.path.join(output, PS_CONFIG_FILE)
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(ps_config(output, record, batch), f, indent=2)
    hps.Init(global_batch_size=batch, ps_config_file=config_path)
    layers = [
        hps.SparseLookupLayer(
            model_name=MODEL_NAME,
            table_id=i,
            emb_vec_size=config.dim,
            emb_vec_dtype=tf.float32,
            ps_config_file=config_path,
            global_batch_size=batch,
        )
        for i in range(NUM_CATEGORICAL)
    ]
    embeddings = HpsEmbeddings(layers, [kind != "static" for kind in record["table_kinds"]])
    tower, embed, title = build_model(config, embeddings)  # training's tower and ids -> embeddings
    tower.build_for()
    _load_weights(tower, os.path.join(output, DENSE_FILE), config.model)
    return config, tower, embed, title


def _serve(output: str, record: dict[str, Any], export_to: str | None) -> dict[str, float]:
    """:func:`serve` after its checks, inside ``demo.dlrm.float32_matmuls``."""
    import tensorflow as tf
    from sparse_operation_kit.demo.criteo import NUM_DENSE
    from sparse_operation_kit.demo.train import AUC_THRESHOLDS, PREDICTIONS_FILE

    config, tower, embed, title = _served_model(output, record)
    ids_per_sample = sum(config.hotness) if config.model == "dcnv2" else len(record["table_names"])
    predict = tf.function(
        lambda dense, ids: tf.sigmoid(tower((dense, embed(ids)))),
        input_signature=[
            tf.TensorSpec([None, NUM_DENSE], tf.float32, name="dense"),
            tf.TensorSpec([None, ids_per_sample], tf.int64, name="ids"),
        ],
    )
    auc = tf.keras.metrics.AUC(num_thresholds=AUC_THRESHOLDS)
    served = []
    for dense, ids, labels in config.eval_dataset():
        p = predict(dense, ids)
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
        f"\n== served the eval set ({served.size:,} samples) of the {title} through HPS from {output}: "
        f"AUC {result['auc']:.6f} (trained model {result['trained_auc']:.6f}), largest difference of a prediction "
        f"{result['max_abs_diff']:.2e}"
    )
    if abs(result["auc"] - result["trained_auc"]) > AUC_TOLERANCE or result["max_abs_diff"] > AUC_TOLERANCE:
        raise AssertionError(
            f"HPS's predictions differ from the trained model's: AUC {result['auc']!r} vs {result['trained_auc']!r}, "
            f"largest difference of a prediction {result['max_abs_diff']!r} (tolerance {AUC_TOLERANCE})"
        )
    print("serving check passed: HPS serves the trained model")
    if export_to is not None:  # Keras' archive tracks the tower's variables (a tf.Module would not)
        archive = tf.keras.export.ExportArchive()
        archive.track(tower)
        archive.add_endpoint("serve", predict)  # traced by the eval set above
        archive.write_out(export_to, verbose=False)
        print(f"exported the served model to {export_to} (serving_default: dense, ids -> predictions)")
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m hierarchical_parameter_server.demo_serve OUTPUT [--export DIR]``: serve a demo run
    of either model (exit 0 when it passes; 2, with the reason, for a run it cannot serve), and save
    the served model to DIR."""
    args = sys.argv[1:] if argv is None else argv
    usage = (
        "usage: python -m hierarchical_parameter_server.demo_serve OUTPUT [--export DIR] (OUTPUT: the directory "
        "of a demo run; DIR: where to save the served model as a SavedModel)"
    )
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--export"):
        print(usage, file=sys.stderr)
        return 2
    try:
        serve(args[0], args[2] if len(args) == 3 else None)
    except (ValueError, ImportError, OSError) as error:
        print(f"cannot serve {args[0]}: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
