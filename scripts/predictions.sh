#!/usr/bin/env bash
# The predictions docs/performance.md publishes ("Predicted: many GPUs") and the one-GPU calibration beside them,
# made again from this tree: `shardtrain predict` on each config, its report and JSON kept in the output folder.
#   scripts/predictions.sh [OUT]       (default docs/predict-runs/<date>-gpu)
# The H200 seed profile was measured with our own attention kernels; cuDNN's is the default since, so its attention
# rows are left out and the measured cuDNN rates (ops::device_rates) price attention.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$ROOT"
OUT="${1:-docs/predict-runs/$(date +%F)-gpu}"
BIN="$BUILD_DIR/bin/shardtrain"
mkdir -p "$OUT"
PROFILE=(--ops-profile profiles/h200/seed-b64-s512.json --ops-profile-exclude attention_forward
  --ops-profile-exclude attention_backward)
run() {  # name, then predict's arguments
  local name=$1
  shift
  say "$name"
  "$BIN" predict "$@" "${PROFILE[@]}" --json "$OUT/$name.json" | tee "$OUT/$name.txt"
}
# Calibration: the one-GPU steps of docs/performance.md (H200, 2026-11-27), as bench-vs-pytorch.py ran them.
run calib-seed-h200 --config configs/llama-seed.toml --nodes 1 --gpus-per-node 1 --gpu h200
run calib-1b-h200 --config configs/llama-1b.toml --data.global_batch_size 8 --nodes 1 --gpus-per-node 1 --gpu h200
run calib-8b-layers-h200 --config configs/llama-8b-layers.toml --nodes 1 --gpus-per-node 1 --gpu h200
# Published predictions.
run seed-1x8-h100 --config configs/llama-seed.toml --nodes 1 --gpus-per-node 8 --gpu h100
run llama3-8b-1x8-h100 --config configs/llama3-8b.toml --nodes 1 --gpus-per-node 8 --gpu h100
run llama3-8b-4x8-h100-hybrid --config configs/llama3-8b.toml --nodes 4 --gpus-per-node 8 --gpu h100 \
  --fsdp.strategy HYBRID_SHARD --data.global_batch_size 32
run llama3-8b-4x8-h100-full --config configs/llama3-8b.toml --nodes 4 --gpus-per-node 8 --gpu h100 \
  --data.global_batch_size 32
run llama3-70b-8x8-h100-hybrid32 --config configs/llama3-70b-hybrid.toml --nodes 8 --gpus-per-node 8 --gpu h100
run llama3-70b-8x8-h100-hybrid32-mb2 --config configs/llama3-70b-hybrid.toml --nodes 8 --gpus-per-node 8 --gpu h100 \
  --data.micro_batch_size 2 --data.global_batch_size 128
run llama3-70b-8x8-h100-shard64-mb2 --config configs/llama3-70b-hybrid.toml --nodes 8 --gpus-per-node 8 --gpu h100 \
  --fsdp.shard_size 64 --data.micro_batch_size 2 --data.global_batch_size 128
run llama3-70b-8x8-h100-hybrid8 --config configs/llama3-70b-hybrid.toml --nodes 8 --gpus-per-node 8 --gpu h100 \
  --fsdp.shard_size 8
