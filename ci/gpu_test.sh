#!/usr/bin/env bash
# GPU tests of the storage backends, on a CUDA host with no network (run as root or not, from anywhere):
#
#   ci/gpu_test.sh [--build-only] [--reuse-build] [--tf[=core|hps]] [--multi-gpu] [--sanitize] [--bench] [--profile]
#                  [--scaling]
#
#   build     sok-core, sok-backend-det, sok-backend-hkv with CUDA for CMAKE_CUDA_ARCHITECTURES (default 90), and sok-hps
#             (sok-core's op libraries and sok-hps's, the ops of NVIDIA's HPS plugin, against the TensorFlow of $PYTHON
#             where it imports), into $SOK_GPU_WORK/site (default /tmp/sok-gpu/site) with $PYTHON (default
#             python3: the one holding CuPy, Torch, pybind11, scikit-build-core, pytest). Not a venv:
#             a venv made from a venv's python sees only the base interpreter's packages, not CuPy.
#             --reuse-build skips the build when the site already holds this checkout's build (a
#             second device call after a first that built it); without one it builds as usual.
#   tests     (not with --build-only) pytest over the backends' tests (their CUDA conformance and device-array modules
#             included) and sok-core's tests that need no TensorFlow.
#   tf        (--tf, needs a CUDA TensorFlow importable by $PYTHON: ../shared/tools/tf-gpu) the seed
#             examples and sok-core's TensorFlow tests on the GPU (every DynamicVariable of them lives
#             there: optimizer and lookup_sparse oracles, checkpoints, the graph checks) with its
#             GPU-kernel tests (test_*_gpu.py), and sok-hps's tests (its caches on the GPU); multi-process
#             tests skip (no Horovod there). --tf=core runs the examples and sok-core's tests only,
#             --tf=hps sok-hps's only: with --build-only (no storage tests) and --reuse-build, each
#             part fits in one 10-minute device call.
#   multi-gpu (--multi-gpu, needs a CUDA TensorFlow as --tf does, and the Horovod sdist at $SOK_HOROVOD_SDIST where
#             the host has no package index) Horovod with NCCL built by ci/build_horovod.sh into the site (its
#             wheel cached under $SOK_GPU_WORK/cache), then sok-core's multi-process tests with their ranks on
#             the host's GPUs (SOK_MULTIPROCESS_ON_GPUS=1: each rank pinned to its GPU by sok.init, NCCL for GPU
#             tensors, NCCL_NVLS_ENABLE=0), the GPU pinning test among them.
#   sanitize  (--sanitize) compute-sanitizer memcheck and racecheck over the CUDA conformance tests
#             selected by -k "$SOK_SANITIZE_K" (default find_or_insert), CuPy's memory pool off; with
#             --tf also memcheck over sok-core's GPU-kernel tests (TF_GPU_ALLOCATOR=cuda_malloc_async,
#             so each tensor is an allocation the sanitizer tracks).
#   bench     (--bench) python benchmarks/storage_gpu.py, with --hkv "$SOK_HKV" when SOK_HKV is set (HKV's
#             benchmark beside ours: a driver built by benchmarks/build_hkv.sh, or an HKV source tree).
#   profile   (--profile) python benchmarks/profile_gpu.py $SOK_PROFILE_ARGS: kernel time per operation
#             (CUPTI); several runs when SOK_PROFILE_ARGS holds several argument lists separated by ';'.
#   scaling   (--scaling, needs what --multi-gpu needs) Horovod with NCCL installed as --multi-gpu does, then
#             benchmarks/scaling_gpu.py under horovodrun --gloo at np $SOK_SCALING_NP (default "1 2", and 4 where
#             the host has 4 GPUs; np above the GPU count is skipped), then, where /tmp/torchrec/env.sh exists
#             (ci/stage_torchrec.sh), benchmarks/scaling_torchrec.py under torchrun at the same np (its
#             all-to-all at SOK's bytes), and the table of scaling_gpu.py --summarize. Default matrix: static and
#             dynamic tables, dims 32 and 128, hotness 2, batch 65536 per GPU, 20 steps, best of 3. Extra
#             arguments: $SOK_SCALING_ARGS to both scripts (e.g. "--dims 32 --hotness 1,multi --steps 10"),
#             $SOK_SCALING_SOK_ARGS to scaling_gpu.py only (e.g. "--kinds static,localized,dynamic --ids
#             gpu,host"), $SOK_SCALING_TORCHREC_ARGS to scaling_torchrec.py only (e.g. "--sharding tw").
#             With SOK_SCALING_DLRM=1 also the demo's DLRM end to end (benchmarks/dlrm_scaling.py): one
#             process at $SOK_SCALING_DLRM_BATCH (default 65536) and, per np N, one process and N ranks
#             at N times that; dim $SOK_SCALING_DLRM_DIM (128), $SOK_SCALING_DLRM_STEPS (100) steps.
#
# Logs: build.log, test.log, tf.log, multi_gpu.log, sanitizer.log, bench.log, profile.log, scaling.log (and the
# scaling runs' scaling_*.log, scaling_*.json, scaling_summary.md, dlrm_*.{log,json}, dlrm_scaling.md) in $OUT
# when set, else in $SOK_GPU_WORK/logs.
# Every step runs (tests only after a good build); a summary ends the output; the exit status is
# non-zero when any step failed. Idempotent: the site is rebuilt each run (unless --reuse-build
# finds it current), the CMake build trees under $SOK_GPU_WORK/build are kept, so a second run
# recompiles only what changed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

