"""Where a ``sok.DynamicVariable``'s table lives: the device TensorFlow gives its handle.

Under a CUDA TensorFlow with a visible GPU the default is the GPU (TensorFlow's own default for
variables), and ``tf.device(...)`` chooses: ``"/GPU:1"`` puts the table on that GPU, ``"/CPU:0"``
keeps it in host memory. A GPU table is the backend's CUDA table (det: rows in HBM; hkv: HBM plus
host memory per ``max_hbm_for_vectors``) and every op on it runs on that GPU.

A table stays on the CPU, with a warning that says why and how to fix it, when a GPU was asked for
but cannot hold it: sok-core has no GPU kernels, the backend was built without CUDA, or CuPy (which
the storage's Python methods use on a GPU) is missing.

Example::

    >>> with tf.device("/CPU:0"):
    ...     placement.of_scope("hbm")
    Placement(storage='cpu', tf_device='/device:CPU:0')
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

import tensorflow as tf
from tensorflow.python.eager import context

from sparse_operation_kit import tf_ops
from sparse_operation_kit.device_arrays import CUPY_INSTALL_HINT
from sparse_operation_kit.plugins.registry import get_registry

logger = logging.getLogger(__name__)

__all__ = ["Placement", "default_home", "of_scope", "pin_local_gpu", "share_gpu_memory"]


@dataclasses.dataclass(frozen=True)
class Placement:
    """A table's home: ``storage`` is the storage device (``"cpu"`` or ``"cuda:N"``, N the CUDA
    ordinal) and ``tf_device`` the TensorFlow device of its handle and ops."""

    storage: str
    tf_device: str


CPU = Placement("cpu", "/device:CPU:0")


def _scope_device() -> tf.DeviceSpec:
    """The device of the innermost ``tf.device`` scope (empty fields where none is set)."""
    if tf.executing_eagerly():
        name = context.context().device_name or ""
    else:  # inside a graph (tf.function): the device an op created here would get
        name = tf.constant(0, name="sok_device_probe").device
    return tf.DeviceSpec.from_string(name)


@functools.cache
def _gpu_ordinals() -> tuple[int, ...]:
    """The CUDA ordinal of each logical TensorFlow GPU (``/GPU:i`` → ordinal ``[i]``)."""
    visible = tf.config.get_visible_devices("GPU")
    return tuple(int(d.name.rsplit(":", 1)[1]) for d in visible)


def _why_not_gpu(var_type: str) -> str | None:
    """Why a table of ``var_type`` cannot live on a GPU here (None: it can)."""
    if not tf.test.is_built_with_cuda():
        return "TensorFlow is built without CUDA"
    if not _gpu_ordinals():
        return "TensorFlow sees no GPU"
    if tf_ops.gpu_build() in (None, "none"):
        return (
            "sok-core was built without its GPU kernels (no CUDA toolkit was found); put nvcc on PATH and "
            "rebuild sok-core: pip install --no-build-isolation --force-reinstall --no-deps sok-core"
        )
    registry = get_registry()
    spec = registry.spec(var_type)
    if "cuda" not in spec.capabilities.devices or not registry.build_info(spec).get("cuda"):
        return (
            f"backend {spec.name!r} (var_type {var_type!r}) was built without CUDA; rebuild "
            f"{spec.package or spec.name} with the CUDA toolkit's nvcc on PATH"
        )
    try:
        import cupy  # noqa: F401 - the storage's Python methods use it on a GPU
    except ImportError:
        return f"CuPy is not installed ({CUPY_INSTALL_HINT})"
    return None


def of_scope(var_type: str) -> Placement:
    """Where a new table of ``var_type`` goes under the current ``tf.device`` scope.

    ``/CPU:*`` → the CPU; ``/GPU:i`` → GPU i; no device → GPU 0 where TensorFlow has one, else
    the CPU. A GPU that cannot hold the table (see the module docstring) gives the CPU, with a
    warning when a GPU was asked for or TensorFlow has one.
    """
    spec = _scope_device()
    kind = (spec.device_type or "").upper()
    if kind == "CPU":
        return CPU
    if kind not in ("", "GPU"):
        raise ValueError(
            f"a sok.DynamicVariable cannot live on {kind} (device scope {spec.to_string()!r}); valid: "
            f"tf.device('/GPU:i') or tf.device('/CPU:0')"
        )
    reason = _why_not_gpu(var_type)
    if reason is not None:
        if kind or _gpu_ordinals():
            logger.warning("the table of this sok.DynamicVariable stays on the CPU: %s", reason)
        return CPU
    index = spec.device_index or 0
    ordinals = _gpu_ordinals()
    if index >= len(ordinals):
        raise ValueError(
            f"tf.device('/GPU:{index}') names no GPU: TensorFlow sees {len(ordinals)} "
            f"(valid: /GPU:0 .. /GPU:{len(ordinals) - 1}, or /CPU:0)"
        )
    return Placement(f"cuda:{ordinals[index]}", f"/device:GPU:{index}")


def default_home(var_type: str) -> str:
    """Where a table of ``var_type`` goes outside any ``tf.device`` scope, for ``sok info``:
    ``"cuda:N"``, or ``"cpu (why not a GPU)"``."""
    reason = _why_not_gpu(var_type)
    return f"cpu ({reason})" if reason else f"cuda:{_gpu_ordinals()[0]}"


def pin_local_gpu(local_rank: int, local_size: int) -> str | None:
    """Make this rank's GPU the only one TensorFlow sees, where ``local_size`` ranks share a host
    with several GPUs and nobody has chosen yet (TensorFlow sees every GPU of the host). Rank
    ``local_rank`` of the host gets GPU ``local_rank`` (modulo the GPUs, with a warning when ranks
    must share one). ``sok.init`` calls it before anything runs on a GPU; a choice made before it
    is kept: it does nothing when ``CUDA_VISIBLE_DEVICES`` is set in the environment at all (any
    value, e.g. ``"1,0"`` or ``""``), or when ``tf.config.set_visible_devices`` already hid GPUs.

    Returns:
        The name of the GPU pinned (``"/physical_device:GPU:1"``), or None where nothing changed.

    Example::

        placement.pin_local_gpu(hvd.local_rank(), hvd.local_size())   # rank 1 of 2: GPU 1 only
    """
    if local_size < 2 or "CUDA_VISIBLE_DEVICES" in os.environ or not tf.test.is_built_with_cuda():
        return None
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) < 2 or len(tf.config.get_visible_devices("GPU")) != len(gpus):
        return None  # one GPU per process already, or the user chose
    gpu = gpus[local_rank % len(gpus)]
    try:
        tf.config.set_visible_devices([gpu], "GPU")
    except RuntimeError:
        logger.warning(
            "sok.init: TensorFlow has already set up its GPUs, so rank %d of this host sees all %d and may open "
            "contexts on the other ranks' GPUs: call sok.init() before anything runs on a GPU, or pin the rank "
            'yourself first (tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU"), or CUDA_VISIBLE_DEVICES)',
            local_rank,
            len(gpus),
        )
        return None
    _gpu_ordinals.cache_clear()
    if local_size > len(gpus):
        logger.warning(
            "sok.init: %d ranks share this host's %d GPUs, so some GPUs serve several ranks; Horovod built with "
            "NCCL then fails in its first collective of GPU tensors ('ncclCommInitRank failed: invalid usage': NCCL "
            "takes one rank per GPU): start at most one rank per GPU, or run the ranks on the CPU "
            "(CUDA_VISIBLE_DEVICES='')",
            local_size,
            len(gpus),
        )
    logger.info(
        "sok.init: rank %d of this host uses %s only (set CUDA_VISIBLE_DEVICES or tf.config.set_visible_devices "
        "before sok.init() to choose another)",
        local_rank,
        gpu.name,
    )
    return gpu.name


def share_gpu_memory() -> None:
    """Let TensorFlow take GPU memory as it needs it instead of all of it at start-up (memory
    growth, as ``TF_FORCE_GPU_ALLOW_GROWTH=true``): SOK's GPU tables allocate their memory beside
    TensorFlow's allocator. ``sok.init`` calls it; it is too late once TensorFlow has set up its
    GPUs, and then a warning says how to do it.
    """
    if not tf.test.is_built_with_cuda():
        return
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            if not tf.config.experimental.get_memory_growth(gpu):
                tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:
            logger.warning(
                "TensorFlow has already set up %s and may hold most of its memory, which SOK's GPU tables need "
                "too: call sok.init() before anything runs on the GPU, or set TF_FORCE_GPU_ALLOW_GROWTH=true",
                gpu.name,
            )
            return
