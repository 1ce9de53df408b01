#!/usr/bin/env bash
# Stages TorchRec + FBGEMM for the GPU host (torch 2.11 cu130 there, no package index), as
# ../shared/tools/tf-gpu/prepare.sh does for TensorFlow. Run it here, in the project's root:
#
#   bash ci/stage_torchrec.sh            # -> .device-torchrec/ (ignored by git through .git/info/exclude)
#
# It downloads fbgemm-gpu 1.6.0 (the cp312 manylinux_2_28 wheel: a CUDA 13 build), torchrec 1.6.1,
# tensordict 0.15.3 and the small pure-Python packages they import (installed on the host only where
# it lacks them), splits every file over 55 MiB into 55 MiB parts (a device call carries at most
# 64 MiB), and writes .device-torchrec/install.sh and env.sh. On the GPU host, one call per part:
#
#   bash .device-torchrec/install.sh stage c00 --first   # first call: also the small wheels and the scripts
#   bash /tmp/torchrec/install.sh stage c01              # the other parts, one per call
#   bash /tmp/torchrec/install.sh finish                 # joins, checks sha256, pip installs into /tmp/torchrec/site
#   source /tmp/torchrec/env.sh                          # puts that site on PYTHONPATH
#
# Every wheel is installed with --no-deps: torchrec's pin torchmetrics==1.0.3 would replace the
# host's torchmetrics, which works. It prints the part names and sizes and the calls to make.
set -euo pipefail
DEST=.device-torchrec
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sok-dev/torchrec"
FBGEMM=fbgemm_gpu-1.6.0-cp312-cp312-manylinux_2_28_x86_64.whl
PART_BYTES=$((55 * 1024 * 1024))
[ -d .git ] || { echo "ci/stage_torchrec.sh: run it in the project's root (no .git here)" >&2; exit 2; }
mkdir -p .git/info "$CACHE"
grep -qx "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >>.git/info/exclude
rm -rf "$DEST"
mkdir -p "$DEST/whl" "$DEST/extra"

PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
pipdl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" "$@"; }
[ -f "$CACHE/$FBGEMM" ] || pipdl -d "$CACHE" fbgemm-gpu==1.6.0
if [ ! -f "$CACHE/$FBGEMM" ]; then
  echo "ci/stage_torchrec.sh: pip did not bring $FBGEMM into $CACHE (it holds: $(ls "$CACHE"))" >&2
  exit 1
fi
# Installed always: what torchrec is.
pipdl -d "$DEST/whl" torchrec==1.6.1 tensordict==0.15.3 pyvers==0.2.3 iopath==0.1.9
# Installed only where the host cannot import them (imported by torchrec, tensordict or iopath).
pipdl -d "$DEST/extra" pyre-extensions typing-inspect mypy-extensions cloudpickle tqdm portalocker

rm -f "$DEST"/c[0-9][0-9]
split -b "$PART_BYTES" -d -a 2 "$CACHE/$FBGEMM" "$DEST/c"
sha256sum "$CACHE/$FBGEMM" | cut -d' ' -f1 >"$DEST/sha256"
echo "$FBGEMM" >"$DEST/wheel-name"

