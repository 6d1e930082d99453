#!/usr/bin/env bash
# Submits a training job and, behind it, the consolidation job that runs only when training has
# succeeded (--dependency=afterok), requeues included; with EVALUATE=1 also an evaluation job that scores
# every checkpoint on held-out data (jobs/slurm/evaluate.sbatch); with PREPARE=1, in front of training, a job
# that prepares the dataset it trains on (jobs/slurm/prepare-data.sbatch: INPUT, TOKENIZER, DATASET, ...).
#     CONFIG=configs/llama-1b-hybrid.toml jobs/slurm/submit.sh [JOB SCRIPT] [SBATCH OPTION...]
#     PREPARE=1 INPUT=fineweb/sample/10BT TOKENIZER=bpe_50K.json DATASET=data/fineweb.h5 CONFIG=... jobs/slurm/submit.sh
# The job script comes first; without one (no argument, or an sbatch option first) it is
# jobs/slurm/train-multi-node.sbatch. The sbatch options go to the training job. Every job reads the variables
# of its script from this environment (CONFIG, STRATEGY, TRAIN_ARGS, ...), finds the scripts in
# SHARDTRAIN_HOME (default: the repository this submit.sh is in), and runs in one directory: the training
# job's --chdir when one is given (in its options or its script's #SBATCH lines), else the directory submit.sh
# is started from. Relative paths (CONFIG, the files in TRAIN_ARGS, INPUT, DATASET) start there, for the
# preflight below as for the jobs.
# The run directory is fixed here, before the job ids exist, so that the later jobs know it, and given to
# every job as an absolute path. Each submission gets one of its own: runs/<config>-<date>-<time>, made new
# (mkdir, never an existing one: -2, -3, ... when another submission took the name), unless RUN_DIR is given:
# a RUN_DIR that exists is a deliberate resubmission, and the run there continues from its checkpoints.
# Nothing starts before everything is queued: the first job goes in held and is released last. When a
# submission fails, the jobs already queued are cancelled (or listed, when scancel fails) and a run directory
# made for them is removed.
# Exit codes (docs/exit-codes.md): 0 queued; 2 usage: no such job script, a job script or `--` among the options
# (sbatch would run that one), --wait (or SBATCH_WAIT), --no-requeue (or SBATCH_NO_REQUEUE), an --export (or
# SBATCH_EXPORT) without ALL (the jobs read their settings from the environment), a --dependency with PREPARE=1,
# a --chdir that is no directory, a submission Slurm refused (sbatch's or scontrol's message is above it: an option or partition it does not
# know, an EVAL_SBATCH_ARGS typo); 3 configuration: CONFIG unset, a setting the jobs do not understand
# (LAUNCHER, GPU_BIND, VERIFY_DATA, RESTART_ON, MAX_RESTARTS, EXCLUDE_FAILED_NODES, PREPARE, EVALUATE,
# PREFLIGHT), a --time the --signal warning does not fit in; 8: the run directory cannot be made; the
# preflight's own code (shardtrain check) when it finds a problem; 130 interrupted (before the release nothing stays
# queued; after it the jobs stay queued, and the message says so).
set -euo pipefail
ST_WHO=submit  # lib.sh's messages: "[shardtrain submit] error: ..."
home_default=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SHARDTRAIN_HOME=${SHARDTRAIN_HOME:-$home_default}
if [[ ! -f "$SHARDTRAIN_HOME/jobs/slurm/lib.sh" ]]; then
  echo "[shardtrain submit] error: SHARDTRAIN_HOME=$SHARDTRAIN_HOME: no jobs/slurm/lib.sh there (expected the repository root)" >&2
  exit 3
