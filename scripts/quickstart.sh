#!/usr/bin/env bash
# The main job on a fresh machine: install, build, fetch the default corpus, train a small BPE
# tokenizer on it, prepare the dataset, train configs/tiny-cpu.toml on 2 ranks with FULL_SHARD for about
# a minute (the loss falls from ~8.4 to ~5.4) with checkpoints, plot the metrics, consolidate the last
# checkpoint into a Hugging Face directory, evaluate it on the held-out split, sample text from it, and say
# where everything is.
# Extra arguments go to `shardtrain check` and `shardtrain train` (e.g. --schedule.max_steps 50).
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$ROOT"
start=$SECONDS

"$ROOT/scripts/setup.sh"
configure_and_build shardtrain
bin="$BUILD_DIR/bin/shardtrain"

say "the device mesh: 4 ranks as 2 simulated nodes of 2, HYBRID_SHARD"
mpirun --oversubscribe -np 4 "$bin" env --strategy HYBRID_SHARD --ranks-per-node 2 --log-level warn

prepare_default_dataset "$bin"
tokenizer=$DEFAULT_TOKENIZER
dataset=$DEFAULT_DATASET
# A second source with the same tokenizer, for mixtures (README: --data.mixture; docs/data.md).
if [[ ! -f data/moby-bpe4k.h5 || "$tokenizer" -nt data/moby-bpe4k.h5 ]]; then
  say "preparing data/moby-bpe4k.h5 (Moby Dick, the same tokenizer: a second source for data mixtures)"
  "$bin" prepare-data --tokenizer "$tokenizer" --input data/fetched/corpus/moby-dick --output data/moby-bpe4k.h5 --validation-fraction 0.02 --overwrite
fi

run_dir="runs/tiny-cpu-$(date +%Y%m%d-%H%M%S)"
say "the preflight: the run's own command line checked offline (mesh, data read whole, outputs)"
"$bin" check --config configs/tiny-cpu.toml --data.path "$dataset" --logging.run_dir "$run_dir" --nodes 1 --gpus-per-node 2 \
  --verify-data "$@"
say "training configs/tiny-cpu.toml on 2 ranks, FULL_SHARD (about a minute on 2 cores)"
# Under mpirun the ranks' stdout is a pseudo-terminal even when this script's output goes to a file,
# so the progress style follows this script's own stdout: a bar on a terminal, plain lines in a log.
progress=lines
[[ -t 1 ]] && progress=auto
mpirun --oversubscribe -np 2 "$bin" train --config configs/tiny-cpu.toml --data.path "$dataset" \
  --logging.run_dir "$run_dir" --logging.progress "$progress" "$@"

say "plotting the metrics"
"$ROOT/scripts/plot-metrics.sh" "$run_dir"

checkpoint="$(ls -d "$run_dir"/checkpoints/step_* | sort | tail -n 1)"
say "the last checkpoint, its checksums verified"
"$bin" checkpoint info --verify "$checkpoint" | sed -n '1,4p;/checksums/p'

say "consolidating it into a Hugging Face directory (safetensors, config.json, tokenizer.json)"
"$bin" consolidate "$checkpoint" --output "$run_dir/hf" --format safetensors

say "the trained model on the held-out split: loss, perplexity, bits per byte (2 ranks, the run's own config)"
mpirun --oversubscribe -np 2 "$bin" evaluate --weights "$checkpoint" --json "$run_dir/eval.json" --log-level warn

say "a sample from the trained model"
"$bin" generate --checkpoint "$run_dir/hf" --prompt "My fellow citizens," --max-tokens 60 --seed 7 --log-level warn

last_train="$(grep '"kind":"train"' "$run_dir/metrics.jsonl" | tail -n 1)"
first_train="$(grep -m1 '"kind":"train"' "$run_dir/metrics.jsonl")"
last_eval="$(grep '"kind":"eval"' "$run_dir/metrics.jsonl" | tail -n 1 || true)"
python3 - "$first_train" "$last_train" "$last_eval" <<'PY'
import json, sys
first, last = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ev = json.loads(sys.argv[3]) if sys.argv[3] else None
print(f"    loss {first['loss']:.3f} at step 1 -> {last['loss']:.3f} at step {last['step']}"
      + (f"; validation loss {ev['val_loss']:.3f}" if ev else "")
      + f"; {last['tokens_per_s']:.0f} tokens/s, MFU {100 * last['mfu']:.1f}%")
PY

say "done in $((SECONDS - start))s. Where everything is:"
cat <<EOF_SUMMARY
    binary              $BUILD_DIR/bin/shardtrain   (try: $BUILD_DIR/bin/shardtrain train --help)
    corpus, tokenizers  data/fetched/  (tokenizer trained here: $tokenizer)
    dataset             $dataset
    run directory       $run_dir
      resolved config   $run_dir/config.toml   (train --config $run_dir/config.toml repeats the run)
      metrics           $run_dir/metrics.jsonl (one JSON line per step and per evaluation); evaluate's: $run_dir/eval.json
      plots             $run_dir/loss.png, $run_dir/throughput.png
      checkpoints       $run_dir/checkpoints/  (to continue the run: the same train command with --logging.run_dir $run_dir --resume auto)
      Hugging Face      $run_dir/hf/  (LlamaForCausalLM.from_pretrained loads it)
    configs             configs/ (tiny-cpu, llama-seed, llama-1b-hybrid; examples/ has the seeds' Accelerate YAML and fsdp_config JSON)
    docs                docs/training.md (every config key), docs/checkpoints.md, docs/exit-codes.md
EOF_SUMMARY
