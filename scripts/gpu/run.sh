#!/usr/bin/env bash
# On the GPU machine (the device tool runs it in a copy of this repository): unpacks the bundle made
# here by scripts/gpu/bundle.sh (carried as .deps/gpu), points the loader at it and at the machine's own
# CUDA libraries, says what the machine has, then runs the phases asked for. Each phase fits well inside
# one 10-minute device call; run them in one call or several.
#
#   scripts/gpu/run.sh [PHASE ...] [-- CMD ARGS...]
#     tests     every GPU test binary; the collectives with 2 ranks on the one GPU (MPI staging device memory)
#     matrix    the FSDP equivalence matrix with 4 ranks (2 "nodes" of 2) on the one GPU
#     sanitize  compute-sanitizer (memcheck, racecheck) over the op, kernel and optimizer tests
#     track     scripts/gpu/track.sh: the same tiny runs on the CPU and on the GPU (fp32, bf16, offload on two
#               ranks, resume onto two ranks), losses compared step by step
#     parity    loss and gradients of shardtrain (CPU and GPU backends) against transformers' Llama
#     attention shardtrain bench attention: every attention kernel (cuDNN's fused flash attention, deterministic
#               or not; our tensor-core and FMA kernels) at the seed's, the 1B's and the 8B's shapes
#     ops       shardtrain bench ops at the three shapes' micro-batches (seed, 1B, 8B layers): ops-<shape>.json
#     bench     scripts/bench-vs-pytorch.py at three shapes (configs/llama-seed.toml, llama-1b.toml,
#               llama-8b-layers.toml): shardtrain, PyTorch FSDP2 eager and compiled, a table each; then the
#               8B shape's largest layer counts on 80 GB (shardtrain alone, with and without checkpointing)
#     seedoffload  the seed's table with its CPU-offload row (issue 8's comparison, as before)
#     offload   shardtrain bench step on the seed model with CPU offload: as configured, and with the embedding
#               as a unit of its own (the root's update then no longer delays the first forward)
#     profile   one step of the seed model (SHARDTRAIN_GPU_PROFILE_CONFIG: another config) kernel by kernel (Nsight Compute, two runs: 1 and 2 steps, their
#               difference is one steady-state step): scripts/gpu/profile-summary.py -> profile.md
#   (no phase: probe only). `-- CMD` runs CMD afterwards with the same environment.
#   SHARDTRAIN_GPU_BUDGET_S=N bounds the whole script to N seconds (steps that no longer fit are skipped).
#
# The device tool carries: .deps/gpu (the bundle) and data/sotu-bpe4k.h5 (the tiny and bench dataset).
# Everything is logged under $LOGS; at the end the logs are packed into $OUT/logs.tar.gz and a summary
# goes to $OUT/summary.txt (the device tool returns at most 8 files).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ARCHIVE=$ROOT/.deps/gpu/bundle.tar.xz
B=/tmp/shardtrain-gpu
LOGS=/tmp/shardtrain-gpu-logs
DATA=$ROOT/data/sotu-bpe4k.h5
rm -rf "$LOGS" && mkdir -p "$LOGS"
[[ -f "$ARCHIVE" ]] || { echo "run.sh: $ARCHIVE missing: run scripts/gpu/bundle.sh here and carry .deps/gpu" >&2; exit 2; }
rm -rf "$B" && mkdir -p "$B"
python3 - "$ARCHIVE" "$B" <<'PY' || exit 2
import sys, tarfile
# Our own archive, links and modes included (Python >= 3.12 warns without a filter; older has none).
kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **kw)
PY

phases=()
while (($#)) && [[ "$1" != -- ]]; do phases+=("$1"); shift; done
for p in "${phases[@]}"; do
  case "$p" in tests | matrix | sanitize | track | parity | attention | ops | bench | seedoffload | offload | profile) ;;
    *) echo "run.sh: unknown phase '$p'" >&2; exit 2 ;; esac
done

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
export PYTHONUNBUFFERED=1
# Where nvidia-smi lists a GPU, a GPU test that cannot reach it fails instead of skipping
# (tests/common/gpu_required.hpp): a session must not come back green having run nothing on the device.
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then export SHARDTRAIN_REQUIRE_GPU=1; fi
# The settings every local mpirun needs (root, no CMA, several ranks per core), as for the tests here.
source "$ROOT/scripts/common.sh"
unset OMPI_MCA_mpi_yield_when_idle  # that machine has a core per rank: no yielding (timings are taken there)