fi
# Absolute, and exported: the jobs find lib.sh and bind-gpu.sh there whatever directory they run in.
SHARDTRAIN_HOME=$(cd "$SHARDTRAIN_HOME" && pwd)
export SHARDTRAIN_HOME
# shellcheck source=jobs/slurm/lib.sh
source "$SHARDTRAIN_HOME/jobs/slurm/lib.sh"
SHARDTRAIN_BIN=${SHARDTRAIN_BIN:-$SHARDTRAIN_HOME/build/bin/shardtrain}
[[ "$SHARDTRAIN_BIN" == /* ]] || SHARDTRAIN_BIN=$PWD/$SHARDTRAIN_BIN
export SHARDTRAIN_BIN

# What this submission queued, cancelled again when it fails before the end (the EXIT trap); the run directory
# it made, removed then (it is empty: no job of it has started).
queued=() made_run_dir="" made_top="" submitted=0
undo() {
  ((submitted)) && return 0
  if ((${#queued[@]} > 0)); then
    if scancel "${queued[@]}"; then
      echo "[shardtrain submit] error: cancelled the job(s) this submission had queued (held: none had started): ${queued[*]}" >&2
    else
      echo "[shardtrain submit] error: could not cancel the job(s) this submission queued: ${queued[*]}; cancel them with scancel ${queued[*]}" >&2
    fi
  fi
  # The run directory, and the folders above it that this submission made for it (mkdir -p), while empty.
  local d=$made_run_dir
  while [[ -n "$d" ]] && rmdir "$d" 2>/dev/null && [[ "$d" != "$made_top" ]]; do d=$(dirname "$d"); done
  return 0
}
# topmost_missing PATH: the highest folder of PATH that does not exist yet (mkdir -p makes it and those below it).
topmost_missing() {
  local p=$1 top=""
  while [[ -n "$p" && "$p" != / && "$p" != . && ! -e "$p" ]]; do
    top=$p
    p=$(dirname "$p")
  done
  printf '%s\n' "$top"
}
trap undo EXIT
trap 'st_die 130 "interrupted: not submitted"' INT TERM

script=$SHARDTRAIN_HOME/jobs/slurm/train-multi-node.sbatch
if (($# > 0)) && [[ "$1" != -* ]]; then
  script=$1
  shift
fi
[[ -f "$script" ]] ||
  st_die 2 "$script: no such job script (usage: CONFIG=... $0 [JOB SCRIPT] [SBATCH OPTION...]: the script first, then the options; without one, jobs/slurm/train-multi-node.sbatch)"
shown_script=$script
[[ "$script" == /* ]] || script=$PWD/$script
# Among the options, sbatch would take the first word that is not an option as the script (and the rest as its
# arguments): a script named after the options ran instead of the one checked here, --chdir became its argument.
# And --wait made sbatch wait for a job that is only released once sbatch returns.
for option in "$@"; do
  case "$option" in
    --wait | -W) st_die 2 "$option: submit.sh queues held jobs and releases them after sbatch returns, so sbatch would wait forever; follow the jobs with the squeue line it prints" ;;
    --no-requeue) st_die 2 "$option: the training job requeues itself to continue after a preemption, a time limit's warning or a failure a restart may cure; without requeues each of those ends it" ;;
    -- | [!-]*.sbatch | [!-]*.sh) st_die 2 "'$option' among the sbatch options: sbatch would run it, not the script checked here (usage: CONFIG=... $0 [JOB SCRIPT] [SBATCH OPTION...]: the script first, then the options)" ;;
  esac
done
# The jobs read their settings (CONFIG, RUN_DIR, TRAIN_ARGS, ...) from the environment sbatch passes on: --export=NONE,
# NIL or a list of variables without ALL leaves them out, and each job stopped at its start ("CONFIG is not set").
exports=() previous=""
[[ -n "${SBATCH_EXPORT:-}" ]] && exports+=("SBATCH_EXPORT=$SBATCH_EXPORT")
for option in "$@"; do
  [[ "$previous" == --export ]] && exports+=("--export $option")
  [[ "$option" == --export=* ]] && exports+=("$option")
  previous=$option
done
for given in "${exports[@]}"; do
  value=${given#*[= ]}
  [[ ",$value," == *,ALL,* ]] ||
    st_die 2 "$given: the jobs read CONFIG, RUN_DIR, TRAIN_ARGS and their other settings from the environment sbatch passes on, which that leaves out (each job would stop at its start); give --export=ALL, or ALL,VAR=value,..."
done
[[ -z "${SBATCH_WAIT:-}" ]] || st_die 2 "SBATCH_WAIT=$SBATCH_WAIT: sbatch would wait for the held jobs, which are released only once it returns; unset it"
[[ -z "${SBATCH_NO_REQUEUE:-}" ]] || st_die 2 "SBATCH_NO_REQUEUE=$SBATCH_NO_REQUEUE: the training job requeues itself to continue after a preemption, a time limit's warning or a failure a restart may cure; unset it"
[[ -n "${CONFIG:-}" ]] || st_die 3 "CONFIG is not set: CONFIG=path/to/config.toml $0 ..."
# Every setting the jobs read from a list of words, now rather than after the queue wait.
st_check_job_settings "$shown_script"
[[ "${EVALUATE:-0}" =~ ^[01]$ ]] || st_die 3 "EVALUATE=$EVALUATE: expected 1 (queue the evaluation job too) or 0"
[[ "${PREFLIGHT:-1}" =~ ^[01]$ ]] || st_die 3 "PREFLIGHT=$PREFLIGHT: expected 1 (check the run before queueing it) or 0"
[[ "${PREPARE:-0}" =~ ^[01]$ ]] || st_die 3 "PREPARE=$PREPARE: expected 0 or 1"

# The allocation, directory and time the training job asks for: its script's #SBATCH lines and the options.
st_sbatch_shape "$script" "$@"
if [[ -n "$ST_SHAPE_CHDIR" ]]; then
  cd "$ST_SHAPE_CHDIR" 2>/dev/null || st_die 2 "--chdir=$ST_SHAPE_CHDIR: no such directory (from $PWD)"
fi
workdir=$PWD
st_check_time_limit "$ST_SHAPE_TIME" "$ST_SHAPE_SIGNAL" "from the #SBATCH lines of $shown_script and the options given"

absolute() {
  if [[ "$1" == /* ]]; then printf '%s\n' "$1"; else printf '%s\n' "$workdir/$1"; fi
}
if [[ -n "${RUN_DIR:-}" ]]; then
  RUN_DIR=$(absolute "$RUN_DIR")
  unset ST_RUN_DIR_GENERATED  # named: the job continues the checkpoints it finds there
  if [[ ! -e "$RUN_DIR" ]]; then
    made_top=$(topmost_missing "$RUN_DIR")
    mkdir -p "$RUN_DIR" 2>/dev/null || st_die 8 "RUN_DIR=$RUN_DIR: cannot create the directory"
    made_run_dir=$RUN_DIR
  fi
else
  # A name of its own: mkdir (no -p) fails on a directory another submission made, in the same second too.
  base=$workdir/runs/$(basename "${CONFIG%.*}")-$(date +%Y%m%d-%H%M%S)
  made_top=$(topmost_missing "$workdir/runs")
  mkdir -p "$workdir/runs" 2>/dev/null || st_die 8 "$workdir/runs: cannot create the directory the run directories go in"
  RUN_DIR=$base
  n=1
  until mkdir "$RUN_DIR" 2>/dev/null; do
    [[ -e "$RUN_DIR" ]] || st_die 8 "RUN_DIR=$RUN_DIR: cannot create the directory"
    n=$((n + 1))
    RUN_DIR=$base-$n
  done
  made_run_dir=$RUN_DIR
  [[ -n "$made_top" ]] || made_top=$RUN_DIR
  # The job's first start refuses checkpoints in a directory it was not pointed at (lib.sh, st_check_run_dir_owner).
  export ST_RUN_DIR_GENERATED=$RUN_DIR
fi
export RUN_DIR
CHECKPOINT_DIR=$(absolute "${CHECKPOINT_DIR:-$RUN_DIR/checkpoints}")
OUTPUT=$(absolute "${OUTPUT:-$RUN_DIR/hf}")
OUTPUT_JSON=$(absolute "${OUTPUT_JSON:-$RUN_DIR/eval.json}")
export CHECKPOINT_DIR OUTPUT OUTPUT_JSON

pending=()
if [[ "${PREPARE:-0}" == 1 ]]; then
  # The dataset does not exist yet: its job's settings are checked now, the run trains on DATASET, and the
  # preflight below leaves the data to the training job's own check at its start.
  st_check_prepare_settings jobs/slurm/prepare-data.sbatch
  [[ " ${TRAIN_ARGS:-} " != *" --data.path"[\ =]* && " ${TRAIN_ARGS:-} " != *" --data.mixture"[\ =]* ]] ||
    st_die 3 "PREPARE=1 trains on DATASET=$DATASET: leave --data.path and --data.mixture out of TRAIN_ARGS"
  # TRAIN_ARGS is a list of words: a path with a space would be two of them (a usage error in the job).
  [[ "$DATASET" != *[[:space:]]* ]] ||
    st_die 3 "DATASET=$DATASET: PREPARE=1 passes it to the training job in TRAIN_ARGS, a list of words; give a path without spaces"
  # The training job waits for the preparation through its own --dependency; one of the user's would replace it
  # (sbatch takes the last), and training started before the data existed.
  for option in "$@"; do
    [[ "$option" == --dependency* || "$option" == -d* ]] &&
      st_die 2 "PREPARE=1: the training job waits for the preparation (--dependency=afterok:PREP); $option would replace that: give it to the preparation in PREPARE_SBATCH_ARGS"
  done
  export TRAIN_ARGS="${TRAIN_ARGS:-} --data.path $DATASET"
  pending=(--data-pending)
fi

# The preflight, here on the login node and before the queue wait: `shardtrain check` with the run's own
# command line (offline, seconds). A typo, a missing dataset, a checkpoint of another model or a directory
# that cannot be made is reported now, not after the job has waited for its nodes. The job checks again when
# it starts, with its allocation's mesh and the data's checksums. PREFLIGHT=0 submits without it.
if [[ "${PREFLIGHT:-1}" == 1 ]]; then
  [[ -x "$SHARDTRAIN_BIN" ]] ||
    st_die 3 "SHARDTRAIN_BIN=$SHARDTRAIN_BIN: not an executable (build it or set SHARDTRAIN_BIN; PREFLIGHT=0 submits unchecked)"
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
  # The resume the job's first start makes: a fresh run in a directory made for it, --resume auto in a named one.
  if [[ -n "${ST_RUN_DIR_GENERATED:-}" && "$CHECKPOINT_DIR" == "$RUN_DIR/checkpoints" ]]; then ST_RESUME=(); else ST_RESUME=(--resume auto); fi
  st_run_args
  rc=0
  "$SHARDTRAIN_BIN" check "${ST_RUN_ARGS[@]}" "${world[@]}" "${pending[@]}" >&2 || rc=$?
  ((rc == 0)) || st_die "$rc" "not submitted: shardtrain check found the problem(s) above (exit $rc; PREFLIGHT=0 submits anyway)"
fi

# sb WHAT SBATCH ARGUMENT...: one submission; its id in $job. A refusal ends submit.sh (exit 2), and the EXIT
# trap cancels what was queued before it.
sb() {
  local what=$1 out
  shift
  out=$(sbatch --parsable "$@") || st_die 2 "not submitted: sbatch refused the $what job (its message is above)"
  job=${out%%;*}
  queued+=("$job")
}
user_hold=0
for option in "$@"; do
  if [[ "$option" == --hold || "$option" == -H ]]; then user_hold=1; fi
done
in_workdir=(--chdir="$workdir")  # last among the options: a relative --chdir was resolved above
logs_dir=${RUN_DIR//%/%%}  # sbatch reads % in --output as a pattern (%x, %j): a RUN_DIR's own % stays itself
prepare="" after_prepare=() train_hold=(--hold)
if [[ "${PREPARE:-0}" == 1 ]]; then
  # shellcheck disable=SC2086  # PREPARE_SBATCH_ARGS is a list of words on purpose
  sb preparation --hold --output="$logs_dir/prepare-%j.out" ${PREPARE_SBATCH_ARGS:-} "${in_workdir[@]}" \
    "$SHARDTRAIN_HOME/jobs/slurm/prepare-data.sbatch"
  prepare=$job
  after_prepare=(--dependency="afterok:$prepare" --kill-on-invalid-dep=yes)
  train_hold=()  # it waits for the preparation, which is held
fi
sb training "${train_hold[@]}" "${after_prepare[@]}" "$@" "${in_workdir[@]}" "$script"
train_job=$job
consolidate=""
if [[ -e "$OUTPUT" ]]; then
  # A resubmission that continues a run: its earlier export is there, and a consolidation never overwrites (it
  # failed with exit 8 after the training).
  st_log "OUTPUT=$OUTPUT exists (an earlier consolidation of this run): no consolidation job queued (it never overwrites); move it aside and run jobs/slurm/consolidate.sbatch after the training, or set OUTPUT"
else
  sb consolidation --dependency="afterok:$train_job" --kill-on-invalid-dep=yes --output="$logs_dir/consolidate-%j.out" \
    "${in_workdir[@]}" "$SHARDTRAIN_HOME/jobs/slurm/consolidate.sbatch"
  consolidate=$job
fi
evaluation=""
if [[ "${EVALUATE:-0}" == 1 ]]; then
  # The held-out curve over the run's checkpoints, on GPUs (jobs/slurm/evaluate.sbatch; its #SBATCH lines ask
  # for one node of 8; EVAL_SBATCH_ARGS="--ntasks-per-node=4 --gpus-per-node=4 ..." changes that).
  # shellcheck disable=SC2086  # EVAL_SBATCH_ARGS is a list of words on purpose
  sb evaluation --dependency="afterok:$train_job" --kill-on-invalid-dep=yes --output="$logs_dir/evaluate-%j.out" \
    ${EVAL_SBATCH_ARGS:-} "${in_workdir[@]}" "$SHARDTRAIN_HOME/jobs/slurm/evaluate.sbatch"
  evaluation=$job
fi
# Everything is queued: the first job may start.
first=${prepare:-$train_job}
if [[ -n "$prepare" || "$user_hold" == 0 ]]; then
  scontrol release "$first" || st_die 2 "not submitted: scontrol release $first was refused (its message is above)"
fi
jobs_list=${prepare:+$prepare,}$train_job${consolidate:+,$consolidate}${evaluation:+,$evaluation}
submitted=1
# From here the jobs are queued and released: an interrupt stops the report, not the submission.
trap 'echo "[shardtrain submit] interrupted after the jobs were queued: they stay queued (squeue -j $jobs_list; scancel $jobs_list cancels them)" >&2; exit 130' INT TERM
if [[ -n "$prepare" ]]; then echo "preparation job $prepare -> $DATASET, log $RUN_DIR/prepare-$prepare.out"; fi
echo "training job $train_job ($shown_script), run directory $RUN_DIR"
if [[ "$user_hold" == 1 ]]; then echo "  held, as its options ask (--hold): scontrol release $train_job starts it"; fi
if [[ -n "$consolidate" ]]; then
  echo "consolidation job $consolidate (after training succeeds) -> $OUTPUT, log $RUN_DIR/consolidate-$consolidate.out"
fi
if [[ -n "$evaluation" ]]; then
  echo "evaluation job $evaluation (after training succeeds) -> $OUTPUT_JSON, log $RUN_DIR/evaluate-$evaluation.out"
fi
log=$(scontrol show job "$train_job" 2>/dev/null | sed -n 's/^ *StdOut=//p' | head -n1) || true
echo "follow: squeue -j $jobs_list ; tail -f ${log:-"the StdOut that scontrol show job $train_job names"}"
