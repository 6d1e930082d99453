#!/usr/bin/env bash
# Submits a training job and, behind it, the consolidation job that runs only when training has
# succeeded (--dependency=afterok), requeues included; with EVALUATE=1 also an evaluation job that scores
# every checkpoint on held-out data (jobs/slurm/evaluate.sbatch); with PREPARE=1, in front of training, a job
# that prepares the dataset it trains on (jobs/slurm/prepare-data.sbatch: INPUT, TOKENIZER, DATASET, ...).
# Run from the repository root:
#     CONFIG=configs/llama-1b-hybrid.toml jobs/slurm/submit.sh [jobs/slurm/train-multi-node.sbatch] [more sbatch options]
#     PREPARE=1 INPUT=fineweb/sample/10BT TOKENIZER=bpe_50K.json DATASET=data/fineweb.h5 CONFIG=... jobs/slurm/submit.sh
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
SHARDTRAIN_HOME=${SHARDTRAIN_HOME:-$PWD}
SHARDTRAIN_BIN=${SHARDTRAIN_BIN:-$SHARDTRAIN_HOME/build/bin/shardtrain}
# shellcheck source=jobs/slurm/lib.sh
source "$SHARDTRAIN_HOME/jobs/slurm/lib.sh"
# Every setting the jobs read from a list of words, now rather than after the queue wait.
st_check_job_settings "$script"
[[ "${EVALUATE:-0}" =~ ^[01]$ ]] || { echo "error: EVALUATE=$EVALUATE: expected 1 (queue the evaluation job too) or 0" >&2; exit 3; }
[[ "${PREFLIGHT:-1}" =~ ^[01]$ ]] || { echo "error: PREFLIGHT=$PREFLIGHT: expected 1 (check the run before queueing it) or 0" >&2; exit 3; }
# The allocation and time the job asks for (its #SBATCH lines and these options): the --signal warning must
# fit in the time limit, and below, the mesh and the batch split are checked for it.
st_sbatch_shape "$script" "$@"
st_check_time_limit "$ST_SHAPE_TIME" "$ST_SHAPE_SIGNAL" "from the #SBATCH lines of $script and the options given"
pending=()
if [[ "${PREPARE:-0}" == 1 ]]; then
  # The dataset does not exist yet: its job's settings are checked now, the run trains on DATASET, and the
  # preflight below leaves the data to the training job's own check at its start.
  st_check_prepare_settings jobs/slurm/prepare-data.sbatch
  [[ " ${TRAIN_ARGS:-} " != *" --data.path "* && " ${TRAIN_ARGS:-} " != *" --data.mixture "* ]] ||
    { echo "error: PREPARE=1 trains on DATASET=$DATASET: leave --data.path and --data.mixture out of TRAIN_ARGS" >&2; exit 3; }
  export TRAIN_ARGS="${TRAIN_ARGS:-} --data.path $DATASET"
  pending=(--data-pending)
elif [[ "${PREPARE:-0}" != 0 ]]; then
  echo "error: PREPARE=$PREPARE: expected 0 or 1" >&2
  exit 3
fi

