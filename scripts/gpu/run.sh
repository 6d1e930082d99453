#!/usr/bin/env bash
# On the GPU machine (the device tool runs it in a copy of this repository): unpacks the bundle made
# here by scripts/gpu/bundle.sh (carried as .deps/gpu), points the loader at it and at the machine's own
# CUDA libraries, says what the machine has, and runs the GPU tests, then any command given.
#
#   scripts/gpu/run.sh                      # probe + every GPU test binary in the bundle
#   scripts/gpu/run.sh -- CMD ARGS...       # probe + tests + CMD with the same environment
#   SKIP_TESTS=1 scripts/gpu/run.sh -- CMD  # probe + CMD
# Logs go to $OUT (the device tool brings them back) when it is set.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ARCHIVE=$ROOT/.deps/gpu/bundle.tar.xz
B=/tmp/shardtrain-gpu
LOGS=${OUT:-/tmp/shardtrain-gpu-logs}
mkdir -p "$LOGS"
[[ -f "$ARCHIVE" ]] || { echo "run.sh: $ARCHIVE missing: run scripts/gpu/bundle.sh here and carry .deps/gpu" >&2; exit 2; }
rm -rf "$B" && mkdir -p "$B"
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$ARCHIVE" "$B" || exit 2

# The machine's CUDA libraries: the toolkit's, then those of the Python wheels (PyTorch brings NCCL).
cuda_libs=()
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [[ -d $d ]] && cuda_libs+=("$d"); done
while IFS= read -r d; do cuda_libs+=("$d"); done < <(python3 - <<'PY' 2>/dev/null
import glob, os, site
for s in site.getsitepackages():
    for lib in sorted(glob.glob(os.path.join(s, "nvidia", "*", "lib"))):
        print(lib)
PY
)
cuda_path=$(IFS=:; echo "${cuda_libs[*]}")
export LD_LIBRARY_PATH="$B/lib:$cuda_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OPAL_PREFIX=$B/ompi/usr
export PMIX_MCA_mca_base_component_path=$B/ompi/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
export PATH="$B/ompi/usr/bin:$B/bin:$PATH"
# The settings every local mpirun needs (root, no CMA, several ranks per core), as for the tests here.
source "$ROOT/scripts/common.sh"
unset OMPI_MCA_mpi_yield_when_idle  # that machine has a core per rank: no yielding (timings are taken there)

{
  # shellcheck disable=SC1091
  echo "== bundle $(cat "$B/COMMIT" 2>/dev/null), machine: $(. /etc/os-release 2>/dev/null; echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1
  nvcc --version 2>/dev/null | tail -1
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" 2>&1
  echo "CUDA library folders: ${cuda_libs[*]}"
  missing=$(ldd "$B/bin/shardtrain" | grep 'not found')
  [[ -z "$missing" ]] && echo "shardtrain: every library found" || echo "shardtrain: MISSING $missing"
  shardtrain env 2>&1 | tail -n 12
  mpirun -np 2 shardtrain env --strategy FULL_SHARD 2>&1 | tail -n 3
} 2>&1 | tee "$LOGS/probe.txt"

status=0
if [[ -z "${SKIP_TESTS:-}" ]]; then
  : >"$LOGS/tests.txt"
  for t in "$B"/bin/*_test; do
    name=$(basename "$t")
    # GPU tests; the MPI ones (collectives with device staging) under mpirun with 2 ranks on the one GPU.
    case "$name" in
      gpu_* | *kernel_test | *gpu*) cmd=("$t") ;;
      collectives_test) cmd=(mpirun -np 2 "$t") ;;
      *) continue ;;
    esac
    start=$(date +%s%N)
    "${cmd[@]}" >"$LOGS/$name.log" 2>&1
    rc=$?
    printf '%-32s rc=%d %6d ms %s\n' "$name" "$rc" "$((($(date +%s%N) - start) / 1000000))" \
      "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$LOGS/$name.log" | tr '\n' ' ')" | tee -a "$LOGS/tests.txt"
    ((rc == 0)) || status=1
  done
fi
if [[ "${1:-}" == -- ]]; then
  shift
  "$@"
  status=$?
fi
exit $status
