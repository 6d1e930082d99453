#!/usr/bin/env bash
# The predictions docs/performance.md publishes ("Predicted: many GPUs") and the one-GPU calibration beside them,
# made again from this tree: `shardtrain predict` on each config, its report and JSON kept in the output folder.
#   scripts/predictions.sh [OUT]       (default docs/predict-runs/<date>-gpu)
# Each config is priced with its shape's own profile where profiles/h200/ has one (ops-seed.json, ops-1b.json,
# ops-8b.json: `scripts/gpu/run.sh ops` writes them under those names; the 8B layers' serves Llama 3 8B and 70B).
# Else the H200 seed profile of 2026-11-26, measured with our own attention kernels: cuDNN's is the default since, so
# its attention rows are left out and the measured cuDNN rates (ops::device_rates) price attention.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$ROOT"
OUT="${1:-docs/predict-runs/$(date +%F)-gpu}"
BIN="$BUILD_DIR/bin/shardtrain"
mkdir -p "$OUT"
run() {  # name, the shape whose profile prices it (seed, 1b, 8b), then predict's arguments
  local name=$1 own=profiles/h200/ops-$2.json
  shift 2
  local profile=(--ops-profile profiles/h200/seed-b64-s512.json --ops-profile-exclude attention_forward
    --ops-profile-exclude attention_backward)
  [[ -f $own ]] && profile=(--ops-profile "$own")
  say "$name (${profile[1]})"
  "$BIN" predict "$@" "${profile[@]}" --json "$OUT/$name.json" | tee "$OUT/$name.txt"
}
# Calibration: the one-GPU steps of docs/performance.md (H200, 2026-11-27), as bench-vs-pytorch.py ran them.
run calib-seed-h200 seed --config configs/llama-seed.toml --nodes 1 --gpus-per-node 1 --gpu h200
run calib-1b-h200 1b --config configs/llama-1b.toml --data.global_batch_size 8 --nodes 1 --gpus-per-node 1 --gpu h200
run calib-8b-layers-h200 8b --config configs/llama-8b-layers.toml --nodes 1 --gpus-per-node 1 --gpu h200
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
