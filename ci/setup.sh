#!/usr/bin/env bash
# Set up the development environment in .venv: TensorFlow, Horovod (patched sdist), build tools and
# the four packages of this repository. Idempotent: a second run only rebuilds packages whose sources
# changed. Usage: ci/setup.sh            (env: PYTHON=python3.11 to pick the interpreter)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
CACHE="${SOK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sok-dev}"
TF_VERSION="2.21.0"
HOROVOD_VERSION=$(sed -n 's/^HOROVOD_VERSION="\(.*\)"$/\1/p' "$ROOT/ci/build_horovod.sh")  # its one home
PACKAGES=(sok-core sok-backend-det sok-backend-hkv sok-hps)
STEPS=6
START=$(date +%s)
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

step() { printf '\n\033[1m[%s/%s] %s\033[0m  (+%ss)\n' "$1" "$STEPS" "$2" "$(( $(date +%s) - START ))"; }
pip_q() { "$PY" -m pip install --disable-pip-version-check --progress-bar on "$@"; }

step 1 "virtual environment at .venv"
if [[ ! -x "$PY" ]]; then
  "${PYTHON:-python3}" -m venv "$VENV"
  echo "created $VENV"
else
  echo "exists"
fi

step 2 "build and test tools"
# One requirements file holds the pins of the dev tools: ci/requirements-dev.txt.
REQ_STAMP="$VENV/.sok-requirements.sha"
REQ_SHA=$(sha256sum "$ROOT/ci/requirements-dev.txt" | cut -d' ' -f1)
if [[ "$(cat "$REQ_STAMP" 2>/dev/null)" != "$REQ_SHA" ]]; then
  pip_q -r "$ROOT/ci/requirements-dev.txt"
  echo "$REQ_SHA" >"$REQ_STAMP"
else
  echo "up to date"
fi

step 3 "TensorFlow $TF_VERSION"
# Any distribution of TensorFlow (tensorflow, tensorflow-cpu, a vendor build) of this minor version.
TF_FOUND=$("$PY" - <<PYEOF
from importlib.metadata import distributions
found = [d.version for d in distributions()
         if (d.metadata["Name"] or "").lower().startswith(("tensorflow", "intel-tensorflow", "tf-nightly"))
         and (d.metadata["Name"] or "").lower() not in ("tensorflow-estimator", "tensorflow-io-gcs-filesystem")
         and d.version.startswith("${TF_VERSION%.*}")]
print(found[0] if found else "")
PYEOF
)
if [[ -n "$TF_FOUND" ]]; then
  echo "found $TF_FOUND"
else
  # CPU build by default; an already installed TensorFlow of the right version is kept (above).
  pip_q "${SOK_TF_PACKAGE:-tensorflow-cpu}==$TF_VERSION"
fi
# tf_keras (Keras 2), for the tests of sok.OptimizerWrapper over its optimizers. --no-deps: its
# metadata names the `tensorflow` distribution, which would replace tensorflow-cpu.
if ! "$PY" -c "import tf_keras" 2>/dev/null; then
  pip_q --no-deps "tf_keras==$TF_VERSION"
fi

step 4 "Horovod $HOROVOD_VERSION (TensorFlow + Gloo, and NCCL where CUDA and NCCL are found)"
# ci/build_horovod.sh builds it from the patched sdist (its header lists the patches) and caches the
# wheel; the stamp names the script's contents, so a new patch set or GPU mode rebuilds.
HVD_STAMP="$VENV/.sok-horovod-built"
HVD_BUILT="horovod $HOROVOD_VERSION $(sha256sum "$ROOT/ci/build_horovod.sh" | cut -c1-16)"
if [[ -f "$HVD_STAMP" ]] && [[ "$(cat "$HVD_STAMP")" == "$HVD_BUILT"* ]] \
  && "$PY" -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('horovod') else 1)"; then
  echo "found $(cat "$HVD_STAMP")"
else
  SOK_CACHE_DIR="$CACHE" bash "$ROOT/ci/build_horovod.sh" "$PY"
  echo "$HVD_BUILT for TensorFlow $("$PY" -c 'import tensorflow as tf; print(tf.__version__)')" >"$HVD_STAMP"
fi

step 5 "system packages: redis-server (the Redis tests of sok-hps), librocksdb-dev and libhiredis-dev (its C++ tiers)"
# apt-get as root (CI) or through passwordless sudo; without either the Redis tests skip and the C++
# RocksDB and Redis tiers are not built (their tests skip and say why). Debian's packages: RocksDB's
# own library, and hiredis, the Redis project's C client (the cluster routing is sok-hps's).
SYSTEM_PACKAGES=(redis-server librocksdb-dev libhiredis-dev)
have_system_packages() {
  command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 \
    && [[ -f /usr/include/rocksdb/db.h && -f /usr/include/hiredis/hiredis.h ]]
}
if have_system_packages; then
  echo "found redis-server $(redis-server --version | cut -d' ' -f3), RocksDB and hiredis headers"
elif ! command -v apt-get >/dev/null 2>&1; then
  echo "warning: ${SYSTEM_PACKAGES[*]} missing and no apt-get; the tests that need them will be skipped"
else
  SUDO=""
  [[ $EUID -ne 0 ]] && SUDO="sudo -n"
  if $SUDO true 2>/dev/null; then
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${SYSTEM_PACKAGES[@]}" \
      || echo "warning: apt-get install ${SYSTEM_PACKAGES[*]} failed; the tests that need them will be skipped"
  else
    echo "warning: ${SYSTEM_PACKAGES[*]} missing and apt-get needs root; the tests that need them will be skipped"
  fi
fi

step 6 "packages: ${PACKAGES[*]}"
# CUDA code (where nvcc is found) is built for this machine's GPU, or for one architecture (sm_90)
# on machines without one (CI), which keeps the build short; pip users get 80 and 90.
if [[ -z "${CUDAARCHS:-}" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    export CUDAARCHS=native
  else
    export CUDAARCHS=90
  fi
fi
for pkg in "${PACKAGES[@]}"; do
  dir="$ROOT/packages/$pkg"
  stamp="$VENV/.sok-built-$pkg.sha"
  # The backends and sok-hps compile sok-core's C headers with its CMake package: those are part of
  # their inputs. A tracked file deleted in the work tree is listed too, and skipped.
  sha=$(cd "$ROOT" && git ls-files -co --exclude-standard -- "packages/$pkg" \
          packages/sok-core/src/sparse_operation_kit/include packages/sok-core/src/sparse_operation_kit/cmake \
        | LC_ALL=C sort -u | while IFS= read -r f; do [[ -e $f ]] && printf '%s\0' "$f"; done \
        | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
  if [[ "$(cat "$stamp" 2>/dev/null)" == "$sha" ]]; then
    echo "$pkg: up to date"
    continue
  fi
  echo "$pkg: building"
  # No build isolation: the build tools come from step 2, TensorFlow from step 3 (sok-core's and
  # sok-hps's op libraries are built against it), and the backends and sok-hps find sok-core's CMake
  # package in this checkout. build-dir in each pyproject keeps CMake builds incremental.
  pip_q --no-deps --no-build-isolation "$dir"
  echo "$sha" >"$stamp"
done

printf '\nset-up done in %ss\n' "$(( $(date +%s) - START ))"
