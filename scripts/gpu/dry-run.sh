#!/usr/bin/env bash
# Rehearses a GPU session without a GPU: runs scripts/gpu/run.sh from the bundle inside a bare Debian 13
# chroot that holds nothing of ours but CUDA's runtime libraries (where the GPU machine's toolkit and
# PyTorch's wheels keep them), so a library the bundle lacks, a path into this machine, or a command the
# GPU machine's image may not have (ssh, for one) shows here and not in a call of the device tool.
# The device tests skip (no driver in the chroot), and the FSDP matrix with SHARDTRAIN_TEST_DEVICE=cuda
# fails by design ("no CUDA device is visible"); everything else must pass, and a short CPU training run
# on two ranks must save its checkpoint. Needs root and Debian's mirror (debootstrap, once: about 100 MB).
#
#   scripts/gpu/dry-run.sh [CHROOT_DIR]     (default /var/tmp/shardtrain-dry-run; run scripts/gpu/bundle.sh first)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
R=${1:-/var/tmp/shardtrain-dry-run}
[[ $EUID -eq 0 ]] || { echo "dry-run.sh: needs root (debootstrap, chroot, bind mounts)" >&2; exit 2; }
[[ -f "$ROOT/.deps/gpu/bundle.tar.xz" ]] || { echo "dry-run.sh: run scripts/gpu/bundle.sh first" >&2; exit 2; }
[[ -f "$ROOT/data/sotu-bpe4k.h5" ]] || { echo "dry-run.sh: data/sotu-bpe4k.h5 missing (./scripts/quickstart.sh makes it)" >&2; exit 2; }

if [[ ! -x "$R/usr/bin/python3" ]]; then
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap
  debootstrap --variant=minbase --include=python3,xz-utils trixie "$R" http://deb.debian.org/debian
fi
cleanup() { for m in dev/shm dev sys proc; do mountpoint -q "$R/$m" && umount "$R/$m"; done; }
trap cleanup EXIT
for m in proc sys dev dev/shm; do mountpoint -q "$R/$m" || mount --bind "/$m" "$R/$m"; done

# CUDA's libraries where the GPU machine has them: the toolkit's folder, NCCL in a wheel's.
cuda=$(dirname "$(readlink -f /usr/local/cuda/lib64/libcudart.so.13)")
site=$(chroot "$R" python3 -c 'import site; print(site.getsitepackages()[0])')
mkdir -p "$R/usr/local/cuda/lib64" "$R$site/nvidia/nccl/lib"
cp -L "$cuda"/libcudart.so.13 "$cuda"/libcublas.so.13 "$cuda"/libcublasLt.so.13 "$R/usr/local/cuda/lib64/"
cp -L "$cuda"/libnccl.so.2 "$R$site/nvidia/nccl/lib/"

# The working tree as the device tool sends it: tracked files plus the two carried paths.
rm -rf "$R/work/repo" "$R/out" && mkdir -p "$R/work/repo/.deps/gpu" "$R/work/repo/data" "$R/out"
git -C "$ROOT" ls-files -z | tar -C "$ROOT" --null -T - -cf - | tar -C "$R/work/repo" -xf -
cp "$ROOT/.deps/gpu/bundle.tar.xz" "$R/work/repo/.deps/gpu/"
cp "$ROOT/data/sotu-bpe4k.h5" "$R/work/repo/data/"

train='rm -rf /tmp/dry && mpirun -np 2 shardtrain train --config configs/tiny-cpu.toml --data.path data/sotu-bpe4k.h5
  --schedule.max_steps 4 --schedule.warmup_steps 1 --schedule.eval_batches 0 --checkpoint.every_n_steps 4
  --logging.progress lines --logging.run_dir /tmp/dry && test -f /tmp/dry/checkpoints/step_00000004/DONE'
rc=0
chroot "$R" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root OUT=/out \
  bash -c "cd /work/repo && scripts/gpu/run.sh tests -- bash -c '${train//$'\n'/ }'" >"$R/dry-run.log" 2>&1 || rc=$?
cat "$R/out/summary.txt"
# Expected: every line rc=0 but the FSDP matrix asked to run on a GPU that is not there.
bad=$(grep -E 'rc=[1-9]' "$R/out/summary.txt" | grep -v '^fsdp_equivalence_gpu' || true)
if [[ -n "$bad" ]] || ! grep -q 'train: done' "$R/dry-run.log" || ! grep -q 'every library found' "$R/dry-run.log"; then
  echo "dry-run: FAILED (log: $R/dry-run.log)"
  exit 1
fi
# Where nvidia-smi lists a GPU that the binaries cannot reach, the GPU tests must fail, not skip.
printf '#!/bin/sh\necho "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-dry-run)"\n' >"$R/usr/local/bin/nvidia-smi"
chmod +x "$R/usr/local/bin/nvidia-smi"
rm -rf "$R/out" && mkdir -p "$R/out"
chroot "$R" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root OUT=/out \
  bash -c "cd /work/repo && scripts/gpu/run.sh tests" >"$R/dry-run-require.log" 2>&1 || true
rm -f "$R/usr/local/bin/nvidia-smi"
if ! grep -qE '^gpu_ops_test +rc=1 ' "$R/out/summary.txt"; then
  echo "dry-run: FAILED: with a GPU listed but out of reach, gpu_ops_test did not fail (log: $R/dry-run-require.log)"
  exit 1
fi
echo "dry-run: the bundle runs on a bare Debian 13 (log: $R/dry-run.log; run.sh exit $rc: the GPU-only FSDP matrix)"
