#!/usr/bin/env bash
# Builds benchmarks/hkv_driver.cu against a HierarchicalKV source: HKV's own benchmark, one
# configuration per process, which benchmarks/storage_gpu.py --hkv runs beside our tables.
#
#   bash benchmarks/build_hkv.sh SOURCE [--commit REV] [--arch SM] [--out DIR]
#
# SOURCE   an HKV source tree (include/, benchmark/), or a git repository of HKV (a bare mirror
#          too), from which REV is exported first (default: ae24eec, the commit the project's
#          reference figures were measured at)
# --arch   the GPU's compute capability without the dot (default 90: H100, H200)
# --out    where binaries go (default: .device-hkv/ in the repository root, which git ignores)
#
# The binary is named by a hash of everything that goes into it (HKV's headers and benchmark
# sources, the driver, nvcc's version, the flags, the source's label), so a second build of the
# same inputs reuses it. The last line on stdout is the binary's path. Needs nvcc on PATH; no GPU.
# Example, from the mirror:
#   bash benchmarks/build_hkv.sh /work/.mirror/NVIDIA-Merlin+HierarchicalKV/repo
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
driver="$root/benchmarks/hkv_driver.cu"
commit="ae24eec"
arch="90"
out="$root/.device-hkv"

die() {
  echo "build_hkv: $*" >&2
  exit 2
}

[ $# -ge 1 ] || die "usage: bash benchmarks/build_hkv.sh SOURCE [--commit REV] [--arch SM] [--out DIR]"
source_path="$1"
shift
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || die "$1 needs a value"
  case "$1" in
    --commit) commit="$2" ;;
    --arch) arch="$2" ;;
    --out) out="$2" ;;
    *) die "unknown option $1 (valid: --commit REV, --arch SM, --out DIR)" ;;
  esac
  shift 2
done
[[ "$arch" =~ ^[0-9]+[a-z]?$ ]] || die "--arch $arch: give the compute capability without the dot, e.g. 90"
command -v nvcc >/dev/null 2>&1 || die "nvcc is not on PATH; install the CUDA toolkit or add its bin/ to PATH"

if [ -f "$source_path/include/merlin_hashtable.cuh" ]; then
  tree="$(cd "$source_path" && pwd)"
  label="tree $tree"
  if head="$(git -C "$tree" rev-parse --short=12 HEAD 2>/dev/null)"; then
    dirty="$(git -C "$tree" status --porcelain --untracked-files=no -- include benchmark 2>/dev/null)"
    label="$label at $head${dirty:+ with local changes}"
  fi
elif git -C "$source_path" rev-parse --git-dir >/dev/null 2>&1; then
  rev="$(git -C "$source_path" rev-parse --verify --quiet "$commit^{commit}")" ||
    die "$source_path has no commit $commit; give one it has with --commit"
  tree="$(mktemp -d)"
  trap 'rm -rf "$tree"' EXIT
  git -C "$source_path" archive "$rev" include benchmark | tar -x -C "$tree"
  label="HierarchicalKV $rev"
else
  die "$source_path is neither an HKV source tree (no include/merlin_hashtable.cuh) nor a git repository"
fi
for needed in benchmark/merlin_hashtable_benchmark.cc.cu benchmark/benchmark_util.cuh; do
  [ -f "$tree/$needed" ] || die "$label has no $needed: not a HierarchicalKV source this driver knows"
done
label="${label//[^A-Za-z0-9 ._\/:+-]/_}"  # it goes into a C string literal

flags=(-O3 -DNDEBUG -std=c++17 -gencode "arch=compute_$arch,code=sm_$arch")
key="$(
  {
    (cd "$tree" && find include benchmark/merlin_hashtable_benchmark.cc.cu benchmark/benchmark_util.cuh \
      -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
    sha256sum <"$driver"
    nvcc --version
    echo "${flags[*]}" "$label"
  } | sha256sum | cut -c1-16
)"
binary="$out/hkv_driver-sm$arch-$key"
if [ -x "$binary" ]; then
  echo "build_hkv: reusing $binary ($label)" >&2
else
  mkdir -p "$out"
  echo "build_hkv: compiling $label for sm_$arch (a few minutes)" >&2
  if ! nvcc "${flags[@]}" "-DSOK_HKV_SOURCE=\"$label\"" -I "$tree/include" -I "$tree/benchmark" \
    -o "$binary.partial.$$" "$driver"; then
    rm -f "$binary.partial.$$"
    die "nvcc failed on $driver against $label (its messages above)"
  fi
  mv "$binary.partial.$$" "$binary"
fi
echo "$binary"