SANITIZE=0
TF_TESTS=0
BENCH=0
PROFILE=0
TESTS=1
TF_PART=all
REUSE=0
MULTI_GPU=0
SCALING=0
for arg in "$@"; do
  case "$arg" in
    --build-only) TESTS=0 ;;
    --reuse-build) REUSE=1 ;;
    --tf | --tf=all) TF_TESTS=1 ;;
    --tf=core | --tf=hps) TF_TESTS=1 TF_PART="${arg#--tf=}" ;;
    --multi-gpu) MULTI_GPU=1 ;;
    --sanitize) SANITIZE=1 ;;
    --bench) BENCH=1 ;;
    --profile) PROFILE=1 ;;
    --scaling) SCALING=1 ;;
    -h | --help) sed -n '2,50p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ci/gpu_test.sh: unknown argument '$arg' (valid: --build-only, --reuse-build, --tf, --tf=core, --tf=hps, --multi-gpu, --sanitize, --bench, --profile, --scaling, --help)" >&2; exit 2 ;;
  esac
done

PYTHON="${PYTHON:-python3}"
WORK="${SOK_GPU_WORK:-/tmp/sok-gpu}"
SITE="$WORK/site"
BUILD="$WORK/build/$(printf '%s' "$ROOT" | cksum | cut -d' ' -f1)"  # one CMake tree per checkout
LOGS="${OUT:-$WORK/logs}"
SAN_K="${SOK_SANITIZE_K:-find_or_insert}"
mkdir -p "$LOGS" "$BUILD"

export CMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}"
export CUDAARCHS="$CMAKE_CUDA_ARCHITECTURES"
if ! command -v nvcc >/dev/null 2>&1; then
  for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    if [ -n "$dir" ] && [ -x "$dir/bin/nvcc" ]; then export PATH="$PATH:$dir/bin"; break; fi
  done
fi
if command -v nvcc >/dev/null 2>&1; then export CUDACXX="${CUDACXX:-$(command -v nvcc)}"; fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TF_CPP_MIN_LOG_LEVEL=2

RESULTS=()
FAILED=0
OK=0

# step NAME LOG FUNCTION: run FUNCTION (under set -e, in a subshell) with its output in LOG, record
# PASS or FAIL in RESULTS and OK, never exit. Not called as a condition: that would switch off set -e
# inside FUNCTION.
step() {
  local name="$1" log="$2" fn="$3" start=$SECONDS rc
  echo "== $name (log: $log)"
  set +e
  (
    set -e
    "$fn"
  ) >"$log" 2>&1
  rc=$?
  set -e
  if [ "$rc" = 0 ]; then
    OK=1
    RESULTS+=("PASS  $name ($((SECONDS - start)) s)")
  else
    OK=0
    FAILED=1
    RESULTS+=("FAIL  $name (exit $rc, $((SECONDS - start)) s; log: $log)")
    echo "-- $name failed (exit $rc); the end of its log:"
    tail -n 60 "$log"
  fi
}

# The build's stamp, which --reuse-build compares: a checksum of the packages' files and where
# TensorFlow is (sok-core's and sok-hps's TensorFlow ops are built only where it is importable).
sources_sum() {
  find packages -type f -not -path '*/__pycache__/*' -not -path '*.egg-info/*' -print0 | sort -z | xargs -0 cksum | cksum
  "$PYTHON" -c 'import importlib.util as u; s = u.find_spec("tensorflow"); print(s.origin if s else "no tensorflow")'
}

