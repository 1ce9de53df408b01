#!/usr/bin/env bash
# Build a Horovod wheel for one Python + TensorFlow from the patched sdist, and install it.
#
#   ci/build_horovod.sh PYTHON [--sdist FILE] [--wheel-dir DIR] [--target DIR] [--gpu auto|nccl|none]
#
#   PYTHON       the interpreter that holds TensorFlow (the wheel is built for it, without isolation).
#   --sdist      horovod-0.28.1.tar.gz; without it, pip downloads it (a host with no index: carry it).
#   --wheel-dir  where the wheel is kept (default: $SOK_CACHE_DIR/horovod-<ver>-<patches>-<gpu>-tf<tf>-<py>);
#                a wheel already there is reused, not rebuilt.
#   --target     install into this folder (pip --target: a GPU host's site folder) instead of
#                PYTHON's environment.
#   --gpu        nccl: GPU collectives through NCCL (HOROVOD_GPU_OPERATIONS=NCCL; needs CUDA at
#                $CUDA_HOME or /usr/local/cuda and nccl.h); none: CPU only (Gloo); auto (default):
#                nccl where nvcc and nccl.h are found, else none.
#
# The patches (one set, named by HVD_PATCHES; a new set gets a new name, so no older wheel is reused):
#   - the XLA ops are left out (their headers moved in TF 2.21; they are optional);
#   - the Gloo controller sizes its rank list instead of reserving it, so its stall inspector sees
#     the ranks and HOROVOD_STALL_SHUTDOWN_TIME_SECONDS ends a job whose rank skipped a collective;
#   - GPU builds: common.h and group_table.h include <cstdint>, <stdexcept> and <string>, which gcc 13
#     no longer brings in through other headers;
#   - GPU builds: mpi_ops.cc defines stream_executor::gpu::AsGpuStreamValue, which TF 2.21 no longer
#     exports (the library built, but `import horovod.tensorflow` failed on the undefined symbol).
# Each patch checks that it applied: a new sdist that no longer matches fails here, not at import.
set -euo pipefail

HOROVOD_VERSION="0.28.1"
HVD_PATCHES="p3"

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }
[[ $# -ge 1 ]] || { usage >&2; exit 2; }
case "$1" in -h | --help) usage; exit 0 ;; esac
PY="$1"
shift
SDIST="" WHEEL_DIR="" TARGET="" GPU="auto"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --sdist) SDIST="$2"; shift 2 ;;
    --wheel-dir) WHEEL_DIR="$2"; shift 2 ;;
    --target) TARGET="$2"; shift 2 ;;
    --gpu) GPU="$2"; shift 2 ;;
    *) echo "ci/build_horovod.sh: unknown argument '$1' (valid: --sdist, --wheel-dir, --target, --gpu; see --help)" >&2; exit 2 ;;
  esac
done

CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
has_nccl() {
  [[ -x "$CUDA_HOME/bin/nvcc" ]] || command -v nvcc >/dev/null 2>&1 || return 1
  local dir
  for dir in /usr/include "$CUDA_HOME/include" ${NCCL_HOME:+"$NCCL_HOME/include"}; do
    [[ -f "$dir/nccl.h" ]] && return 0
  done
  return 1
}
case "$GPU" in
  auto) if has_nccl; then GPU=nccl; else GPU=none; fi ;;
  nccl) has_nccl || { echo "ci/build_horovod.sh: --gpu nccl needs nvcc (CUDA_HOME=$CUDA_HOME) and nccl.h (/usr/include, \$CUDA_HOME/include or \$NCCL_HOME/include); none found" >&2; exit 2; } ;;
  none) ;;
  *) echo "ci/build_horovod.sh: --gpu '$GPU' is not one of auto, nccl, none" >&2; exit 2 ;;
esac

TF_TAG=$("$PY" -c 'import tensorflow as tf; print(tf.__version__)')
PY_TAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
CACHE="${SOK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sok-dev}"
WHEEL_DIR="${WHEEL_DIR:-$CACHE/horovod-$HOROVOD_VERSION-$HVD_PATCHES-$GPU-tf$TF_TAG-$PY_TAG}"

