#!/usr/bin/env bash
# The same short training run on the CPU backend and on the CUDA backend, compared step by step
# (compare-losses.py): fp32 and bf16 on one rank (NCCL), bf16 with CPU offload and activation checkpointing on
# one rank (gradients reduced in fp32 and in bf16, and with gradient accumulation) and on two ranks sharing the
# device (the MPI backend staging device buffers), bf16 on ranks with a GPU each over NCCL (TRACK_NCCL_RANKS),
# and a run resumed from its step-2 checkpoint on two ranks against the uninterrupted one-rank run (exact
# resume with resharding, on the GPU), a CPU-offload run resumed from its step-2 checkpoint on one rank,
# `shardtrain evaluate` of a checkpoint on the CPU, the GPU and two ranks sharing it (TRACK_EVAL_TOLERANCE), and
# a CPU-offload run that diverges and rolls back to its step-2 checkpoint mid-run (optim.on_divergence).
# Run by scripts/gpu/run.sh (phase track) on a GPU, and by the test suite against the CUDA emulator
# (tests/train/CMakeLists.txt, SHARDTRAIN_CUDA=EMULATED).
#
#   scripts/gpu/track.sh SHARDTRAIN_BIN DATASET OUT_DIR [STEPS] [SHARDTRAIN OPTIONS...]
#
# Each case is one line of OUT_DIR/summary.txt; the exit status is non-zero when any case fails.
# TRACK_BF16_TOLERANCE=FIRST,LATER tightens the bf16 comparisons (compare-losses.py --tolerance).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BIN=${1:?shardtrain binary}
DATA=${2:?dataset (.h5)}
OUT=${3:?output directory}
STEPS=${4:-6}
shift $(($# < 4 ? $# : 4))
[[ -f "$DATA" ]] || { echo "track.sh: $DATA missing (scripts/fetch-data.sh prepares it)" >&2; exit 2; }
rm -rf "$OUT" && mkdir -p "$OUT"
BIN_ID=$(sha256sum "$BIN" | cut -c1-64)
status=0

# train NAME NP DEVICE [OPTIONS...]: one run, its log and run directory under $OUT; CKPT=N checkpoints every N.
# TRACK_REUSE_CPU_RUNS=DIR (another track's OUT_DIR): a CPU run that finished there with the same binary, data,
# options, fault injection and steps is copied instead of run again (the test suite's second track, under another
# emulator schedule, which the CPU backend does not read).
train() {
  local name=$1 np=$2 dev=$3
  shift 3
  local key
  key="$BIN_ID $DATA $np $dev steps=$STEPS ckpt=${CKPT:-0} fault=${SHARDTRAIN_FAULT:-} $*"
  local reuse=${TRACK_REUSE_CPU_RUNS:-}
  if [[ $dev == cpu && -n $reuse && -f "$reuse/$name.key" && "$(cat "$reuse/$name.key")" == "$key" ]]; then
    cp -r "$reuse/$name" "$reuse/$name.log" "$OUT/" && printf '%s\n' "$key" >"$OUT/$name.key" &&
      echo "$name: the same CPU run as $reuse/$name, copied" && return 0
  fi
  mpirun -np "$np" "$BIN" --device "$dev" train --config "$HERE/../../configs/tiny-cpu.toml" --data.path "$DATA" \
    --schedule.max_steps "$STEPS" --schedule.warmup_steps 1 --schedule.eval_batches 0 --checkpoint.every_n_steps "${CKPT:-0}" \
    --logging.peak_flops 1e12 --logging.progress lines --logging.log_every 1 --logging.run_dir "$OUT/$name" "$@" \
    >"$OUT/$name.log" 2>&1 || { echo "FAIL: $name (exit $?): $OUT/$name.log" | tee -a "$OUT/summary.txt"; status=1; return 1; }
  printf '%s\n' "$key" >"$OUT/$name.key"
}

# resume_from NAME SOURCE_RUN RESUMED_RUN: copies SOURCE_RUN's step-2 checkpoint as RESUMED_RUN's only one. Fails
# (and says so) when it is missing: a resumed run that finds no checkpoint trains from step 0 and matches the
# uninterrupted run, a pass that tests nothing (the 2026-11-25 and -26 GPU runs: keep_last = 2 had removed it).
resume_from() {
  local name=$1 src=$OUT/$2/checkpoints/step_00000002 dst=$OUT/$3/checkpoints
  mkdir -p "$dst" && cp -r "$src" "$dst/" && return 0
  echo "FAIL: $name: no step-2 checkpoint in $OUT/$2/checkpoints" | tee -a "$OUT/summary.txt"
  status=1
  return 1
}

# resumed NAME RUN: RUN's log says it resumed from step 2.
resumed() {
  grep -q "checkpoint: resumed from .* at step 2 " "$OUT/$2.log" && return 0
  echo "FAIL: $1: $OUT/$2.log does not say it resumed from step 2" | tee -a "$OUT/summary.txt"
  status=1
  return 1
}

# compare NAME DTYPE A B [--common]
compare() {
  local name=$1 dtype=$2 a=$3 b=$4
  shift 4
  local tol=()
  [[ $dtype == bf16 && -n "${TRACK_BF16_TOLERANCE:-}" ]] && tol=(--tolerance "$TRACK_BF16_TOLERANCE")
  if python3 "$HERE/compare-losses.py" --dtype "$dtype" "${tol[@]}" "$@" "$OUT/$a" "$OUT/$b" >"$OUT/$name.compare" 2>&1; then
    echo "PASS: $name: $(tail -1 "$OUT/$name.compare")" | tee -a "$OUT/summary.txt"
  else
    echo "FAIL: $name: $(tail -1 "$OUT/$name.compare")" | tee -a "$OUT/summary.txt"
    status=1
  fi
}

train fp32_cpu 1 cpu "$@" && train fp32_cuda 1 cuda "$@" && compare fp32 fp32 fp32_cpu fp32_cuda
train bf16_cpu 1 cpu --fsdp.param_dtype bf16 "$@" && train bf16_cuda 1 cuda --fsdp.param_dtype bf16 "$@" &&
  compare bf16 bf16 bf16_cpu bf16_cuda
offload=(--fsdp.param_dtype bf16 --fsdp.offload_params true --fsdp.activation_checkpointing true)
# With offload on the GPU the host update runs beside the next forward; slowed down (SHARDTRAIN_FAULT,
# docs/training.md), any upload or read of a shard before its update is done shows in the losses.
export SHARDTRAIN_FAULT=slow_update:${TRACK_SLOW_UPDATE_MS:-20}
# One rank: NCCL (asynchronous) and the offload streams' events; two ranks: MPI staging (host-synchronous).
train offload_cpu 1 cpu "${offload[@]}" "$@" && train offload_cuda 1 cuda "${offload[@]}" "$@" &&
  compare offload bf16 offload_cpu offload_cuda
# Gradients reduced in bf16: each reaches the host shard from a scratch buffer on compute, not from the
# download stream, and the host waits for both before AdamW.
train offload_rbf16_cpu 1 cpu "${offload[@]}" --fsdp.reduce_dtype bf16 "$@" &&
  train offload_rbf16_cuda 1 cuda "${offload[@]}" --fsdp.reduce_dtype bf16 "$@" &&
  compare offload_reduce_bf16 bf16 offload_rbf16_cpu offload_rbf16_cuda
# Two micro-batches per step: the second reduction of each unit goes down into a pinned stage and a host
# function adds it into the host shard, on the download stream.
accum=(--data.micro_batch_size "${TRACK_MICRO_BATCH:-2}")
train offload_accum_cpu 1 cpu "${offload[@]}" --fsdp.reduce_dtype bf16 "${accum[@]}" "$@" &&
  train offload_accum_cuda 1 cuda "${offload[@]}" --fsdp.reduce_dtype bf16 "${accum[@]}" "$@" &&
  compare offload_accumulation bf16 offload_accum_cpu offload_accum_cuda
train offload_cpu_np2 2 cpu "${offload[@]}" "$@" && train offload_cuda_np2 2 cuda "${offload[@]}" "$@" &&
  compare offload_np2 bf16 offload_cpu_np2 offload_cuda_np2
# TRACK_NCCL_RANKS=N (a machine with N GPUs, or the CUDA emulator with as many): bf16 on N ranks with a GPU
# each over NCCL, the engine's overlapped schedule, against the CPU backend on N ranks.
if [[ -n "${TRACK_NCCL_RANKS:-}" ]]; then
  n=$TRACK_NCCL_RANKS
  train nccl_cpu_np$n "$n" cpu --fsdp.param_dtype bf16 "$@" &&
    SHARDTRAIN_CUDA_EMULATOR_DEVICES=$n train nccl_cuda_np$n "$n" cuda --fsdp.param_dtype bf16 --fsdp.comm_backend nccl "$@" &&
    compare nccl_np$n bf16 nccl_cpu_np$n nccl_cuda_np$n
fi
# Checkpoints every 2 steps, all kept; the copy holds only step 2's and resumes from it on two ranks.
if CKPT=2 train ckpt_cuda 1 cuda --checkpoint.keep_last 0 "$@" && resume_from resume ckpt_cuda resumed_cuda_np2; then
  CKPT=2 train resumed_cuda_np2 2 cuda --checkpoint.resume auto "$@" && resumed resume resumed_cuda_np2 &&
    compare resume fp32 ckpt_cuda resumed_cuda_np2 --common
fi
# shardtrain evaluate (the evaluation-only trainer) on the GPU: ckpt_cuda's last checkpoint scored on the
# CPU, on the GPU, and on two ranks sharing the GPU (MPI staging), the same held-out batches each time.
# evaluate NAME NP DEVICE: its JSON in $OUT/NAME.json.
evaluate() {
  local name=$1 np=$2 dev=$3
  mpirun -np "$np" "$BIN" --device "$dev" evaluate --weights "$OUT/ckpt_cuda/checkpoints" --batches 2 --json "$OUT/$name.json" \
    >"$OUT/$name.log" 2>&1 || { echo "FAIL: $name (exit $?): $OUT/$name.log" | tee -a "$OUT/summary.txt"; status=1; return 1; }
}
if [[ -d "$OUT/ckpt_cuda/checkpoints" ]] && evaluate eval_cpu 1 cpu && evaluate eval_cuda 1 cuda && evaluate eval_cuda_np2 2 cuda; then
  if line=$(python3 - "$OUT" "${TRACK_EVAL_TOLERANCE:-1e-5}" <<'PY'
import json, sys
out, tol = sys.argv[1], float(sys.argv[2])
r = {n: json.load(open(f"{out}/{n}.json")) for n in ("eval_cpu", "eval_cuda", "eval_cuda_np2")}
ref = r["eval_cpu"]
worst = max(abs(v["loss"] - ref["loss"]) / ref["loss"] for v in r.values())
same = all(v["tokens"] == ref["tokens"] for v in r.values())
print(f"loss cpu {ref['loss']:.7f}, cuda {r['eval_cuda']['loss']:.7f}, cuda x2 ranks {r['eval_cuda_np2']['loss']:.7f} over "
      f"{ref['tokens']} tokens: {worst:.1e} relative (tolerance {tol:g})")
sys.exit(0 if same and worst <= tol else 1)
PY
  ); then
    echo "PASS: evaluate: $line" | tee -a "$OUT/summary.txt"
  else
    echo "FAIL: evaluate: $line" | tee -a "$OUT/summary.txt"
    status=1
  fi
fi
# CPU offload: the host update of step 2 still runs when the step returns (it overlaps the next forward), so
# the checkpoint must wait for it. Resumed on the same one rank, the run repeats the uninterrupted one's
# losses (TRACK_RESUME_TOLERANCE: 0,0 on the emulator, which is deterministic).
if CKPT=2 train ckpt_offload_cuda 1 cuda "${offload[@]}" --checkpoint.keep_last 0 "$@" &&
  resume_from resume_offload ckpt_offload_cuda resumed_offload_cuda; then
  CKPT=2 train resumed_offload_cuda 1 cuda "${offload[@]}" --checkpoint.resume auto "$@" &&
    resumed resume_offload resumed_offload_cuda &&
    compare resume_offload fp32 ckpt_offload_cuda resumed_offload_cuda --common \
      --tolerance "${TRACK_RESUME_TOLERANCE:-1e-6,1e-5}"
fi
# A divergence and a rollback mid-run, with CPU offload (the host update of the step before may still be running
# when the checkpoint is loaded back): non-finite gradients at steps 2 and 3 make the run go back to step 2's
# checkpoint; step 3 is poisoned again, once, and the run goes on. The surviving steps on the GPU track the CPU's.
rollback=(--optim.on_divergence rollback --optim.max_consecutive_nonfinite 2)
SHARDTRAIN_FAULT="$SHARDTRAIN_FAULT;nan_grad:2-3" CKPT=2 train rollback_cpu 1 cpu "${offload[@]}" "${rollback[@]}" "$@" &&
  SHARDTRAIN_FAULT="$SHARDTRAIN_FAULT;nan_grad:2-3" CKPT=2 train rollback_cuda 1 cuda "${offload[@]}" "${rollback[@]}" "$@" &&
  compare rollback bf16 rollback_cpu rollback_cuda --rollback
exit $status
