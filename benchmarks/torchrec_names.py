"""TorchRec's and FBGEMM's names that the TorchRec baselines use (``scaling_torchrec.py``,
``dlrm_torchrec.py``), imported on demand, so that the scripts import without them.

Example::

    tr = import_torchrec("dlrm_torchrec.py")
    ebc = tr["EmbeddingBagCollection"](tables=configs, device=tr["torch"].device("meta"))
"""

from __future__ import annotations

from typing import Any


def import_torchrec(script: str) -> dict[str, Any]:
    """The names by their own name, or SystemExit naming ``script``, what is missing and how to get it."""
    try:
        import fbgemm_gpu  # registers FBGEMM's operators
        import torch
        import torchrec
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType
        from torchrec.distributed.embedding_types import EmbeddingComputeKernel
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
        from torchrec.distributed.types import ShardingEnv, ShardingType
        from torchrec.models.dlrm import DLRM_DCN
        from torchrec.optim.optimizers import in_backward_optimizer_filter
    except ImportError as error:
        raise SystemExit(
            f"{script} needs torch, torchrec and fbgemm-gpu importable: {error}. On the GPU host stage them with "
            f"ci/stage_torchrec.sh (its install.sh), then 'source /tmp/torchrec/env.sh'; elsewhere 'pip install "
            f"fbgemm-gpu==1.6.0 torchrec==1.6.1' beside torch 2.11 (CPU: fbgemm-gpu-cpu)"
        ) from error
    return {
        "torch": torch, "torchrec": torchrec, "fbgemm_gpu": fbgemm_gpu, "EmbOptimType": EmbOptimType,
        "EmbeddingBagCollection": EmbeddingBagCollection, "EmbeddingBagConfig": EmbeddingBagConfig,
        "KeyedJaggedTensor": KeyedJaggedTensor, "PoolingType": PoolingType,
        "EmbeddingComputeKernel": EmbeddingComputeKernel,
        "EmbeddingBagCollectionSharder": EmbeddingBagCollectionSharder,
        "DistributedModelParallel": DistributedModelParallel, "EmbeddingShardingPlanner": EmbeddingShardingPlanner,
        "ParameterConstraints": ParameterConstraints, "Topology": Topology, "ShardingEnv": ShardingEnv,
        "ShardingType": ShardingType, "DLRM_DCN": DLRM_DCN,
        "in_backward_optimizer_filter": in_backward_optimizer_filter,
    }  # fmt: skip
