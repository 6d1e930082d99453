#!/usr/bin/env bash
# The predictions docs/performance.md publishes ("Predicted: many GPUs") and the one-GPU calibration beside them,
# made again from this tree: `shardtrain predict` on each config, its report and JSON kept in the output folder.
#   scripts/predictions.sh [OUT]       (default docs/predict-runs/<date>-gpu)
# Each config is priced by scripts/gpu/calibrate.py's rule: its shape's own profile from the predicted GPU
# (profiles/<gpu>/ops-seed.json, ops-1b.json, ops-8b.json: `scripts/gpu/run.sh ops` writes them under those names;
# the 8B layers' serves Llama 3 8B and 70B), else from the other GPU, else the H200 seed profile of 2026-11-26,
# measured with our own attention kernels: cuDNN's is the default since, so its attention rows are left out and the
# measured cuDNN rates (ops::device_rates) price attention.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$ROOT"
OUT="${1:-docs/predict-runs/$(date +%F)-gpu}"
BIN="$BUILD_DIR/bin/shardtrain"
mkdir -p "$OUT"
run() {  # name, the shape whose profile prices it (seed, 1b, 8b), then predict's arguments (--gpu among them)
  local name=$1 shape=$2 gpu=h100 arg prev=
  shift 2
  for arg in "$@"; do [[ $prev == --gpu ]] && gpu=$arg; prev=$arg; done
  local profile
  mapfile -t profile < <(python3 scripts/gpu/calibrate.py --profile-args "$gpu" "$shape")
  say "$name (${profile[1]})"
  "$BIN" predict "$@" "${profile[@]}" --json "$OUT/$name.json" | tee "$OUT/$name.txt"
}
# Calibration: the one-GPU steps docs/performance.md measured (H200, 2026-11-27: the seed from the first call, the 1B
# and 8B shapes from the second, with cuDNN's faster backward), each predicted again (calib-<shape>-h200.*,
# calibration.md). After a GPU session, name its run folders here (docs/gpu.md, "After the call").
say "calibration"
python3 scripts/gpu/calibrate.py --bin "$BIN" --out "$OUT" \
  docs/gpu-runs/2026-11-27-h200/1aeba62 docs/gpu-runs/2026-11-27-h200/1aeba62-fast
# Published predictions.
run seed-1x8-h100 seed --config configs/llama-seed.toml --nodes 1 --gpus-per-node 8 --gpu h100
run llama3-8b-1x8-h100 8b --config configs/llama3-8b.toml --nodes 1 --gpus-per-node 8 --gpu h100
run llama3-8b-4x8-h100-hybrid 8b --config configs/llama3-8b.toml --nodes 4 --gpus-per-node 8 --gpu h100 \
  --fsdp.strategy HYBRID_SHARD --data.global_batch_size 32
run llama3-8b-4x8-h100-full 8b --config configs/llama3-8b.toml --nodes 4 --gpus-per-node 8 --gpu h100 \
  --data.global_batch_size 32
run llama3-70b-8x8-h100-hybrid32 8b --config configs/llama3-70b-hybrid.toml --nodes 8 --gpus-per-node 8 --gpu h100
run llama3-70b-8x8-h100-hybrid32-mb2 8b --config configs/llama3-70b-hybrid.toml --nodes 8 --gpus-per-node 8 --gpu h100 \
  --data.micro_batch_size 2 --data.global_batch_size 128
run llama3-70b-8x8-h100-shard64-mb2 8b --config configs/llama3-70b-hybrid.toml --nodes 8 --gpus-per-node 8 --gpu h100 \
  --fsdp.shard_size 64 --data.micro_batch_size 2 --data.global_batch_size 128
run llama3-70b-8x8-h100-hybrid8 8b --config configs/llama3-70b-hybrid.toml --nodes 8 --gpus-per-node 8 --gpu h100 \
  --fsdp.shard_size 8