# The preflight, here on the login node and before the queue wait: `shardtrain check` with the run's own
# command line (offline, seconds). A typo, a missing dataset, a checkpoint of another model or a directory
# that cannot be made is reported now, not after the job has waited for its nodes. The job checks again when
# it starts, with its allocation's mesh and the data's checksums. PREFLIGHT=0 submits without it.
if [[ "${PREFLIGHT:-1}" != 0 ]]; then
  [[ -x "$SHARDTRAIN_BIN" ]] ||
    { echo "error: SHARDTRAIN_BIN=$SHARDTRAIN_BIN: not an executable (build it or set SHARDTRAIN_BIN; PREFLIGHT=0 submits unchecked)" >&2; exit 3; }
  [[ "$(basename "$script")" == train-multi-node.sbatch ]] && STRATEGY=${STRATEGY-HYBRID_SHARD}  # that script's default
  # The allocation the job asks for, so that the mesh and the batch split are checked too: HYBRID_SHARD's
  # shard groups, a global batch the ranks cannot divide.
  world=()
  if [[ -n "$ST_SHAPE_NODES" ]]; then
    ST_RANKS_PER_NODE=$ST_SHAPE_PER_NODE
    world=(--nodes "$ST_SHAPE_NODES" --gpus-per-node "$ST_SHAPE_PER_NODE")
  else
    echo "note: the mesh is not checked before submission: $ST_SHAPE_WHY" >&2
  fi
  # GPU_MEMORY=80GiB: what each GPU will hold, against that (the login node has no GPU to ask); its spelling
  # is checked even when the allocation is not known.
  [[ -n "${GPU_MEMORY:-}" && "${GPU_MEMORY}" != auto && "${GPU_MEMORY}" != 0 ]] && world+=(--gpu-memory "$GPU_MEMORY")
  st_run_args
  rc=0
  "$SHARDTRAIN_BIN" check "${ST_RUN_ARGS[@]}" "${world[@]}" "${pending[@]}" >&2 || rc=$?
  if ((rc != 0)); then
    echo "error: not submitted: shardtrain check found the problem(s) above (exit $rc; PREFLIGHT=0 submits anyway)" >&2
    exit "$rc"
  fi
fi
mkdir -p "$RUN_DIR"
after_prepare=()
if [[ "${PREPARE:-0}" == 1 ]]; then
  # shellcheck disable=SC2086  # PREPARE_SBATCH_ARGS is a list of words on purpose
  prepare=$(sbatch --parsable --output="$RUN_DIR/prepare-%j.out" ${PREPARE_SBATCH_ARGS:-} jobs/slurm/prepare-data.sbatch)
  prepare=${prepare%%;*}
  after_prepare=(--dependency="afterok:$prepare" --kill-on-invalid-dep=yes)
  echo "preparation job $prepare -> $DATASET, log $RUN_DIR/prepare-$prepare.out"
fi
train_job=$(sbatch --parsable "${after_prepare[@]}" "$@" "$script")
train_job=${train_job%%;*}
consolidate=$(sbatch --parsable --dependency="afterok:$train_job" --kill-on-invalid-dep=yes \
  --output="$RUN_DIR/consolidate-%j.out" jobs/slurm/consolidate.sbatch)
consolidate=${consolidate%%;*}
jobs_list=${prepare:+$prepare,}$train_job,$consolidate
echo "training job $train_job ($script), run directory $RUN_DIR"
echo "consolidation job $consolidate (after training succeeds) -> $OUTPUT, log $RUN_DIR/consolidate-$consolidate.out"
if [[ "${EVALUATE:-0}" == 1 ]]; then
  # The held-out curve over the run's checkpoints, on GPUs (jobs/slurm/evaluate.sbatch; its #SBATCH lines ask
  # for one node of 8; EVAL_SBATCH_ARGS="--ntasks-per-node=4 --gpus-per-node=4 ..." changes that).
  # shellcheck disable=SC2086  # EVAL_SBATCH_ARGS is a list of words on purpose
  evaluation=$(OUTPUT_JSON=${OUTPUT_JSON:-$RUN_DIR/eval.json} sbatch --parsable --dependency="afterok:$train_job" --kill-on-invalid-dep=yes \
    --output="$RUN_DIR/evaluate-%j.out" ${EVAL_SBATCH_ARGS:-} jobs/slurm/evaluate.sbatch)
  evaluation=${evaluation%%;*}
  jobs_list+=,$evaluation
  echo "evaluation job $evaluation (after training succeeds) -> ${OUTPUT_JSON:-$RUN_DIR/eval.json}, log $RUN_DIR/evaluate-$evaluation.out"
fi
echo "follow: squeue -j $jobs_list ; tail -f shardtrain-$train_job.out"