patch_sdist() {  # $1: the unpacked sdist
  local src="$1"
  sed -i '/xla_mpi_ops.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
  ! grep -q 'xla_mpi_ops.cc' "$src/horovod/tensorflow/CMakeLists.txt"
  local controller="$src/horovod/common/gloo/gloo_controller.cc"
  sed -i 's/global_ranks_.reserve(size_);/global_ranks_.resize(size_);/' "$controller"
  grep -q 'global_ranks_.resize(size_);' "$controller"
  [[ "$GPU" == nccl ]] || return 0
  local header
  for header in common.h group_table.h; do
    sed -i '0,/^#include </s//#include <cstdint>\n#include <stdexcept>\n#include <string>\n#include </' \
      "$src/horovod/common/$header"
    grep -q '^#include <stdexcept>' "$src/horovod/common/$header"
  done
  # After the stream.h include: the definition TF 2.21 no longer exports (the forward declaration
  # above it in the file stays).
  local ops="$src/horovod/tensorflow/mpi_ops.cc"
  "$PY" - "$ops" <<'EOF'
import sys

path = sys.argv[1]
text = open(path).read()
anchor = "#endif // TENSORFLOW_VERSION >= 2011000000\n#endif // HAVE_GPU\n"
definition = (
    "#endif // TENSORFLOW_VERSION >= 2011000000\n"
    "namespace stream_executor {\nnamespace gpu {\n"
    "GpuStreamHandle AsGpuStreamValue(Stream* stream) {\n"
    "  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);\n"
    "}\n} // namespace gpu\n} // namespace stream_executor\n"
    "#endif // HAVE_GPU\n"
)
if text.count(anchor) != 1:
    sys.exit(f"ci/build_horovod.sh: {path} no longer has the stream.h block this patch expects")
open(path, "w").write(text.replace(anchor, definition))
EOF
}

if ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
  echo "using the cached wheel in $WHEEL_DIR"
else
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
  if [[ -z "$SDIST" ]]; then
    "$PY" -m pip download --disable-pip-version-check --no-deps --no-binary :all: \
      "horovod==$HOROVOD_VERSION" -d "$WORK"
    SDIST="$WORK/horovod-$HOROVOD_VERSION.tar.gz"
  fi
  tar -xzf "$SDIST" -C "$WORK"
  patch_sdist "$WORK/horovod-$HOROVOD_VERSION"
  mkdir -p "$WHEEL_DIR"
  GPU_VARS=()
  if [[ "$GPU" == nccl ]]; then
    GPU_VARS=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$CUDA_HOME" HOROVOD_NCCL_LINK=SHARED
      HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-90}")
  fi
  echo "building the Horovod wheel ($GPU; about 90 s on 32 cores, 2-4 minutes on 2)"
  env "${GPU_VARS[@]}" HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
    "$PY" -m pip wheel --disable-pip-version-check --no-deps --no-build-isolation \
    "$WORK/horovod-$HOROVOD_VERSION" -w "$WHEEL_DIR"
fi

if [[ -n "$TARGET" ]]; then
  "$PY" -m pip install --disable-pip-version-check --no-deps --no-index --upgrade --target "$TARGET" "$WHEEL_DIR"/horovod-*.whl
  PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "import horovod, horovod.tensorflow as hvd; print('horovod', horovod.__version__, 'nccl_built:', hvd.nccl_built())"
else
  # Forced: a wheel of the same version with other patches must replace the installed one.
  "$PY" -m pip install --disable-pip-version-check --force-reinstall --no-deps "$WHEEL_DIR"/horovod-*.whl
  "$PY" -m pip install --disable-pip-version-check "$WHEEL_DIR"/horovod-*.whl  # its dependencies (psutil, cloudpickle, ...)
  "$PY" -c "import horovod, horovod.tensorflow as hvd; print('horovod', horovod.__version__, 'nccl_built:', hvd.nccl_built())"
fi
echo "horovod $HOROVOD_VERSION ($HVD_PATCHES, $GPU) for TensorFlow $TF_TAG"
