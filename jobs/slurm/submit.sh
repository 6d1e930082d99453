#!/usr/bin/env bash
# Submits a training job and, behind it, the consolidation job that runs only when training has
# succeeded (--dependency=afterok), requeues included. Run from the repository root:
#     CONFIG=configs/llama-1b-hybrid.toml jobs/slurm/submit.sh [jobs/slurm/train-multi-node.sbatch] [more sbatch options]
# Both jobs read the variables of their scripts from this environment (CONFIG, STRATEGY, TRAIN_ARGS, ...).
# The run directory is fixed here, before the job id exists, so that the consolidation job knows it.
set -euo pipefail
script=${1:-jobs/slurm/train-multi-node.sbatch}
shift || true
[[ -f "$script" ]] || { echo "error: $script: no such job script" >&2; exit 2; }
[[ -n "${CONFIG:-}" ]] || { echo "error: CONFIG is not set: CONFIG=path/to/config.toml $0 ..." >&2; exit 3; }
export RUN_DIR=${RUN_DIR:-runs/$(basename "${CONFIG%.*}")-$(date +%Y%m%d-%H%M%S)}
export CHECKPOINT_DIR=${CHECKPOINT_DIR:-$RUN_DIR/checkpoints}
export OUTPUT=${OUTPUT:-$RUN_DIR/hf}
train=$(sbatch --parsable "$@" "$script")
train=${train%%;*}
mkdir -p "$RUN_DIR"
consolidate=$(sbatch --parsable --dependency="afterok:$train" --kill-on-invalid-dep=yes \
  --output="$RUN_DIR/consolidate-%j.out" jobs/slurm/consolidate.sbatch)
consolidate=${consolidate%%;*}
echo "training job $train ($script), run directory $RUN_DIR"
echo "consolidation job $consolidate (after training succeeds) -> $OUTPUT, log $RUN_DIR/consolidate-$consolidate.out"
echo "follow: squeue -j $train,$consolidate ; tail -f shardtrain-$train.out"
