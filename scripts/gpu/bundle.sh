#!/usr/bin/env bash
# Packs what the GPU machine needs to run binaries built here: the chosen executables, every shared
# library they load that is neither glibc nor CUDA (the GPU machine has its own CUDA 13, cuBLAS and
# NCCL), and a relocatable Open MPI (mpirun, its plugins and help files, PMIx) for runs with several
# ranks. The GPU machine has no network and none of our Debian packages, so this folder travels with
# the working tree (the device tool's `carry`, at most 64 MiB: hence one xz archive, about 30 MB), and
# scripts/gpu/run.sh unpacks it there and sets the paths.
#
#   scripts/gpu/bundle.sh [BUILD_DIR]     (default: build) -> .deps/gpu/bundle.tar.xz
#
# Executables: bin/shardtrain and the test binaries scripts/gpu/run.sh runs there (the GPU tests, the
# collectives, the FSDP equivalence matrix). Every binary carries the kernels for sm_80 and sm_90, so the
# CPU-only tests stay here: the carried working tree may not pass 64 MiB, the dataset included.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD=${1:-$ROOT/build}
ARCHIVE=$ROOT/.deps/gpu/bundle.tar.xz
OUT=$(mktemp -d /tmp/shardtrain-gpu-bundle.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/ompi"

# Libraries the GPU machine must provide itself: glibc (its own is newer) and CUDA's (the driver's
# libcuda, and the toolkit's cudart, cublas, cublasLt and NCCL, which must match its driver).
skip_lib() {
  case "$(basename "$1")" in
    libc.so.* | libm.so.* | libdl.so.* | librt.so.* | libpthread.so.* | ld-linux*.so.* | libresolv.so.*) return 0 ;;
    libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libnccl.so.* | libnvidia-*) return 0 ;;
  esac
  return 1
}

copy_deps() {  # every resolved library of the given ELF files, once
  local f lib
  for f in "$@"; do
    while read -r lib; do
      [[ -n "$lib" && -f "$lib" ]] || continue
      skip_lib "$lib" && continue
      [[ -e "$OUT/lib/$(basename "$lib")" ]] || cp -L "$lib" "$OUT/lib/"
    done < <(ldd "$f" 2>/dev/null | awk '/=> \//{print $3}')
  done
}

# 1. Executables.
bins=("$BUILD/bin/shardtrain")
while IFS= read -r t; do bins+=("$t"); done < <(find "$BUILD/tests" -maxdepth 1 -type f -perm -u+x \
  \( -name '*gpu*_test' -o -name '*kernel_test' -o -name collectives_test -o -name fsdp_equivalence_test \) | sort)
for b in "${bins[@]}"; do [[ -x "$b" ]] && cp "$b" "$OUT/bin/"; done
copy_deps "$OUT"/bin/*

# 2. Open MPI, relocated: the Debian tree under ompi/ with the same relative paths, so that
# OPAL_PREFIX=$OUT/ompi/usr finds plugins (lib/x86_64-linux-gnu/openmpi/lib/openmpi3), help files
# (share/openmpi) and the launchers (bin).
multiarch=lib/x86_64-linux-gnu
mkdir -p "$OUT/ompi/usr/bin" "$OUT/ompi/usr/$multiarch" "$OUT/ompi/usr/share" "$OUT/ompi/etc"
cp -L /usr/bin/orterun /usr/bin/orted "$OUT/ompi/usr/bin/"
ln -sf orterun "$OUT/ompi/usr/bin/mpirun"
cp -a /usr/$multiarch/openmpi "$OUT/ompi/usr/$multiarch/"
cp -a /usr/share/openmpi "$OUT/ompi/usr/share/"
[[ -d /usr/$multiarch/pmix2 ]] && cp -a /usr/$multiarch/pmix2 "$OUT/ompi/usr/$multiarch/"
[[ -d /usr/share/pmix ]] && cp -a /usr/share/pmix "$OUT/ompi/usr/share/"
cp -a /etc/openmpi "$OUT/ompi/etc/"
rm -rf "$OUT/ompi/usr/$multiarch/openmpi/include" "$OUT/ompi/usr/$multiarch/openmpi/lib/"*.a
mapfile -t plugins < <(find "$OUT/ompi/usr/$multiarch" -name '*.so*' -type f)
copy_deps "$OUT/ompi/usr/bin/orterun" "$OUT/ompi/usr/bin/orted" "${plugins[@]}"

git -C "$ROOT" rev-parse --short HEAD >"$OUT/COMMIT" 2>/dev/null || true
mkdir -p "$(dirname "$ARCHIVE")"
tar -C "$OUT" -cf - . | xz -T0 -6 >"$ARCHIVE.tmp"
mv "$ARCHIVE.tmp" "$ARCHIVE"
echo "bundle: $(find "$OUT/bin" -type f | wc -l) executables, $(find "$OUT/lib" -type f | wc -l) libraries, $(du -sh "$OUT" | cut -f1) unpacked," \
  "$(du -h "$ARCHIVE" | cut -f1) in $ARCHIVE"