build() {
  if [ "$REUSE" = 1 ] && [ -f "$SITE/.sok-sources" ] && [ "$(cat "$SITE/.sok-sources")" = "$(sources_sum)" ]; then
    echo "--reuse-build: $SITE holds the build of these sources; not rebuilt"
    return 0
  fi
  set -x
  "$PYTHON" -c 'import sys; print(sys.executable, sys.version)'
  "$PYTHON" -c 'import cupy, numpy, pybind11, scikit_build_core; print("cupy", cupy.__version__, "numpy", numpy.__version__, "pybind11", pybind11.__version__, "scikit-build-core", scikit_build_core.__version__)'
  nvcc --version
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  rm -rf "$SITE"
  mkdir -p "$SITE"
  local pkg
  for pkg in sok-core sok-backend-det sok-backend-hkv sok-hps; do
    "$PYTHON" -m pip install --no-index --no-build-isolation --no-deps --no-cache-dir \
      --disable-pip-version-check -v --target "$SITE" \
      -C "build-dir=$BUILD/$pkg" -C build.verbose=true -C logging.level=INFO \
      -C "cmake.define.CMAKE_CUDA_ARCHITECTURES=$CMAKE_CUDA_ARCHITECTURES" \
      -C "cmake.define.Python_EXECUTABLE=$(command -v "$PYTHON")" \
      "./packages/$pkg"
  done
  "$PYTHON" - <<'EOF'
import sok_backend_det._core as det
import sok_backend_hkv._core as hkv
from sparse_operation_kit import _table

print("sparse_operation_kit._table", _table.__file__, "WITH_CUDA:", _table.WITH_CUDA,
      "cuda_device_count:", _table.cuda_device_count())
assert _table.WITH_CUDA, "sok-core's binding (sparse_operation_kit._table) was built without CUDA"
for core in (det, hkv):
    print(core.__name__, core.__file__, core.BUILD_INFO)
    assert core.BUILD_INFO["cuda"], f"{core.__name__} was built without CUDA"
EOF
  sources_sum >"$SITE/.sok-sources"
}

run_tests() {
  "$PYTHON" -m pytest -q -rs -p no:cacheprovider -o faulthandler_timeout=600 \
    packages/sok-backend-det/tests packages/sok-backend-hkv/tests \
    packages/sok-core/tests/test_storage_facade.py packages/sok-core/tests/test_conformance_pydict.py \
    packages/sok-core/tests/test_registry.py packages/sok-core/tests/test_initializers.py
}

