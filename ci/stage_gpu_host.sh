#!/usr/bin/env bash
# Stages what a session on a lent GPU host needs besides this checkout (the host has CUDA, CuPy,
# Torch, pybind11 and scikit-build-core, but no TensorFlow, no Horovod and no package index), so
# that device time goes to builds and runs. Run it here, in the project's root, after the CUDA
# TensorFlow's parts are in .device-tf/ (../shared/tools/tf-gpu/prepare.sh makes them):
#
#   bash ci/stage_gpu_host.sh            # -> .device-first/ (ignored by git through .git/info/exclude)
#
# .device-first/ holds the first call's carry (under 64 MiB): TensorFlow's last part, its small
# wheels and scripts (tf/), Horovod's sdist and the pure-Python packages horovodrun imports (py/),
# and two scripts: first.sh (the first call: stage all of that) and env.sh (source it on the host
# once TensorFlow is installed: TensorFlow, SOK's test site, Horovod's site, NCCL_NVLS_ENABLE=0).
# Then one call per other part, back to back (the host is given back about 30 s after a call), the
# last one finishing the install and running the build and whatever the session measures:
#
#   1. carry [".device-first"]     bash .device-first/first.sh
#   2. carry [".device-tf/c00"]    bash /tmp/tfgpu/install.sh stage c00     (c01 ... up to the part before cNN)
#   3. carry [".device-tf/cNN"]    (the part before the last) bash /tmp/tfgpu/install.sh stage cNN &&
#                                  bash /tmp/tfgpu/install.sh finish &&
#                                  source /tmp/stage/env.sh && bash ci/gpu_test.sh --build-only ... (and
#                                  SOK_CACHE_DIR=/tmp/hvd-cache bash ci/build_horovod.sh python3 --gpu nccl
#                                  --target /tmp/hvd-site --sdist "$SOK_HOROVOD_SDIST" for several GPUs)
set -euo pipefail
DEST=.device-first
PARTS=.device-tf
HOROVOD_VERSION=0.28.1
[ -d .git ] || { echo "ci/stage_gpu_host.sh: run it in the project's root (no .git here)" >&2; exit 2; }
parts=("$PARTS"/c[0-9][0-9])
if [ ! -e "${parts[0]}" ] || [ ! -f "$PARTS/install.sh" ]; then
  echo "ci/stage_gpu_host.sh: no TensorFlow parts in $PARTS; make them first: bash ../shared/tools/tf-gpu/prepare.sh" >&2
  exit 2
fi
last="${parts[-1]##*/}"
mkdir -p .git/info
grep -qx "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >>.git/info/exclude
rm -rf "$DEST"
mkdir -p "$DEST/tf" "$DEST/py"
cp -r "$PARTS/$last" "$PARTS/whl" "$PARTS/install.sh" "$PARTS/env.sh" "$PARTS/sha256" "$DEST/tf/"

# Horovod's sdist (ci/build_horovod.sh patches and builds it there) and horovodrun's imports, for
# the host's Python 3.12.
python3 -m pip download -q --no-deps --no-binary :all: -d "$DEST/py" "horovod==$HOROVOD_VERSION"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$DEST/py" cloudpickle psutil pyyaml

cat >"$DEST/first.sh" <<EOF
#!/usr/bin/env bash
# The first call on the GPU host: TensorFlow's last part and small wheels, Horovod's sdist and
# horovodrun's packages (into /tmp/stage/site), this env.sh to /tmp/stage.
set -euo pipefail
mkdir -p .device-tf /tmp/stage/py
cp -r .device-first/tf/. .device-tf/
cp .device-first/env.sh /tmp/stage/
cp .device-first/py/* /tmp/stage/py/
python3 -m pip install -q --no-index --no-deps --target /tmp/stage/site /tmp/stage/py/*.whl
bash .device-tf/install.sh stage $last --first
nvidia-smi --query-gpu=name,memory.total --format=csv
EOF
cat >"$DEST/env.sh" <<EOF
# Source on the GPU host once TensorFlow is installed (install.sh finish): TensorFlow from
# /tmp/tfsite, SOK's test site (ci/gpu_test.sh), Horovod's site (ci/build_horovod.sh --target
# /tmp/hvd-site), horovodrun's packages; NVLink multicast off for every rank.
source /tmp/tfgpu/env.sh
export SOK_GPU_WORK=/tmp/sok-gpu SOK_HOROVOD_SDIST=/tmp/stage/py/horovod-$HOROVOD_VERSION.tar.gz
export PYTHONPATH="/tmp/sok-gpu/site:/tmp/hvd-site:/tmp/stage/site\${PYTHONPATH:+:\$PYTHONPATH}"
export PATH="/tmp/hvd-site/bin:/tmp/sok-gpu/site/bin:\$PATH"
export NCCL_NVLS_ENABLE=0 TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1
export HOROVOD_STALL_CHECK_TIME_SECONDS=60 HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=300
EOF
echo "staged $DEST ($(du -sh "$DEST" | cut -f1)); the calls, back to back:"
echo "  carry [\"$DEST\"]   bash $DEST/first.sh"
for p in "${parts[@]:0:${#parts[@]}-1}"; do
  echo "  carry [\"$PARTS/${p##*/}\"]   bash /tmp/tfgpu/install.sh stage ${p##*/}"
done
echo "  the last of these appends: && bash /tmp/tfgpu/install.sh finish && source /tmp/stage/env.sh && <build, runs>"