cat >"$DEST/install.sh" <<'EOF'
#!/usr/bin/env bash
# On the GPU host: stage the parts made by ci/stage_torchrec.sh, then install into /tmp/torchrec/site.
#   install.sh stage PART [--first]   copy .device-torchrec/PART to /tmp/torchrec/parts (--first: also
#                                     the small wheels and this script, env.sh, sha256 to /tmp/torchrec)
#   install.sh finish                 join the parts, check the sha256, pip install every wheel --no-deps
set -euo pipefail
SRC=.device-torchrec
DIR=/tmp/torchrec
PYTHON="${PYTHON:-python3}"
case "${1:-}" in
  stage)
    [ -n "${2:-}" ] || { echo "usage: install.sh stage PART [--first]" >&2; exit 2; }
    mkdir -p "$DIR/parts"
    if [ "${3:-}" = --first ]; then
      cp -r "$SRC/install.sh" "$SRC/env.sh" "$SRC/sha256" "$SRC/wheel-name" "$SRC/whl" "$SRC/extra" "$DIR/"
    fi
    [ -f "$SRC/$2" ] || { echo "install.sh: $SRC/$2 is not here: carry it in this call" >&2; exit 1; }
    cp "$SRC/$2" "$DIR/parts/"
    echo "staged: $(ls "$DIR/parts" | tr '\n' ' ')"
    ;;
  finish)
    [ -f "$DIR/sha256" ] || { echo "install.sh: $DIR/sha256 is missing: run 'install.sh stage PART --first' first" >&2; exit 1; }
    WHL="$DIR/$(cat "$DIR/wheel-name")"
    cat "$DIR"/parts/c[0-9][0-9] >"$WHL"
    if [ "$(sha256sum "$WHL" | cut -d' ' -f1)" != "$(cat "$DIR/sha256")" ]; then
      echo "install.sh: $WHL: sha256 mismatch; staged parts: $(ls "$DIR/parts" | tr '\n' ' ') (one missing?)" >&2
      exit 1
    fi
    wheels=("$WHL" "$DIR"/whl/*.whl)
    for w in "$DIR"/extra/*.whl; do
      module=$(basename "$w" | cut -d- -f1 | tr '[:upper:]' '[:lower:]')
      case "$module" in
        pyre_extensions | typing_inspect | mypy_extensions | cloudpickle | tqdm | portalocker) ;;
        *) continue ;;
      esac
      if "$PYTHON" -c "import $module" 2>/dev/null; then
        echo "install.sh: the host has $module; not installing $(basename "$w")"
      else
        wheels+=("$w")
      fi
    done
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$DIR/site" "${wheels[@]}"
    rm -f "$WHL"
    source "$DIR/env.sh"
    "$PYTHON" - <<'PY'
import fbgemm_gpu
import torch
import torchrec

print("torch", torch.__version__, "cuda", torch.version.cuda, "GPUs", torch.cuda.device_count(),
      "| fbgemm_gpu", fbgemm_gpu.__version__, "| torchrec", torchrec.__version__)
PY
    ;;
  *) echo "usage: install.sh stage PART [--first] | finish" >&2; exit 2 ;;
esac
EOF
cat >"$DEST/env.sh" <<'EOF'
# Source after install.sh finish: TorchRec and FBGEMM from /tmp/torchrec/site beside the host's torch.
export PYTHONPATH="/tmp/torchrec/site${PYTHONPATH:+:$PYTHONPATH}"
EOF

parts=("$DEST"/c[0-9][0-9])
small=$(du -cb "$DEST/whl" "$DEST/extra" "$DEST/install.sh" "$DEST/env.sh" "$DEST/sha256" "$DEST/wheel-name" | tail -n 1 | cut -f1)
echo "prepared ${#parts[@]} parts of $FBGEMM in $DEST (sha256 $(cat "$DEST/sha256")):"
for p in "${parts[@]}"; do echo "  ${p##*/} $(stat -c %s "$p") bytes"; done
echo "  small files (whl/, extra/, scripts): $small bytes"
echo "Device calls, one right after the other (the host is released when idle, and what was staged with it):"
echo "  carry [\"$DEST/${parts[0]##*/}\", \"$DEST/whl\", \"$DEST/extra\", \"$DEST/install.sh\", \"$DEST/env.sh\", \"$DEST/sha256\", \"$DEST/wheel-name\"]"
echo "     command: bash $DEST/install.sh stage ${parts[0]##*/} --first"
for p in "${parts[@]:1}"; do
  echo "  carry [\"$DEST/${p##*/}\"]   command: bash /tmp/torchrec/install.sh stage ${p##*/}"
done
echo "  in the call that stages the last part append: && bash /tmp/torchrec/install.sh finish"