# The TensorFlow-level tests, on the GPU.
tf_tests() {
  # One process holds TensorFlow and the GPU tables, which allocate beside TensorFlow's allocator.
  export TF_FORCE_GPU_ALLOW_GROWTH=true
  "$PYTHON" - <<'EOF'
import tensorflow as tf
from sparse_operation_kit import tf_ops

tf_ops.library()
gpus = tf.config.list_logical_devices("GPU")
print("TensorFlow", tf.__version__, "CUDA build:", tf.test.is_built_with_cuda(), "GPUs:", gpus)
assert tf.test.is_built_with_cuda() and gpus, "no CUDA TensorFlow with a GPU here"
assert tf_ops.gpu_build() not in (None, "none"), f"sok-core has no GPU kernels (gpu_build: {tf_ops.gpu_build()})"
EOF
  local example tests=()
  if [ "$TF_PART" != hps ]; then
    for example in examples/*.py; do
      if grep -q "^import horovod" "$example" && ! "$PYTHON" -c "import horovod.tensorflow" 2>/dev/null; then
        echo "== $example: skipped (it runs under Horovod, which is not installed here)"
        continue
      fi
      echo "== $example"
      "$PYTHON" "$example"
    done
    tests+=(packages/sok-core/tests)
  fi
  [ "$TF_PART" = core ] || tests+=(packages/sok-hps/tests)
  "$PYTHON" -m pytest -q -rs -p no:cacheprovider -o faulthandler_timeout=600 -m "not multiprocess" "${tests[@]}"
}

# Horovod with NCCL into the site (its wheel cached under $WORK/cache), and the GPUs' links.
install_horovod() {
  SOK_CACHE_DIR="$WORK/cache" bash ci/build_horovod.sh "$PYTHON" --gpu nccl --target "$SITE" \
    ${SOK_HOROVOD_SDIST:+--sdist "$SOK_HOROVOD_SDIST"}
  nvidia-smi topo -m || true
}

# sok-core's multi-process tests with one rank per GPU (Horovod with NCCL installed into the site).
multi_gpu() {
  install_horovod
  PATH="$SITE/bin:$PATH" SOK_MULTIPROCESS_ON_GPUS=1 NCCL_NVLS_ENABLE=0 TF_FORCE_GPU_ALLOW_GROWTH=true \
    "$PYTHON" -m pytest -q -rs -p no:cacheprovider -o faulthandler_timeout=600 -m multiprocess packages/sok-core/tests
}

sanitize() {
  local sanitizer tool rc=0
  sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  if [ "$TF_TESTS" = 1 ]; then
    echo "== compute-sanitizer --tool memcheck, sok-core's GPU-kernel tests"
    TF_FORCE_GPU_ALLOW_GROWTH=true TF_GPU_ALLOCATOR=cuda_malloc_async "$sanitizer" --tool memcheck --error-exitcode 99 --print-limit 50 \
      "$PYTHON" -m pytest -q -p no:cacheprovider --maxfail=1 packages/sok-core/tests/test_*_gpu.py || rc=$?
  fi
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool, pytest -k '$SAN_K'"
    # CuPy's pool off: every array its own cudaMalloc, so memcheck sees overruns between arrays.
    "$sanitizer" --tool "$tool" --error-exitcode 99 --print-limit 50 \
      "$PYTHON" -c 'import sys, cupy, pytest; cupy.cuda.set_allocator(None); sys.exit(pytest.main(sys.argv[1:]))' \
      -q -p no:cacheprovider --maxfail=1 -k "$SAN_K" \
      packages/sok-backend-det/tests/test_conformance_cuda.py packages/sok-backend-hkv/tests/test_conformance_cuda.py ||
      rc=$?
  done
  return "$rc"
}

bench() {
  if [ ! -f benchmarks/storage_gpu.py ]; then
    echo "benchmarks/storage_gpu.py is missing"
    return 1
  fi
  if [ -n "${SOK_HKV:-}" ]; then
    "$PYTHON" benchmarks/storage_gpu.py --hkv "$SOK_HKV"
  else
    "$PYTHON" benchmarks/storage_gpu.py
  fi
}

profile() {
  local runs one
  IFS=';' read -ra runs <<<"${SOK_PROFILE_ARGS:-}"
  [ "${#runs[@]}" -gt 0 ] || runs=("")
  for one in "${runs[@]}"; do
    # shellcheck disable=SC2086  # each list is split into its arguments
    "$PYTHON" benchmarks/profile_gpu.py $one
  done
}

# SOK's training step at np 1, 2 (4) with one Horovod rank per GPU, TorchRec's beside it, and their table.
scaling() {
  install_horovod
  local gpus n rc=0 nps jsons=()
  gpus=$(nvidia-smi --list-gpus | wc -l)
  nps="1 2"
  if [ "$gpus" -ge 4 ]; then nps="1 2 4"; fi
  nps="${SOK_SCALING_NP:-$nps}"
  # shellcheck disable=SC2206  # the settings are split into their arguments
  local common=(${SOK_SCALING_ARGS:-}) sok_args=(${SOK_SCALING_SOK_ARGS:-}) rec_args=(${SOK_SCALING_TORCHREC_ARGS:-})
  export NCCL_NVLS_ENABLE=0 TF_FORCE_GPU_ALLOW_GROWTH=true HOROVOD_STALL_CHECK_TIME_SECONDS=60 \
    HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=300
  for n in $nps; do
    if [ "$n" -gt "$gpus" ]; then
      echo "== np $n: skipped (the host has $gpus GPU(s))"
      continue
    fi
    echo "== scaling_gpu.py, np $n (log: $LOGS/scaling_sok_np$n.log)"
    PATH="$SITE/bin:$PATH" horovodrun -np "$n" -H "localhost:$n" --gloo "$PYTHON" benchmarks/scaling_gpu.py \
      "${common[@]}" "${sok_args[@]}" --json "$LOGS/scaling_sok_np$n.json" >"$LOGS/scaling_sok_np$n.log" 2>&1 || rc=1
    grep -v '<stderr>' "$LOGS/scaling_sok_np$n.log" | tail -n 30 || true
    [ -f "$LOGS/scaling_sok_np$n.json" ] && jsons+=("$LOGS/scaling_sok_np$n.json")
  done
  if [ -f /tmp/torchrec/env.sh ]; then
    for n in $nps; do
      [ "$n" -le "$gpus" ] || continue
      echo "== scaling_torchrec.py, np $n (log: $LOGS/scaling_torchrec_np$n.log)"
      local a2a_from=()
      if [ -f "$LOGS/scaling_sok_np$n.json" ]; then a2a_from=(--a2a-from "$LOGS/scaling_sok_np$n.json"); fi
      (
        source /tmp/torchrec/env.sh
        "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$n" benchmarks/scaling_torchrec.py \
          "${common[@]}" "${rec_args[@]}" --json "$LOGS/scaling_torchrec_np$n.json" "${a2a_from[@]}"
      ) >"$LOGS/scaling_torchrec_np$n.log" 2>&1 || rc=1
      tail -n 30 "$LOGS/scaling_torchrec_np$n.log"
      [ -f "$LOGS/scaling_torchrec_np$n.json" ] && jsons+=("$LOGS/scaling_torchrec_np$n.json")
    done
  else
    echo "== scaling_torchrec.py: skipped (no /tmp/torchrec/env.sh: stage TorchRec with ci/stage_torchrec.sh first)"
  fi
  if [ "${#jsons[@]}" -gt 0 ]; then
    "$PYTHON" benchmarks/scaling_gpu.py --summarize "${jsons[@]}" | tee "$LOGS/scaling_summary.md" || rc=1
  fi
  if [ "${SOK_SCALING_DLRM:-0}" = 1 ]; then dlrm_scaling "$gpus" $nps || rc=1; fi
  return "$rc"
}

# The demo's DLRM trained end to end (benchmarks/dlrm_scaling.py): one process at the batch per rank,
# and for each np N > 1 one process and N ranks at N x that batch (the same training: their AUCs agree).
dlrm_scaling() {
  local gpus="$1" n b runs=() per_rank="${SOK_SCALING_DLRM_BATCH:-65536}" rc=0
  shift
  local jobs=("1 $per_rank")
  for n in "$@"; do
    if [ "$n" -gt 1 ] && [ "$n" -le "$gpus" ]; then jobs+=("1 $((n * per_rank))" "$n $((n * per_rank))"); fi
  done
  for job in "${jobs[@]}"; do
    read -r n b <<<"$job"
    local out="$WORK/dlrm/np${n}_b${b}"
    rm -rf "$out"
    echo "== the demo's DLRM, np $n, global batch $b (log: $LOGS/dlrm_np${n}_b${b}.log)"
    PATH="$SITE/bin:$PATH" horovodrun -np "$n" -H "localhost:$n" --gloo "$PYTHON" -m sparse_operation_kit.cli demo \
      --part train --output "$out" --dim "${SOK_SCALING_DLRM_DIM:-128}" --batch-size "$b" \
      --steps "${SOK_SCALING_DLRM_STEPS:-100}" --epochs 1 --eval-batches 4 >"$LOGS/dlrm_np${n}_b${b}.log" 2>&1 || rc=1
    if [ -f "$out/demo.json" ]; then
      cp "$out/demo.json" "$LOGS/dlrm_np${n}_b${b}.json"
      runs+=("$out")
    fi
  done
  if [ "${#runs[@]}" -gt 0 ]; then
    "$PYTHON" benchmarks/dlrm_scaling.py "${runs[@]}" | tee "$LOGS/dlrm_scaling.md" || rc=1
  fi
  return "$rc"
}

step build "$LOGS/build.log" build
if [ "$OK" = 1 ]; then
  if [ "$TESTS" = 1 ]; then
    step tests "$LOGS/test.log" run_tests
    tail -n 25 "$LOGS/test.log"
  fi
  if [ "$TF_TESTS" = 1 ]; then
    step tf "$LOGS/tf.log" tf_tests
    tail -n 25 "$LOGS/tf.log"
  fi
  if [ "$MULTI_GPU" = 1 ]; then
    step multi-gpu "$LOGS/multi_gpu.log" multi_gpu
    tail -n 40 "$LOGS/multi_gpu.log"
  fi
  if [ "$SANITIZE" = 1 ]; then step sanitizer "$LOGS/sanitizer.log" sanitize; fi
  if [ "$BENCH" = 1 ]; then
    step bench "$LOGS/bench.log" bench
    cat "$LOGS/bench.log"
  fi
  if [ "$PROFILE" = 1 ]; then
    step profile "$LOGS/profile.log" profile
    cat "$LOGS/profile.log"
  fi
  if [ "$SCALING" = 1 ]; then
    step scaling "$LOGS/scaling.log" scaling
    cat "$LOGS/scaling.log"
  fi
else
  RESULTS+=("SKIP  tests, sanitizer, bench (the build failed)")
fi

echo
echo "== ci/gpu_test.sh summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || echo 'no GPU'); logs in $LOGS)"
printf '%s\n' "${RESULTS[@]}"
exit "$FAILED"