status=0
summary() { echo "$*" | tee -a "$LOGS/summary.txt"; }
finish() {
  if [[ -n "${OUT:-}" ]]; then
    cp "$LOGS/summary.txt" "$OUT/summary.txt" 2>/dev/null
    # Logs, metrics and JSON; not the parity dumps' weights and gradients (tens of MB; the tool returns
    # files of up to 16 MB, 8 of them).
    # Nor the training runs' checkpoints (track.sh's came to over 16 MB on 2026-11-25, and nothing came back).
    tar -czf "$OUT/logs.tar.gz" --exclude='*.safetensors' --exclude='*.h5' --exclude='checkpoints' -C "$LOGS" . 2>/dev/null
    # At most 8 files come back: the tables in one markdown file, the attention table, the profile; the rest
    # (every part's log and JSON) is in logs.tar.gz.
    cat "$LOGS"/bench/*/bench-vs-pytorch.md >"$OUT/bench-tables.md" 2>/dev/null || rm -f "$OUT/bench-tables.md"
    for f in "$LOGS"/bench/attention.md "$LOGS"/profile/profile.md; do
      [[ -f "$f" ]] && cp "$f" "$OUT/"
    done 2>/dev/null
  fi
}
trap finish EXIT

# SHARDTRAIN_GPU_BUDGET_S: seconds this whole script may take (the device call's timeout_s less a margin). Each
# step's limit is cut to what is left, and a step that would get under 20 s is skipped, so the phases named
# first always run and the call still returns its files. Unset: every step gets its own limit.
BUDGET_END=$((SECONDS + ${SHARDTRAIN_GPU_BUDGET_S:-100000}))
time_left() { echo $((BUDGET_END - SECONDS)); }

# run NAME TIMEOUT CMD...: one step, its log in $LOGS/NAME.log, one summary line.
run() {
  local name=$1 limit=$2
  shift 2
  local start rc left
  left=$(time_left)
  if ((left < 20)); then
    summary "$(printf '%-36s skipped: %d s of the budget left' "$name" "$left")"
    status=1
    return 3
  fi
  ((limit > left - 5)) && limit=$((left - 5))
  start=$(date +%s%N)
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  summary "$(printf '%-36s rc=%-3d %7d ms %s' "$name" "$rc" "$((($(date +%s%N) - start) / 1000000))" \
    "$(grep -hE '^\[  (PASSED|FAILED|SKIPPED) |^(PASS|FAIL)' "$LOGS/$name.log" | head -4 | tr '\n' ' ')")"
  ((rc == 0)) || status=1
  finish  # after every step: a call cut off at its limit still brings back what ran
  return $rc
}

{
  # shellcheck disable=SC1091
  echo "== bundle $(cat "$B/COMMIT" 2>/dev/null), machine: $(. /etc/os-release 2>/dev/null; echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1
  nvcc --version 2>/dev/null | tail -1
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'transformers', transformers.__version__)" 2>&1
  ls "${cuda_libs[@]}" 2>/dev/null | grep -E '^libcudnn(_graph)?\.so' | sort -u | tr '\n' ' '; echo
  echo "CUDA library folders: ${cuda_libs[*]}"
  missing=$(ldd "$B/bin/shardtrain" | grep 'not found')
  [[ -z "$missing" ]] && echo "shardtrain: every library found" || echo "shardtrain: MISSING $missing"
  shardtrain env 2>&1 | tail -n 12
  mpirun -np 2 shardtrain env --strategy FULL_SHARD 2>&1 | tail -n 3
} 2>&1 | tee "$LOGS/probe.txt"

gpu_tests() { find "$B/bin" -maxdepth 1 -name '*_test' \( -name 'gpu_*' -o -name '*kernel_test' -o -name '*gpu*' \) | sort; }

# Bounded so that `tests sanitize` fits one 10-minute call (memcheck slows kernels 10-100x).
phase_sanitize() {
  local t
  for t in "$B/bin/gpu_ops_test" "$B/bin/attention_kernel_test" "$B/bin/gpu_optim_test"; do
    [[ -x "$t" ]] || continue
    run "memcheck_$(basename "$t")" 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$t" --gtest_brief=1
  done
  # Races inside the block reductions and the scans: a few representative tests, racecheck is slow.
  run racecheck_gpu_ops 90 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/bin/gpu_ops_test" \
    --gtest_filter='*Rmsnorm*:*SumSquares*:*Segments*:*CrossEntropy*' --gtest_brief=1
  # Shared-memory hazards of the tensor-core attention kernels (bf16 runs them).
  run racecheck_attention_mma 90 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$B/bin/attention_kernel_test" --gtest_filter='*MmaFragmentLayout*:*BF16Padding*' --gtest_brief=1
}

phase_tests() {
  local t
  while IFS= read -r t; do run "$(basename "$t")" 150 "$t"; done < <(gpu_tests)
  [[ -x "$B/bin/collectives_test" ]] && run collectives_np2 120 mpirun -np 2 "$B/bin/collectives_test"
}

# The FSDP equivalence matrix on the GPU: every rank on device 0, MPI staging device buffers, two "nodes" of two
# ranks for the hybrid strategies (the same command line as the CPU test).
phase_matrix() {
  [[ -x "$B/bin/fsdp_equivalence_test" ]] || return 0
  run fsdp_equivalence_gpu_np4 180 env SHARDTRAIN_TEST_DEVICE=cuda \
    mpirun -np 4 -x SHARDTRAIN_TEST_DEVICE -x SHARDTRAIN_RANKS_PER_NODE=2 "$B/bin/fsdp_equivalence_test"
}

# Losses of the same runs on the CPU backend and on the GPU, step by step (fp32, bf16, offload on two ranks,
# resume onto two ranks): scripts/gpu/track.sh, which the test suite also runs against the CUDA emulator.
# 16 steps: with 30 the phase took 408 s on 2026-11-25 (its CPU runs then had one core: the binding since released).
phase_track() {
  run track 420 "$ROOT/scripts/gpu/track.sh" "$B/bin/shardtrain" "$DATA" "$LOGS/track" 16
}

# The three shapes of issue 35, each with the micro-batch one GPU takes per step (the seed's whole global batch;
# the 1B's micro-batch of 8 x 2048; the 8B's 1 x 8192), all on the carried corpus (packed rows as one causal
# sequence for the 1B and 8B, as the PyTorch side reads them).
# SHARDTRAIN_GPU_SHAPES="1b 8b" runs a subset (a second call with another setting, say).
read -r -a SHAPES <<<"${SHARDTRAIN_GPU_SHAPES:-seed 1b 8b}"
declare -A SHAPE_CONFIG=([seed]=llama-seed [1b]=llama-1b [8b]=llama-8b-layers)
declare -A SHAPE_OVERRIDES=([seed]="" [1b]="data.global_batch_size=8" [8b]="")
declare -A SHAPE_MFU_TARGET=([seed]=0.5 [1b]=0.5 [8b]=0.55)
declare -A SHAPE_TITLE=([seed]="the seed (124M, seq 512)" [1b]="Llama 3.2 1B's shape, seq 2048" [8b]="Llama 3 8B's layers (8 of 32), seq 8192")

phase_attention() {
  mkdir -p "$LOGS/bench"
  run bench_attention 150 shardtrain bench attention --json "$LOGS/bench/attention.json" --markdown "$LOGS/bench/attention.md"
}

phase_ops() {
  mkdir -p "$LOGS/bench"
  local shape
  for shape in "${SHAPES[@]}"; do  # the micro-batch is the config's (data.micro_batch_size, else the global batch)
    run "bench_ops_$shape" 120 shardtrain bench ops --config "$ROOT/configs/${SHAPE_CONFIG[$shape]}.toml" \
      --json "$LOGS/bench/ops-$shape.json"
  done
}

# Per shape, shardtrain and both PyTorch parts in one table (each part in its own process, bounded by what is
# left of the budget). A call cut short still brings back the tables that ran.
phase_bench() {
  local shape o overrides part_limit
  for shape in "${SHAPES[@]}"; do
    mkdir -p "$LOGS/bench/$shape"
    overrides=(--override "data.path=$DATA")
    for o in ${SHAPE_OVERRIDES[$shape]}; do overrides+=(--override "$o"); done
    part_limit=$(($(time_left) / 3))
    ((part_limit > 200)) && part_limit=200
    run "bench_vs_pytorch_$shape" 560 python3 "$ROOT/scripts/bench-vs-pytorch.py" \
      --config "$ROOT/configs/${SHAPE_CONFIG[$shape]}.toml" "${overrides[@]}" --shardtrain "$B/bin/shardtrain" \
      --launcher "mpirun -np 1" --out "$LOGS/bench/$shape" --timeout "$part_limit" --title "${SHAPE_TITLE[$shape]}" \
      --mfu-target "${SHAPE_MFU_TARGET[$shape]}" --parts "shardtrain,PyTorch eager,PyTorch compile"
  done
  # How many of the 8B's layers shardtrain trains on one 80 GB GPU: `shardtrain plan` says 13 without activation
  # checkpointing and 17 with it (docs/performance.md); measured here (the peak device memory is the figure).
  # SHARDTRAIN_GPU_LAYER_FIT=0 skips them.
  [[ "${SHARDTRAIN_GPU_LAYER_FIT:-1}" == 0 ]] && return 0
  local args=(bench step --config "$ROOT/configs/llama-8b-layers.toml" --data.path "$DATA" --warmup 1 --steps 3)
  run bench_8b_13_layers 120 mpirun -np 1 shardtrain "${args[@]}" --model.num_hidden_layers 13 \
    --json "$LOGS/bench/8b-13-layers.json"
  run bench_8b_17_layers_ckpt 150 mpirun -np 1 shardtrain "${args[@]}" --model.num_hidden_layers 17 \
    --fsdp.activation_checkpointing true --json "$LOGS/bench/8b-17-layers-ckpt.json"
}

# The seed's table with shardtrain's CPU-offload row beside the others (issue 8's comparison).
phase_seedoffload() {
  mkdir -p "$LOGS/bench/seed-offload"
  run bench_vs_pytorch_seed_offload 560 python3 "$ROOT/scripts/bench-vs-pytorch.py" --config "$ROOT/configs/llama-seed.toml" \
    --override "data.path=$DATA" --shardtrain "$B/bin/shardtrain" --launcher "mpirun -np 1" --out "$LOGS/bench/seed-offload" \
    --timeout 200 --title "the seed, with CPU offload"
}

# CPU offload, two unit layouts. The root unit (embedding, final norm, lm_head: 43 % of the seed's parameters)
# is the first unit the next forward needs, so its host update and its upload are not hidden (docs/performance.md,
# the budget). With the embedding as a unit of its own the root (norm and lm_head) is needed last, and its
# update runs beside the decoder layers' forward. Same model, batch and math; the step times say which is faster.
phase_offload() {
  mkdir -p "$LOGS/bench"
  local args=(bench step --config "$ROOT/configs/llama-seed.toml" --data.path "$DATA" --fsdp.offload_params true
    --warmup 2 --steps 6)
  run offload_root_embedding 180 mpirun -np 1 shardtrain "${args[@]}" --json "$LOGS/bench/offload-root.json"
  run offload_embedding_unit 180 mpirun -np 1 shardtrain "${args[@]}" \
    --fsdp.transformer_layer_cls_to_wrap LlamaDecoderLayer,Embedding --json "$LOGS/bench/offload-embedding-unit.json"
  run no_offload 150 mpirun -np 1 shardtrain bench step --config "$ROOT/configs/llama-seed.toml" --data.path "$DATA" \
    --warmup 2 --steps 6 --json "$LOGS/bench/no-offload.json"
  # The first GPU run's condition, for a before/after on the same machine: mpirun's one-core binding kept.
  run offload_binding_kept 180 mpirun -np 1 -x SHARDTRAIN_CPU_BINDING=keep shardtrain "${args[@]}" \
    --json "$LOGS/bench/offload-binding-kept.json"
  summary "$(python3 - "$LOGS/bench" <<'PY'
import json, os, sys
d = sys.argv[1]
def med(name):
    try:
        return 1000 * json.load(open(os.path.join(d, name)))["step_time_median_s"]
    except Exception:
        return float("nan")
base = med("no-offload.json")
def update(name):
    try:
        j = json.load(open(os.path.join(d, name)))
        return f"; host update {1000 * j['host_update_median_s']:.1f} ms, waited {1000 * j['update_wait_median_s']:.1f} ms"
    except Exception:
        return ""
for label, f in (("offload, root with the embedding", "offload-root.json"), ("offload, embedding unit", "offload-embedding-unit.json"),
                 ("offload, one core (binding kept)", "offload-binding-kept.json")):
    print(f"{label}: step {med(f):.1f} ms, {base / med(f):.2f}x of no offload ({base:.1f} ms){update(f)}")
PY
)"
}

# Kernel times of one training step of the seed model (batch 64, seq 512, bf16) under Nsight Compute: one metric
# (gpu__time_duration), real clocks, no replay. The runs with 1 and 2 steps (no warm-up) differ by exactly one
# steady-state step; the step's wall time comes from a run without the profiler.
phase_profile() {
  local dir=$LOGS/profile steps ncu_bin
  mkdir -p "$dir"
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [[ -n "$ncu_bin" ]] || { summary "profile: no ncu on this machine"; status=1; return; }
  # SHARDTRAIN_GPU_PROFILE_CONFIG=llama-1b (a configs/ name) profiles another shape's step.
  local args=(bench step --config "$ROOT/configs/${SHARDTRAIN_GPU_PROFILE_CONFIG:-llama-seed}.toml" --data.path "$DATA")
  run profile_step_time 120 mpirun -np 1 shardtrain "${args[@]}" --warmup 2 --steps 5 --json "$dir/step.json"
  for steps in 1 2; do
    run "profile_ncu_${steps}_steps" 210 mpirun -np 1 "$ncu_bin" --csv --page raw --print-units base --clock-control none \
      --metrics gpu__time_duration.sum --log-file "$dir/ncu-$steps.csv" shardtrain "${args[@]}" --warmup 0 --steps "$steps"
  done
  # What the kernel list leaves out (about 6 % of the step on 2026-11-26): copies, memsets and the host's calls,
  # from an Nsight Systems trace of three steps after two warm-ups, where the machine has nsys (not required).
  local nsys_bin
  nsys_bin=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  if [[ -n "$nsys_bin" ]]; then
    run profile_nsys_trace 120 mpirun -np 1 "$nsys_bin" profile --trace cuda --sample none --cpuctxsw none \
      --force-overwrite true -o "$dir/trace" shardtrain "${args[@]}" --warmup 2 --steps 3 &&
      run profile_nsys_stats 90 "$nsys_bin" stats --force-export true \
        --report cuda_gpu_mem_time_sum --report cuda_gpu_mem_size_sum --report cuda_api_sum "$dir/trace.nsys-rep"
    rm -f "$dir"/trace.nsys-rep "$dir"/trace.sqlite
  else
    summary "profile: no nsys on this machine (copies and host calls not traced)"
  fi
  local step_ms
  step_ms=$(python3 -c "import json, sys; print(1000 * json.load(open(sys.argv[1]))['step_time_median_s'])" "$dir/step.json" 2>/dev/null)
  run profile_summary 30 bash -c "python3 '$ROOT/scripts/gpu/profile-summary.py' '$dir/ncu-1.csv' '$dir/ncu-2.csv' \
    ${step_ms:+--step-ms $step_ms} > '$dir/profile.md' && cat '$dir/profile.md'"
}

phase_parity() {
  local dev dt
  for dev in cpu cuda; do
    for dt in f32 bf16; do
      [[ $dev == cpu && $dt == bf16 ]] && continue
      run "parity_dump_${dev}_${dt}" 120 shardtrain --device "$dev" parity dump --config "$ROOT/configs/tiny-cpu.toml" \
        --dtype "$dt" --batch 4 --seq 64 --out "$LOGS/parity_${dev}_${dt}"
      run "parity_check_${dev}_${dt}" 180 python3 "$ROOT/scripts/parity-transformers.py" "$LOGS/parity_${dev}_${dt}" \
        --device "$dev" --dtype "$dt"
    done
  done
  # Our two backends against each other on the same weights and batch (numpy only).
  run parity_cuda_vs_cpu_f32 60 python3 "$ROOT/scripts/parity-transformers.py" "$LOGS/parity_cuda_f32" \
    --against "$LOGS/parity_cpu_f32" --dtype f32
}

for p in "${phases[@]}"; do
  summary "== phase $p"
  "phase_$p"
done
if [[ "${1:-}" == -- ]]; then
  shift
  "$@" 2>&1 | tee "$LOGS/command.log"
  rc=${PIPESTATUS[0]}
  ((rc == 0)) || status=$rc
fi
exit $status
