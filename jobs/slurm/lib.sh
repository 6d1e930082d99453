# Shared by the sbatch scripts in this folder (sourced, never run): the checks every job makes before
# it starts training, and the launcher that turns a preemption signal into a checkpoint and a requeue.
# Every check fails at once, with one line naming the variable, file or Slurm setting at fault, and an
# exit code from docs/exit-codes.md (2 usage, 3 config, 5 checkpoint, 8 io; 75 a stop on a signal), so a
# wrong job ends in seconds instead of after its queue wait and start-up.
# shellcheck shell=bash

# Who speaks: "job ID" in a job, "submit" in jobs/slurm/submit.sh (ST_WHO).
st_log() { printf '[shardtrain %s] %s\n' "${ST_WHO:-job ${SLURM_JOB_ID:-?}}" "$*"; }

# st_die CODE MESSAGE: one line on stderr (it lands in the job's output file) and the exit code.
st_die() {
  local code=$1
  shift
  printf '[shardtrain %s] error: %s\n' "${ST_WHO:-job ${SLURM_JOB_ID:-?}}" "$*" >&2
  exit "$code"
}

# The variables Slurm sets in every batch job; without them this is not running under sbatch.
st_require_slurm() {
  local v
  for v in SLURM_JOB_ID SLURM_JOB_NUM_NODES SLURM_NTASKS SLURM_JOB_NODELIST; do
    [[ -n "${!v:-}" ]] || st_die 2 "$v is not set: submit this script with sbatch (it reads the allocation from Slurm's variables)"
  done
}

# st_require_vars SCRIPT VAR...: each variable must be set and non-empty.
st_require_vars() {
  local script=$1 v
  shift
  for v in "$@"; do
    [[ -n "${!v:-}" ]] || st_die 3 "$v is not set: set it at the top of $script or in the environment of sbatch (e.g. $v=... sbatch $script)"
  done
}

# st_require_file VAR: the variable names a readable file.
st_require_file() {
  local v=$1
  [[ -r "${!v}" && -f "${!v}" ]] || st_die 3 "$v=${!v}: no such readable file (relative paths start at the submit directory, $PWD)"
}

# st_check_prepare_settings SCRIPT: the variables of jobs/slurm/prepare-data.sbatch (INPUT, TOKENIZER,
# TOKENIZER_VOCAB, DATASET, OVERWRITE), as the job and submit.sh (PREPARE=1) read them: every input there, the
# tokenizer there (or, to be trained, not there yet), and DATASET not there unless OVERWRITE=1, in a directory
# that can be written.
st_check_prepare_settings() {
  local script=$1 i dir
  st_require_vars "$script" INPUT TOKENIZER DATASET
  [[ "${TOKENIZER_VOCAB:-0}" =~ ^[0-9]+$ ]] || st_die 3 "TOKENIZER_VOCAB=$TOKENIZER_VOCAB: expected a vocabulary size (0: use TOKENIZER as it is)"
  [[ "${OVERWRITE:-0}" == 0 || "${OVERWRITE:-0}" == 1 ]] || st_die 3 "OVERWRITE=$OVERWRITE: expected 0 or 1"
  for i in $INPUT; do
    [[ -e "$i" ]] || st_die 4 "INPUT: $i: no such file or folder (relative paths start at the submit directory, $PWD)"
  done
  if ((${TOKENIZER_VOCAB:-0} > 0)); then
    [[ ! -e "$TOKENIZER" || "${OVERWRITE:-0}" == 1 ]] ||
      st_die 3 "TOKENIZER=$TOKENIZER exists: with TOKENIZER_VOCAB it is where the trained tokenizer goes; OVERWRITE=1 replaces it"
  else
    [[ -e "$TOKENIZER" ]] || st_die 4 "TOKENIZER=$TOKENIZER: no such tokenizer file or folder (TOKENIZER_VOCAB=N trains one there)"
  fi
  [[ ! -e "$DATASET" || "${OVERWRITE:-0}" == 1 ]] ||
    st_die 3 "DATASET=$DATASET exists: a run may be training or resuming on it; OVERWRITE=1 replaces it, or choose another DATASET"
  dir=$(dirname "$DATASET")
  if ! mkdir -p "$dir" 2>/dev/null || [[ ! -w "$dir" ]]; then
    st_die 8 "DATASET=$DATASET: its directory $dir cannot be created or written"
  fi
}

# Ranks per node from Slurm: --ntasks-per-node sets SLURM_NTASKS_PER_NODE; otherwise SLURM_TASKS_PER_NODE
# ("4(x2)" or "4,4") must name one count for every node. The mesh puts one shard group inside each node, so
# uneven nodes cannot be meshed. Sets ST_RANKS_PER_NODE.
st_ranks_per_node() {
  local nodes=$SLURM_JOB_NUM_NODES tasks=$SLURM_NTASKS rpn="${SLURM_NTASKS_PER_NODE:-}"
  if [[ -z "$rpn" ]]; then
    local spec=${SLURM_TASKS_PER_NODE:-} counts
    counts=$(printf '%s' "$spec" | tr ',' '\n' | sed -E 's/\(x[0-9]+\)$//' | sort -u)
    [[ -n "$spec" && $(printf '%s\n' "$counts" | wc -l) -eq 1 ]] ||
      st_die 3 "SLURM_TASKS_PER_NODE=$spec: the nodes got different numbers of tasks; use #SBATCH --ntasks-per-node=G (one task per GPU)"
    rpn=$counts
  fi
  [[ "$rpn" =~ ^[0-9]+$ && "$rpn" -gt 0 ]] || st_die 3 "SLURM_NTASKS_PER_NODE=$rpn: expected a positive integer"
  ((nodes * rpn == tasks)) ||
    st_die 3 "$tasks tasks on $nodes nodes is not $rpn per node: use #SBATCH --nodes=N with --ntasks-per-node=G and no --ntasks"
  ST_RANKS_PER_NODE=$rpn
}

# st_sbatch_shape SCRIPT [SBATCH OPTION...]: the nodes and tasks per node a submission asks for, before Slurm
# has an allocation: the script's #SBATCH lines (read as sbatch reads them: up to the first line that is not a
# comment), then the options given to sbatch, which override them. Understands --nodes=N, --nodes N, -N N,
# -NN, --ntasks-per-node=G and --ntasks-per-node G. Sets ST_SHAPE_NODES and ST_SHAPE_PER_NODE, or leaves
# them empty and says why in ST_SHAPE_WHY: a node range (--nodes=2-4: Slurm picks), no --ntasks-per-node, or
# a count that is not a positive integer. Also the other options the scripts depend on, as given (empty when
# absent): ST_SHAPE_CHDIR (--chdir/-D: where the job runs and relative paths start), ST_SHAPE_TIME
# (--time/-t) and ST_SHAPE_SIGNAL (--signal: the warning before the time limit).
st_sbatch_shape() {
  local script=$1 line words=() nodes="" per_node="" chdir="" time="" signal="" i w
  shift
  while IFS= read -r line; do
    [[ "$line" =~ ^#! ]] && continue
    [[ "$line" =~ ^[[:space:]]*$ ]] && continue
    [[ "$line" =~ ^# ]] || break
    # shellcheck disable=SC2206  # an #SBATCH line is words, as sbatch splits it
    [[ "$line" =~ ^#SBATCH[[:space:]]+(.*)$ ]] && words+=(${BASH_REMATCH[1]%%#*})
  done <"$script"
  # sbatch's input variables stand between the script's lines and its options.
  [[ -n "${SBATCH_TIMELIMIT:-}" ]] && words+=("--time=$SBATCH_TIMELIMIT")
  [[ -n "${SBATCH_SIGNAL:-}" ]] && words+=("--signal=$SBATCH_SIGNAL")
  words+=("$@")
  for ((i = 0; i < ${#words[@]}; ++i)); do
    w=${words[i]}
    case "$w" in
      --nodes=*) nodes=${w#--nodes=} ;;
      --nodes | -N) nodes=${words[i + 1]:-}; ((++i)) ;;
      -N*) nodes=${w#-N} ;;
      --ntasks-per-node=*) per_node=${w#--ntasks-per-node=} ;;
      --ntasks-per-node) per_node=${words[i + 1]:-}; ((++i)) ;;
      --chdir=*) chdir=${w#--chdir=} ;;
      --chdir | -D) chdir=${words[i + 1]:-}; ((++i)) ;;
      -D*) chdir=${w#-D} ;;
      --time=*) time=${w#--time=} ;;
      --time | -t) time=${words[i + 1]:-}; ((++i)) ;;
      -t*) time=${w#-t} ;;
      --signal=*) signal=${w#--signal=} ;;
      --signal) signal=${words[i + 1]:-}; ((++i)) ;;
    esac
  done
  ST_SHAPE_NODES="" ST_SHAPE_PER_NODE="" ST_SHAPE_WHY=""
  ST_SHAPE_CHDIR=$chdir ST_SHAPE_TIME=$time ST_SHAPE_SIGNAL=$signal
  if [[ -z "$nodes" ]]; then
    nodes=1  # sbatch's default without --nodes (or --ntasks)
  fi
  if [[ "$nodes" =~ ^[0-9]+-[0-9]+$ ]]; then
    ST_SHAPE_WHY="--nodes=$nodes is a range (Slurm picks the count): the mesh is checked when the job starts"
  elif ! [[ "$nodes" =~ ^[0-9]+$ && "$nodes" -gt 0 ]]; then
    ST_SHAPE_WHY="--nodes=$nodes: not a positive node count; the mesh is checked when the job starts"
  elif [[ -z "$per_node" ]]; then
    ST_SHAPE_WHY="no --ntasks-per-node in $script or the sbatch options: the ranks per node are known when the job starts"
  elif ! [[ "$per_node" =~ ^[0-9]+$ && "$per_node" -gt 0 ]]; then
    ST_SHAPE_WHY="--ntasks-per-node=$per_node: not a positive task count"
  else
    ST_SHAPE_NODES=$nodes ST_SHAPE_PER_NODE=$per_node
  fi
}

# st_seconds TIME: a Slurm time (minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds) in seconds; nothing for no limit (UNLIMITED, INFINITE) or a
# form it does not know.
st_seconds() {
  local t=$1 d=0 p=()
  [[ "$t" =~ ^[0-9]+(-[0-9]+)?(:[0-9]+){0,2}$ ]] || return 0
  if [[ "$t" == *-* ]]; then
    d=${t%%-*} t=${t#*-}
    IFS=: read -r -a p <<<"$t"
    p+=(0 0)  # days-hours[:minutes[:seconds]]
    printf '%s\n' $((10#$d * 86400 + 10#${p[0]} * 3600 + 10#${p[1]} * 60 + 10#${p[2]}))
    return 0
  fi
  IFS=: read -r -a p <<<"$t"
  case ${#p[@]} in
    1) printf '%s\n' $((10#${p[0]} * 60)) ;;
    2) printf '%s\n' $((10#${p[0]} * 60 + 10#${p[1]})) ;;
    3) printf '%s\n' $((10#${p[0]} * 3600 + 10#${p[1]} * 60 + 10#${p[2]})) ;;
  esac
}

# st_check_time_limit TIME SIGNAL WHERE: a time limit (sbatch --time) longer than the warning before it
# (--signal=[B:]SIG@SECONDS, 60 s without @). At or below it the warning comes at every start, before a step
# is trained, and the job would stop and requeue itself again and again: refused, exit 3. Nothing is checked
# when either is unknown (empty, UNLIMITED). WHERE says where the values come from, for the message.
st_check_time_limit() {
  local limit lead=60
  limit=$(st_seconds "$1")
  [[ -n "$limit" && -n "$2" ]] || return 0
  ((limit == 0)) && return 0  # --time=0: no limit (Slurm's reading), so no warning before one
  [[ "$2" =~ @([0-9]+)$ ]] && lead=$((10#${BASH_REMATCH[1]}))
  ((limit > lead)) ||
    st_die 3 "--time=$1 ($limit s) is not longer than the warning --signal=$2 gives before it ($lead s; $3): the signal would come at every start, before a step is trained, and the job would requeue itself without end; give --time more than $lead s (and room for steps and a save), or a later warning"
}

# st_check_launch_settings SCRIPT: LAUNCHER and GPU_BIND name what st_launcher knows (empty: the script's default).
st_check_launch_settings() {
  case "${LAUNCHER:-}" in
    "" | srun | mpirun) ;;
    *) st_die 3 "LAUNCHER=$LAUNCHER: expected srun or mpirun (set at the top of $1 or in the environment)" ;;
  esac
  case "${GPU_BIND:-}" in
    "" | node | task) ;;
    *) st_die 3 "GPU_BIND=$GPU_BIND: expected node (every rank sees the node's GPUs) or task (one GPU per rank) (set at the top of $1 or in the environment)" ;;
  esac
}

# st_check_job_settings SCRIPT: every variable of a training script that takes a word from a list, checked
# before anything slow (submit.sh calls it before queueing, the job first thing): LAUNCHER, GPU_BIND,
# VERIFY_DATA and the restart settings. A typo found after the queue wait or a whole --verify-data read costs
# hours; found here, seconds.
st_check_job_settings() {
  st_check_launch_settings "$1"
  case "${VERIFY_DATA:-auto}" in
    auto | 1 | 0) ;;
    *) st_die 3 "VERIFY_DATA=$VERIFY_DATA: expected auto, 1 or 0 (set at the top of $1 or in the environment)" ;;
  esac
  st_check_restart_settings "$1"
}

# st_die_unless_stopped CODE MESSAGE: st_die, except when a stop signal reached the job (ST_STOP): a job-wide SIGTERM
# also ends the check's own command (plan, the probe's srun), whose failure is then the signal's, not a problem the
# check found. The job requeues itself without starting the ranks, as a stop during the preflight does.
st_die_unless_stopped() {
  if [[ -n "$ST_STOP" ]]; then
    st_log "SIG$ST_STOP cut the checks short: the job requeues itself without starting the ranks"
    mkdir -p "$RUN_DIR" 2>/dev/null || true
    st_requeue_preempted "$RUN_DIR" unlaunched
  fi
  st_die "$@"
}

# st_check_mesh BIN CONFIG STRATEGY SHARD_SIZE: `shardtrain plan` builds the mesh this allocation gives the
# configured strategy (offline, in a second) and prints what each rank will hold; a node count or shard size
# that does not fit (or a config plan cannot read) ends the job here, with plan's message, before any rank starts.
# TRAIN_ARGS go to plan as to train (a --data.global_batch_size there changes what fits: without them plan refused
# a batch the run's own overrides made fit, and the job ended after its queue wait). An option of TRAIN_ARGS that
# plan does not take (exit 2) leaves the verdict to `check`, which takes the run's whole command line.
st_check_mesh() {
  local bin=$1 config=$2 strategy=$3 shard_size=$4 args out rc=0
  args=(plan --config "$config" --nodes "$SLURM_JOB_NUM_NODES" --gpus-per-node "$ST_RANKS_PER_NODE")
  [[ -n "$strategy" ]] && args+=(--strategy "$strategy")
  [[ -n "$shard_size" ]] && args+=(--shard-size "$shard_size")
  # shellcheck disable=SC2206  # TRAIN_ARGS is a list of words on purpose
  args+=(${TRAIN_ARGS:-})
  out=$("$bin" "${args[@]}" 2>&1) || rc=$?
  if ((rc == 2)) && [[ -n "${TRAIN_ARGS:-}" ]]; then
    st_log "plan: not shown (it does not take TRAIN_ARGS as given: ${out##*$'\n'}); shardtrain check decides"
    return 0
  fi
  if ((rc != 0)); then
    # plan's one error line, without its log prefix ("[r0 12:00:00.000 E] ").
    out=$(printf '%s\n' "$out" | grep -m1 -iE 'error|expected' || printf '%s\n' "$out" | tail -n1)
    st_die_unless_stopped 3 "CONFIG=$config on this allocation ($SLURM_JOB_NUM_NODES nodes x $ST_RANKS_PER_NODE ranks): ${out#\[*\] }"
  fi
  printf '%s\n' "$out" | sed -n '/^config:/p;/^model:/p;/^per rank:/p;/^traffic/p;/^recommended/p' | while IFS= read -r line; do st_log "plan: $line"; done
}

# st_check_dir VAR: the directory exists (created if needed) and every node of the allocation can write it:
# checkpoints are written by every rank and read back after a requeue, possibly on other nodes, so it must
# live on a filesystem all nodes share.
st_check_dir() {
  local v=$1 dir=${!1} probe node missing=()
  mkdir -p "$dir" 2>/dev/null || st_die 8 "$v=$dir: cannot create the directory"
  [[ -w "$dir" ]] || st_die 8 "$v=$dir: the directory is not writable"
  dir=$(cd "$dir" && pwd)
  probe=".probe-$SLURM_JOB_ID"
  if ((SLURM_JOB_NUM_NODES > 1)); then
    # The path is an argument of bash -c, never part of its program: a quote in it (bob's run) is a character.
    # shellcheck disable=SC2016  # $1, $2 and SLURMD_NODENAME are the task's, on each node
    srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=0 --mpi=none \
      bash -c 'touch "$1/$2.$SLURMD_NODENAME"' st_check_dir "$dir" "$probe" 2>/dev/null || true
    for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
      [[ -e "$dir/$probe.$node" ]] || missing+=("$node")
      rm -f "$dir/$probe.$node"
    done
    ((${#missing[@]} == 0)) ||
      st_die_unless_stopped 8 "$v=$dir: node(s) ${missing[*]} cannot write there (it must be on a filesystem every node mounts)"
  else
    touch "$dir/$probe" 2>/dev/null || st_die 8 "$v=$dir: cannot write a file there"
    rm -f "$dir/$probe"
  fi
}

# ---- signals: a stop asked for at any moment of the job ------------------------------------------------
# SIGUSR1 (#SBATCH --signal=B:USR1@SECONDS before the time limit, or scancel --batch --signal=USR1) and SIGTERM
# (scancel, a preemption, the time limit itself) reach this shell at any moment, not only while the ranks
# train: st_catch_stop_signals, first thing in the job, sets the trap, and the job remembers the stop
# (ST_STOP). During the checks (the preflight's --verify-data reads the whole dataset: minutes) the check is
# stopped and the job requeues itself without starting the ranks (nothing to save). Once the launcher runs,
# the stop goes to it as SIGUSR1, which srun and mpirun forward to every rank: shardtrain then saves a
# checkpoint after the current step and exits with 75. (A SIGTERM passed on as SIGTERM would make mpirun kill
# the ranks before they save.) A signal that reached a launcher before its ranks existed was lost (the job
# trained on to its time limit), and one that reached a rank before it set its handler killed it; so while
# the ranks start, the stop is held until they are up, which they show by claiming the checkpoint directory
# (CHECKPOINT_DIR/.shardtrain.lock is rewritten after MPI_Init, which every rank enters with its handlers set)
# or by logging a step.
ST_STOP=""      # USR1 or TERM: the job was asked to stop; "" while not
ST_TRAPS=0      # signals caught so far (a wait that returns with a new count was cut short by one)
ST_CHILD=""     # the check running in the background, stopped on a signal
ST_LAUNCHING="" # 1 from the moment the job is committed to starting the ranks
ST_LAUNCHED=""  # the launcher's pid while it runs
ST_PASSED=0     # 1 once the stop went to ranks that are up

st_catch_stop_signals() {
  trap 'st_on_stop USR1' USR1
  trap 'st_on_stop TERM' TERM
}

st_on_stop() {
  ST_TRAPS=$((ST_TRAPS + 1))
  ST_STOP=$1
  if [[ -n "$ST_LAUNCHING" ]]; then
    if [[ -n "$ST_LAUNCHED" ]] && st_ranks_up; then
      st_log "SIG$1 received: asking the ranks to save a checkpoint and stop"
      kill -USR1 "$ST_LAUNCHED" 2>/dev/null
      ST_PASSED=1
    else
      st_log "SIG$1 received while the ranks start: it goes to them as soon as they are up (their signal handlers set)"
    fi
  elif [[ -n "$ST_CHILD" ]]; then
    st_log "SIG$1 received during the checks: stopping them; the job requeues itself without starting the ranks"
    kill -TERM "$ST_CHILD" 2>/dev/null
  else
    st_log "SIG$1 received before the ranks started: the job requeues itself without starting them"
  fi
}

# st_ranks_up: the launched run claimed its checkpoint directory (the lock file's text, host, pid and time, is
# new) or logged a step since the launch (st_launch records both before it starts the launcher).
st_ranks_up() {
  local lock metrics
  lock=$(cat "$CHECKPOINT_DIR/.shardtrain.lock" 2>/dev/null)
  [[ -n "$lock" && "$lock" != "$ST_LOCK_BEFORE" ]] && return 0
  metrics=$(stat -c %s "$(st_metrics_file "$RUN_DIR")" 2>/dev/null)
  [[ -n "$metrics" && "$metrics" != "$ST_METRICS_BEFORE" ]]
}

# st_wait_once PID: waits for a background command until it ends (returns 0, its exit status in
# ST_CHILD_STATUS) or a caught signal cuts the wait short while it still runs (returns 1). A wait a signal cut
# short returns > 128 without the command's status, which a second wait then collects; but a signal caught just
# before the wait began leaves that wait whole, and a second one would say 127 (no such child): its status stands.
st_wait_once() {
  local pid=$1 traps=$ST_TRAPS status again
  wait "$pid"
  status=$?
  if ((ST_TRAPS != traps)); then
    kill -0 "$pid" 2>/dev/null && return 1
    wait "$pid" 2>/dev/null
    again=$?
    ((again != 127)) && status=$again
  fi
  ST_CHILD_STATUS=$status
  return 0
}

# st_wait_child PID: waits for a background command through any number of caught signals; sets ST_CHILD_STATUS.
st_wait_child() {
  until st_wait_once "$1"; do :; done
}

# st_launch CMD...: runs the launcher (srun or mpirun) in the background and waits for it, passing a stop on
# as above; Slurm's requeue then runs this script again, with the same job id and so the same run directory,
# and --resume auto continues from that checkpoint. Sets ST_EXIT to the launcher's exit code.
st_launch() {
  ST_LOCK_BEFORE=$(cat "$CHECKPOINT_DIR/.shardtrain.lock" 2>/dev/null)
  ST_METRICS_BEFORE=$(stat -c %s "$(st_metrics_file "$RUN_DIR")" 2>/dev/null)
  "$@" &
  ST_LAUNCHED=$!
  while true; do
    if [[ -n "$ST_STOP" ]] && ((ST_PASSED == 0)) && kill -0 "$ST_LAUNCHED" 2>/dev/null; then
      if st_ranks_up; then
        st_log "the ranks are up: asking them to save a checkpoint and stop (SIG$ST_STOP)"
        kill -USR1 "$ST_LAUNCHED" 2>/dev/null
        ST_PASSED=1
      else
        sleep 0.2 &
        wait $!
        continue
      fi
    fi
    st_wait_once "$ST_LAUNCHED" && break  # otherwise a signal was caught (st_on_stop): look again
  done
  ST_EXIT=$ST_CHILD_STATUS
  ST_LAUNCHED=""
}

# st_result RUN_DIR: the status shardtrain wrote last into RUN_DIR/result.json ("finished", "preempted"), or
# nothing when it wrote none.
st_result() {
  sed -n 's/.*"status": *"\([a-z]*\)".*/\1/p' "$1/result.json" 2>/dev/null | head -n1
}

# st_result_field RUN_DIR FIELD: a number or string field of RUN_DIR/result.json ("step", "last_checkpoint",
# "resumed_from"); nothing when absent or null.
st_result_field() {
  sed -n -e "s/.*\"$2\": *\"\\([^\"]*\\)\".*/\\1/p" -e "s/.*\"$2\": *\\([0-9][0-9]*\\).*/\\1/p" "$1/result.json" 2>/dev/null | head -n1
}

# st_metrics_file RUN_DIR: the run's metrics file: logging.metrics_file as RUN_DIR/config.toml records it (relative to
# RUN_DIR unless absolute); RUN_DIR/metrics.jsonl, the default, before a run wrote config.toml. A run that named
# another file was read as having logged no step, and its restarts and requeues were refused as making no progress.
st_metrics_file() {
  local name
  name=$(sed -n 's/^metrics_file = "\(.*\)"$/\1/p' "$1/config.toml" 2>/dev/null | head -n1) || true  # none yet: the default
  name=${name:-metrics.jsonl}
  if [[ $name == /* ]]; then printf '%s\n' "$name"; else printf '%s\n' "$1/$name"; fi
}

# st_last_step RUN_DIR: the last training step the run's metrics file records (0 when none).
st_last_step() {
  local step
  step=$(tac "$(st_metrics_file "$1")" 2>/dev/null | grep -m1 '"kind": *"train"' | sed -n 's/.*"step": *\([0-9]*\).*/\1/p')
  printf '%s\n' "${step:-0}"
}

# st_logged_since_launch RUN_DIR: the run started by st_launch logged a training step (its metrics file grew by one).
st_logged_since_launch() {
  tail -c +$((${ST_METRICS_BEFORE:-0} + 1)) "$(st_metrics_file "$1")" 2>/dev/null | grep -q '"kind": *"train"'
}

# st_checkpoint_step NAME: the step of a checkpoint named step_N (0 for none).
st_checkpoint_step() {
  if [[ "$1" =~ ^step_0*([0-9]+)$ ]]; then printf '%s\n' "$((10#${BASH_REMATCH[1]:-0}))"; else printf '0\n'; fi
}

# st_complete_checkpoints DIR: the complete checkpoints in DIR (step_N with its DONE marker), oldest first.
st_complete_checkpoints() {
  local d
  for d in "$1"/step_*; do
    [[ "${d##*/}" =~ ^step_[0-9]+$ && -f "$d/DONE" ]] && printf '%s\n' "${d##*/}"
  done
  return 0
}

# st_shell_word WORD: WORD as one word for a POSIX shell (what shardtrain's shell_quoted writes): as it is when it holds
# only characters no shell splits, expands or globs, else in single quotes with each ' written '\''.
st_shell_word() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$1"
  else
    local q="'\\''"
    printf "'%s'" "${1//\'/$q}"
  fi
}

# st_resubmit_hint RUN_DIR: what a new job must be given to continue this run: its run directory (a job that
# takes the default, runs/<name>-<job id>, gets a new one), and the checkpoint directory when it is elsewhere, quoted
# for a shell when they need it (the hint is meant to be pasted: a space made two words of RUN_DIR there).
st_resubmit_hint() {
  local hint
  hint="RUN_DIR=$(st_shell_word "$1")"
  [[ -n "${CHECKPOINT_DIR:-}" && "$CHECKPOINT_DIR" != "$1/checkpoints" ]] && hint+=" CHECKPOINT_DIR=$(st_shell_word "$CHECKPOINT_DIR")"
  printf '%s\n' "$hint"
}

# st_run_dir_named: whether whoever submitted the job chose RUN_DIR (or CHECKPOINT_DIR) rather than taking the
# script's default, runs/<job name>-<job id>, or the fresh one jobs/slurm/submit.sh made (ST_RUN_DIR_GENERATED).
st_run_dir_named() {
  if [[ "$RUN_DIR" != "runs/${SLURM_JOB_NAME:-shardtrain}-${SLURM_JOB_ID:-0}" && "$RUN_DIR" != "${ST_RUN_DIR_GENERATED:-}" ]]; then
    return 0
  fi
  [[ "$CHECKPOINT_DIR" != "$RUN_DIR/checkpoints" ]]
}

# st_check_run_dir_owner: a job's first start never takes over checkpoints it was not pointed at. A run
# directory the job did not choose (the default runs/<name>-<job id>, which a reset Slurm's job ids reuse, or
# one submit.sh generated) that holds complete checkpoints belongs to another run: --resume auto would train
# on its weights and the rotation would delete its checkpoints; the job stops, exit 5, naming what continues
# that run. A directory the user named is a deliberate resubmission: it continues (the log says from which
# checkpoint). Requeues (SLURM_RESTART_COUNT > 0) continue their own. Sets ST_RESUME, the run's --resume
# option: --resume auto, except on the first start in a directory nobody named, where the trainer's own
# refusal of a fresh run beside complete checkpoints then holds too (and a config's checkpoint.resume).
st_check_run_dir_owner() {
  local found newest
  ST_RESUME=(--resume auto) ST_CONTINUES=""
  ((10#${SLURM_RESTART_COUNT:-0} > 0)) && return 0
  found=$(st_complete_checkpoints "$CHECKPOINT_DIR")
  newest=${found##*$'\n'}
  if st_run_dir_named; then
    ST_CONTINUES=$newest
    return 0
  fi
  ST_RESUME=()
  [[ -z "$found" ]] && return 0
  st_die 5 "RUN_DIR=$RUN_DIR holds the checkpoints of an earlier run ($CHECKPOINT_DIR/$newest, $(printf '%s\n' "$found" | wc -l) complete) and this job did not name that directory (it is the default, or one submit.sh made): it would train on another run's weights and rotate its checkpoints away. To continue that run, resubmit with $(st_resubmit_hint "$RUN_DIR"); to start a new one, give the job a RUN_DIR of its own"
}

# st_failure_field RUN_DIR FIELD: FIELD of every failure record the ranks left (RUN_DIR/failures/rank_N.json,
# one line of JSON each, written by shardtrain before it aborts), one value per line; suspect_nodes gives
# one node per line.
st_failure_field() {
  local f
  for f in "$1"/failures/rank_*.json; do
    [[ -f "$f" ]] || continue
    case "$2" in
      suspect_nodes) sed -n 's/.*"suspect_nodes":\[\([^]]*\)\].*/\1/p' "$f" | tr ',' '\n' | tr -d '"' | sed '/^$/d' ;;
      *) sed -n "s/.*\"$2\":\\([0-9a-z-]*\\).*/\\1/p" "$f" ;;
    esac
  done
}

# st_job_field FIELD: FIELD of this job as scontrol shows it (ExcNodeList, Partition), "" for (null).
st_job_field() {
  local v
  v=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n1)
  [[ "$v" == "(null)" ]] && v=""
  printf '%s\n' "$v"
}

# st_job_cancelled: the job is being cancelled (scancel): Slurm shows it COMPLETING (or already ended) while
# this script still runs, and `scontrol requeue` would put the cancelled job back in the queue. A job killed at
# its time limit shows COMPLETING too, with Reason=TimeLimit: that one may be requeued (a save the ranks made on
# the limit's SIGTERM continues). Sets ST_JOB_STATE to "JobState=..., Reason=..." for the message.
st_job_cancelled() {
  local state reason
  state=$(st_job_field JobState)
  reason=$(st_job_field Reason)
  ST_JOB_STATE="JobState=$state, Reason=$reason"
  [[ -n "$state" && "$state" != RUNNING && "$reason" != TimeLimit ]]
}

# st_check_restart_settings SCRIPT: RESTART_ON, MAX_RESTARTS and EXCLUDE_FAILED_NODES hold what
# st_restart_after_failure understands; a typo would otherwise turn restarts off without a word, hours later.
st_check_restart_settings() {
  local word
  for word in ${RESTART_ON-6 7 10 crash}; do
    [[ "$word" =~ ^([1-9]|10|crash)$ ]] ||
      st_die 3 "RESTART_ON=${RESTART_ON-}: '$word' is not an exit code from 1 to 10 or 'crash' (set at the top of $1 or in the environment of sbatch)"
  done
  # No leading zero: bash arithmetic reads 010 as octal 8, and 08 not at all.
  [[ "${MAX_RESTARTS:-3}" =~ ^(0|[1-9][0-9]{0,5})$ ]] ||
    st_die 3 "MAX_RESTARTS=$MAX_RESTARTS: expected a whole number, without leading zeros (0 = never restart after a failure)"
  [[ "${EXCLUDE_FAILED_NODES:-1}" =~ ^[01]$ ]] || st_die 3 "EXCLUDE_FAILED_NODES=$EXCLUDE_FAILED_NODES: expected 1 (leave out the node at fault) or 0"
}

# st_restart_after_failure RUN_DIR: a failed run that may succeed on a second try is requeued instead of
# ended: its exit code is one of RESTART_ON (default "6 7 10 crash": communication error, device error,
# collective timeout, a rank killed by a signal), no failure record of any rank says it is not restartable
# (out of memory fails the same way on any node, whatever another rank's record says), this job made fewer
# than MAX_RESTARTS (default 3) failure restarts before, and the run got past the step where its previous
# failure struck (a fault that strikes at the same step again is in the run, not the machine). A job being
# cancelled is never restarted. With EXCLUDE_FAILED_NODES=1 (the default)
# the nodes the records name (a GPU's device error, the ranks a collective timeout waited for) are left out
# of the requeued job (ExcNodeList), when the partition still has enough nodes without them. Each restart is
# a line of RUN_DIR/restarts.log. Returns 1 when the job is not to be restarted; otherwise the requeue ends
# this script.
st_restart_after_failure() {
  local run_dir=$1 class word wanted=0 f step at previous restarts=0 failures nodes=() excluded new partition total
  if ((ST_EXIT >= 1 && ST_EXIT <= 10)); then class=$ST_EXIT; else class=crash; fi
  # 126 and 127 are the shell's: the launcher could not be run (not found, not executable), which a restart repeats.
  if ((ST_EXIT == 126 || ST_EXIT == 127)); then
    st_log "not restarting: the launcher ($LAUNCHER) could not be run (exit $ST_EXIT: not found or not executable on this node)"
    return 1
  fi
  for word in ${RESTART_ON-6 7 10 crash}; do [[ "$word" == "$class" ]] && wanted=1; done
  ((wanted)) || return 1
  for f in "$run_dir"/failures/rank_*.json; do  # one record a restart would repeat is enough to stop
    if [[ -f "$f" ]] && grep -q '"restartable":false' "$f"; then
      st_log "not restarting: the ranks report a failure that a restart would repeat: $(sed -n 's/.*"message":"\(.*\)"}$/\1/p' "$f" | head -n1)"
      return 1
    fi
  done
  if st_job_cancelled; then
    st_log "not restarting: job $SLURM_JOB_ID is being cancelled ($ST_JOB_STATE)"
    return 1
  fi
  step=$(st_failure_field "$run_dir" step | sort -n | tail -n1)
  at="at step"
  if [[ -z "$step" || "$step" -lt 1 ]]; then  # no record (a crash): the step after the last this run logged
    if st_logged_since_launch "$run_dir"; then
      step=$(($(st_last_step "$run_dir") + 1))
    else  # it died starting up (a launcher or MPI fault): the step it would have begun with, not an earlier run's
      step=$(($(st_checkpoint_step "$(st_complete_checkpoints "${CHECKPOINT_DIR:-$run_dir/checkpoints}" | tail -n1)") + 1))
      at="before its first step, step"
    fi
  fi
  if [[ -f "$run_dir/restarts.log" ]]; then  # this job's failure lines (not its preemptions, exit=75): a run resubmitted by hand starts a fresh count
    failures=$(grep " job=$SLURM_JOB_ID " "$run_dir/restarts.log" | grep -v " exit=75 ")
    [[ -n "$failures" ]] && restarts=$(printf '%s\n' "$failures" | wc -l)
    previous=$(printf '%s\n' "$failures" | tail -n1 | sed -n 's/.* step=\([0-9]*\).*/\1/p')
  fi
  if ((restarts >= 10#${MAX_RESTARTS:-3})); then
    st_log "not restarting: job $SLURM_JOB_ID made $restarts restart(s) after failures already (MAX_RESTARTS=${MAX_RESTARTS:-3}); $run_dir/restarts.log lists them"
    return 1
  fi
  if [[ -n "${previous:-}" ]] && ((step <= previous)); then
    st_log "not restarting: the run failed $at $step, no further than the previous failure (step $previous): a fault that strikes at the same point again is not transient"
    return 1
  fi
  excluded=$(st_job_field ExcNodeList)
  if [[ "${EXCLUDE_FAILED_NODES:-1}" == 1 ]]; then
    mapfile -t nodes < <(st_failure_field "$run_dir" suspect_nodes | sort -u)
  fi
  new=""
  if ((${#nodes[@]} > 0)); then
    new=$(IFS=,; echo "${excluded:+$excluded,}${nodes[*]}")
    partition=$(st_job_field Partition)
    total=$(sinfo -h -p "${partition%%,*}" -o '%D' 2>/dev/null | awk '{ n += $1 } END { print n + 0 }')
    if (($(scontrol show hostnames "$new" 2>/dev/null | sort -u | wc -l) > total - SLURM_JOB_NUM_NODES)); then
      st_log "not leaving out ${nodes[*]}: partition ${partition:-?} has $total node(s), too few for $SLURM_JOB_NUM_NODES without them"
      new=""
    fi
  fi
  st_log "training failed with exit code $ST_EXIT $at $step (docs/exit-codes.md); restarting from the last checkpoint: restart $((restarts + 1)) of ${MAX_RESTARTS:-3} after a failure${new:+, leaving out node(s) ${nodes[*]}}"
  # The requeue sends SIGTERM to this script and everything it runs: ignored (and so ignored by the scontrol
  # below too, which inherits that), so that the exclusion is still made.
  trap '' TERM USR1
  if ! scontrol requeue "$SLURM_JOB_ID"; then
    st_die "$ST_EXIT" "scontrol requeue $SLURM_JOB_ID was refused (is the job requeueable? #SBATCH --requeue): resubmit with $(st_resubmit_hint "$run_dir") to resume from its last checkpoint"
  fi
  printf '%s job=%s restart=%s exit=%s step=%s excluded=%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$SLURM_JOB_ID" "${SLURM_RESTART_COUNT:-0}" \
    "$ST_EXIT" "$step" "${new:--}" >>"$run_dir/restarts.log"
  # Only a pending job's ExcNodeList can change: the requeue made it pending (it waits before it may start).
  if [[ -n "$new" ]] && ! scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$new"; then
    st_log "warning: could not leave out ${nodes[*]} (scontrol update ExcNodeList refused): the job may run there again"
  fi
  exit "$ST_EXIT"  # the job is back in the queue: this run of it is over
}

# st_requeue_preempted RUN_DIR [unlaunched]: the job stopped on a signal (75, or a stop that came before the
# ranks were started: unlaunched) and is requeued to continue, with three exceptions. A job being cancelled is
# not requeued (scontrol would requeue even a cancelled job): the log says what was saved and what continues
# the run. A start that trained no step (the signal came during its start-up)
# is requeued once; when the start after it trains none either, the job ends (exit 75) instead of requeueing
# itself without end. Each requeue is a line of RUN_DIR/restarts.log, exit=75, with the steps trained.
st_requeue_preempted() {
  local run_dir=$1 how=${2:-} step start=0 trained saved="" resumed last
  if [[ "$how" == unlaunched || "$how" == killed ]]; then
    step=$(st_complete_checkpoints "$CHECKPOINT_DIR" | tail -n1)
    step=${step#step_}
    step=$((10#${step:-0})) trained=0
    if [[ "$how" == killed ]]; then  # the run goes on from its last checkpoint; the steps after it are trained again
      last=$(st_last_step "$run_dir")
      saved=${CHECKPOINT_DIR%/}/$(st_complete_checkpoints "$CHECKPOINT_DIR" | tail -n1)
      ((step > 0)) || saved=""
      trained=$((last - step))
      st_log "the ranks stopped at step $last without a save: the run continues from ${saved:-its start} (step $step)"
    fi
  else
    step=$(st_result_field "$run_dir" step)
    [[ -n "$step" ]] || step=$(st_last_step "$run_dir")
    resumed=$(st_result_field "$run_dir" resumed_from)
    [[ "${resumed##*/}" =~ ^step_0*([0-9]+)$ ]] && start=${BASH_REMATCH[1]}
    saved=$(st_result_field "$run_dir" last_checkpoint)
    trained=$((step - start))
  fi
  if st_job_cancelled; then
    st_log "job $SLURM_JOB_ID is being cancelled ($ST_JOB_STATE), so it is not requeued: the run stopped at step $step${saved:+ and its checkpoint $saved is saved}; to continue it, resubmit with $(st_resubmit_hint "$run_dir")"
    exit 75
  fi
  if ((trained <= 0)); then
    last=$(grep " job=$SLURM_JOB_ID " "$run_dir/restarts.log" 2>/dev/null | tail -n1)
    if [[ "$last" == *" exit=75 "* && "$last" == *" trained=0" ]]; then
      st_die 75 "not requeueing job $SLURM_JOB_ID again: this start and the one before it were stopped before they trained a step (at step $step; a signal during the start-up each time: is --time well beyond the --signal warning, the start-up and a save?); nothing is lost: resubmit with $(st_resubmit_hint "$run_dir") to continue from step $step"
    fi
    st_log "stopped at step $step without training a step in this start (nothing new saved); requeueing job $SLURM_JOB_ID (restart $((${SLURM_RESTART_COUNT:-0} + 1))): a second start in a row that trains nothing ends the job"
  elif [[ "$how" == killed ]]; then
    st_log "requeueing job $SLURM_JOB_ID (restart $((${SLURM_RESTART_COUNT:-0} + 1))) to continue from step $step"
  else
    st_log "checkpoint saved at step $step${saved:+ ($saved)}; requeueing job $SLURM_JOB_ID (restart $((${SLURM_RESTART_COUNT:-0} + 1)))"
  fi
  trap '' TERM USR1  # the requeue sends SIGTERM: the line below is still written
  if ! scontrol requeue "$SLURM_JOB_ID"; then
    st_die 75 "scontrol requeue $SLURM_JOB_ID was refused (is the job requeueable? #SBATCH --requeue): resubmit with $(st_resubmit_hint "$run_dir") to continue from step $step"
  fi
  printf '%s job=%s restart=%s exit=75 step=%s excluded=- trained=%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$SLURM_JOB_ID" \
    "${SLURM_RESTART_COUNT:-0}" "$step" "$((trained > 0 ? trained : 0))" >>"$run_dir/restarts.log"
  exit 75  # the job is back in the queue: this run of it is over
}

# st_requeue_or_exit RUN_DIR: the job's ending, from ST_EXIT and the run's result.json. A launcher's exit
# status is not trusted alone: srun returns 0 when it could not start the ranks at all, so 0 counts only
# when the run says it finished; and mpirun returns 1 when it got SIGTERM itself (scancel, a preemption: Slurm
# signals every process of the job) though the ranks saved and exited 75, so a run whose result.json says
# "preempted" counts as 75 whatever the launcher says. 75 = the ranks saved a checkpoint and asked to be
# requeued (st_requeue_preempted). A failure a restart may cure is requeued too (st_restart_after_failure).
st_requeue_or_exit() {
  local result
  trap 'st_log "SIGUSR1 received after the ranks ended: nothing to pass on"' USR1
  trap 'st_log "SIGTERM received after the ranks ended: nothing to pass on"' TERM
  result=$(st_result "$1")
  if ((ST_EXIT != 0 && ST_EXIT != 75)) && [[ "$result" == preempted ]]; then
    st_log "the launcher exited with $ST_EXIT, but the ranks stopped on the signal and saved (result.json: preempted, step $(st_result_field "$1" step)): counted as 75"
    ST_EXIT=75
  fi
  if ((ST_EXIT == 0)) && [[ "$result" == preempted ]]; then ST_EXIT=75; fi
  # A stop reached the job but the run finished first (mpirun returns 1 when it got SIGTERM itself): it finished.
  if ((ST_EXIT != 0 && ST_EXIT != 75)) && [[ "$result" == finished && -n "$ST_STOP" ]]; then
    st_log "the launcher exited with $ST_EXIT after SIG$ST_STOP reached the job, but the run finished first (result.json: finished)"
    ST_EXIT=0
  fi
  # A stop reached the job and the launcher ended the ranks before they saved: srun ends its step (SIGKILL) on a
  # SIGTERM of its own, which a job-wide one (a preemption, scancel --full) sends it. That is a preemption, not a
  # failure: it was counted against MAX_RESTARTS and could stop the job ("no further than the previous failure").
  if ((ST_EXIT != 0 && ST_EXIT != 75)) && [[ "$result" != preempted && -n "$ST_STOP" ]]; then
    st_log "the launcher exited with $ST_EXIT after SIG$ST_STOP reached the job, before the ranks saved (srun ends its step when it gets SIGTERM itself): counted as a preemption, not a failure"
    st_requeue_preempted "$1" killed
  fi
  if ((ST_EXIT == 0)) && [[ "$result" != finished ]]; then
    st_die 1 "the launcher exited with 0 but the run did not finish (no \"finished\" in $1/result.json): see the launcher's messages above"
  fi
  if ((ST_EXIT != 0 && ST_EXIT != 75)); then
    st_restart_after_failure "$1"
  fi
  if ((ST_EXIT == 75)); then
    st_requeue_preempted "$1"
  fi
  if ((ST_EXIT == 0)); then
    st_log "training finished"
  else
    st_log "training ended with exit code $ST_EXIT (docs/exit-codes.md)"
  fi
  exit "$ST_EXIT"
}

# st_run_args: the run's command line after `train` (or `check`), from the variables the script set: CONFIG,
# RUN_DIR, CHECKPOINT_DIR, STRATEGY, SHARD_SIZE, TRAIN_ARGS, and ST_RESUME (st_check_run_dir_owner; --resume
# auto when unset). Sets the array ST_RUN_ARGS.
st_run_args() {
  ST_RUN_ARGS=(--config "$CONFIG" --ranks-per-node "${ST_RANKS_PER_NODE:-1}" --logging.run_dir "$RUN_DIR"
    --checkpoint.dir "$CHECKPOINT_DIR")
  if declare -p ST_RESUME >/dev/null 2>&1; then ST_RUN_ARGS+=("${ST_RESUME[@]}"); else ST_RUN_ARGS+=(--resume auto); fi
  [[ -n "${STRATEGY:-}" ]] && ST_RUN_ARGS+=(--fsdp.strategy "$STRATEGY")
  [[ -n "${SHARD_SIZE:-}" ]] && ST_RUN_ARGS+=(--fsdp.shard_size "$SHARD_SIZE")
  # shellcheck disable=SC2206  # TRAIN_ARGS is a list of words on purpose
  ST_RUN_ARGS+=(${TRAIN_ARGS:-})
}

# st_gpu_memory: what --gpu-memory check gets: GPU_MEMORY as given (80GiB, 80GB, 80), or with GPU_MEMORY=auto
# (the job's default) the smallest GPU of this node as nvidia-smi reports it; nothing without nvidia-smi or
# with GPU_MEMORY=0. Sets ST_GPU_MEMORY ("" = the memory is not checked).
st_gpu_memory() {
  ST_GPU_MEMORY=""
  case "${GPU_MEMORY:-auto}" in
    0) ;;
    auto)
      local mib
      if command -v nvidia-smi >/dev/null 2>&1 &&
        mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | sort -n | head -n1) &&
        [[ "$mib" =~ ^[0-9]+$ ]]; then
        ST_GPU_MEMORY=$(awk -v m="$mib" 'BEGIN { printf "%.3fGiB", m / 1024 }')
      fi
      ;;
    *) ST_GPU_MEMORY=$GPU_MEMORY ;;
  esac
}

# st_check_run CMD...: `shardtrain check` with the run's own command line (offline, seconds): the config,
# the mesh and batch of this allocation, the datasets, the checkpoint --resume auto would load, the output
# directories, what each GPU will hold against its memory (GPU_MEMORY, st_gpu_memory). Its report goes to
# the job's log. On a job's first start (not a requeue) it also reads every
# block of the data, so damage stops the job now rather than hours in: VERIFY_DATA=auto (the default),
# 1 (every start) or 0 (never; a large dataset on a slow file system). A problem ends the job with check's
# exit code, before any rank starts, and check's own words: a check's FAILED line, or (a usage error, which
# stops check before its report) its error line. It runs in the background, so that a stop signal (ST_STOP)
# ends it at once; the caller then requeues the job. Sets ST_CHECK_OUT to its report.
st_check_run() {
  local out rc verify=() memory=() report why
  st_gpu_memory
  [[ -n "$ST_GPU_MEMORY" ]] && memory=(--gpu-memory "$ST_GPU_MEMORY")
  case "${VERIFY_DATA:-auto}" in
    auto) ((10#${SLURM_RESTART_COUNT:-0} == 0)) && verify=(--verify-data) ;;
    1) verify=(--verify-data) ;;
    0) ;;
    *) st_die 3 "VERIFY_DATA=$VERIFY_DATA: expected auto, 1 or 0" ;;
  esac
  report=$(mktemp "${TMPDIR:-/tmp}/shardtrain-check.XXXXXX") || st_die 8 "cannot create a temporary file in ${TMPDIR:-/tmp} for the preflight's report"
  "$@" "${verify[@]}" "${memory[@]}" >"$report" 2>&1 &
  ST_CHILD=$!
  st_wait_child "$ST_CHILD"
  ST_CHILD=""
  rc=$ST_CHILD_STATUS
  out=$(<"$report")
  rm -f "$report"
  ST_CHECK_OUT=$out
  [[ -n "$ST_STOP" ]] && return 0  # stopped on a signal, not by a problem
  printf '%s\n' "$out" | sed -n 's/^  //p' | while IFS= read -r line; do st_log "check: $line"; done
  if ((rc != 0)); then
    why=$(printf '%s\n' "$out" | grep -m1 'FAILED: ' | sed 's/.*FAILED: //')
    if [[ -z "$why" ]]; then  # no report: check's first line of its own that is not the report's frame or help
      why=$(printf '%s\n' "$out" | sed -E 's/^\[[^]]*\] //' | grep -v -e '^Run with --help' -e '^check: ' -e '^  ' -e '^[[:space:]]*$' | head -n1)
      ((rc == 2)) && why+=" (check's command line is the run's: CONFIG, STRATEGY, SHARD_SIZE, TRAIN_ARGS, GPU_MEMORY)"
    fi
    st_die "$rc" "the preflight (shardtrain check) stopped the job: ${why:-check exited with $rc and said nothing (docs/exit-codes.md)}"
  fi
}

# st_setup BIN_VAR: the shardtrain binary, the job's identity, and what the log should show first.
st_setup() {
  SHARDTRAIN_HOME=${SHARDTRAIN_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}
  SHARDTRAIN_BIN=${SHARDTRAIN_BIN:-$SHARDTRAIN_HOME/build/bin/shardtrain}
  [[ -x "$SHARDTRAIN_BIN" ]] ||
    st_die 3 "SHARDTRAIN_BIN=$SHARDTRAIN_BIN: not an executable (build it with ./scripts/test.sh or cmake, or set SHARDTRAIN_BIN)"
  st_log "job $SLURM_JOB_ID (${SLURM_JOB_NAME:-}) on $SLURM_JOB_NUM_NODES node(s) [$SLURM_JOB_NODELIST], restart ${SLURM_RESTART_COUNT:-0}"
}

# st_launcher: how LAUNCHER (srun or mpirun) starts one rank per task of this allocation, its GPUs bound as
# GPU_BIND says (node, the default: every rank sees the node's GPUs and shardtrain takes the one at its local
# rank; task: each rank sees only its own, through srun --gpus-per-task=1 or, under mpirun, bind-gpu.sh).
# Either way shardtrain matches the ranks' GPUs by identity and uses NCCL when no two share one
# (docs/cluster.md, "GPU binding"). Sets the array ST_LAUNCH.
st_launcher() {
  case "$LAUNCHER" in
    # --kill-on-bad-exit: a rank that dies ends the whole step at once instead of leaving the others waiting.
    srun) ST_LAUNCH=(srun --mpi=pmix --kill-on-bad-exit=1 --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node="$ST_RANKS_PER_NODE") ;;
    # ppr:G:node keeps ranks node-major (ranks 0..G-1 on the first node), as the mesh expects.
    # odls_base_sigkill_timeout (SAVE_GRACE): a job-wide SIGTERM (a preemption, scancel --full) reaches mpirun too,
    # which ends the ranks itself: SIGCONT, then SIGTERM that many seconds later, then SIGKILL as many again. At
    # Open MPI's 1 s a save begun on the SIGTERM was cut off (no result.json: exit 1, the job failed). The default is
    # a third of Slurm's KillWait (10 s of its default 30; at least 1), so that both waits end before Slurm kills every
    # process itself; a longer save wants a longer KillWait (or GraceTime).
    mpirun)
      local grace=${SAVE_GRACE:-}
      if [[ -z "$grace" ]]; then
        grace=$(scontrol show config 2>/dev/null | sed -n 's/^KillWait *= *\([0-9][0-9]*\).*/\1/p')
        grace=$(((${grace:-30}) / 3))
        ((grace >= 1)) || grace=1
      fi
      [[ "$grace" =~ ^[0-9]+$ ]] || st_die 3 "SAVE_GRACE=$SAVE_GRACE: expected whole seconds"
      ST_LAUNCH=(mpirun -np "$SLURM_NTASKS" --map-by "ppr:$ST_RANKS_PER_NODE:node" --bind-to none
        --mca odls_base_sigkill_timeout "$grace")
      ;;
    *) st_die 3 "LAUNCHER=$LAUNCHER: expected srun or mpirun" ;;
  esac
  case "${GPU_BIND:-node}" in
    node) ;;
    task)
      if [[ "$LAUNCHER" == srun ]]; then
        ST_LAUNCH+=(--gpus-per-task=1)  # Slurm sets each task's CUDA_VISIBLE_DEVICES to its own GPU
      else
        ST_LAUNCH+=("$SHARDTRAIN_HOME/jobs/slurm/bind-gpu.sh")  # the same, per rank, from the node's list
      fi
      ;;
    *) st_die 3 "GPU_BIND=$GPU_BIND: expected node (every rank sees the node's GPUs) or task (one GPU per rank)" ;;
  esac
}

# st_train_job SCRIPT [--single-node]: the whole training job, from the variables the script set (CONFIG,
# RUN_DIR, CHECKPOINT_DIR, STRATEGY, SHARD_SIZE, TRAIN_ARGS, LAUNCHER): checks, then the launch, then
# requeue or exit.
st_train_job() {
  local script=$1 single=${2:-}
  st_catch_stop_signals  # first: a stop during the checks is a requeue, not a silent death
  st_require_slurm
  st_require_vars "$script" CONFIG RUN_DIR CHECKPOINT_DIR
  st_require_file CONFIG
  st_check_job_settings "$script"
  st_setup
  # The time limit against the warning before it, from the script's #SBATCH --signal line ($0 is the copy of
  # the script Slurm runs; a --signal given to sbatch on its command line is invisible here: submit.sh checks
  # that one).
  if [[ -f "$0" ]]; then
    st_sbatch_shape "$0"
    st_check_time_limit "$(st_job_field TimeLimit)" "$ST_SHAPE_SIGNAL" "the time limit as Slurm gives it, the warning from the #SBATCH --signal line of $script"
  fi
  st_ranks_per_node
  if [[ "$single" == --single-node ]] && ((SLURM_JOB_NUM_NODES != 1)); then
    st_die 3 "$script runs on one node, the allocation has $SLURM_JOB_NUM_NODES: use jobs/slurm/train-multi-node.sbatch"
  fi
  st_log "mesh: $SLURM_JOB_NUM_NODES node(s) x $ST_RANKS_PER_NODE ranks per node, strategy ${STRATEGY:-from $CONFIG}${SHARD_SIZE:+, shard size $SHARD_SIZE}"
  st_check_mesh "$SHARDTRAIN_BIN" "$CONFIG" "$STRATEGY" "$SHARD_SIZE"
  st_check_dir RUN_DIR
  st_check_dir CHECKPOINT_DIR
  [[ -n "$ST_STOP" ]] && st_requeue_preempted "$RUN_DIR" unlaunched
  st_check_run_dir_owner

  st_run_args
  st_check_run "$SHARDTRAIN_BIN" check "${ST_RUN_ARGS[@]}" --nodes "$SLURM_JOB_NUM_NODES" --gpus-per-node "$ST_RANKS_PER_NODE"
  [[ -n "$ST_STOP" ]] && st_requeue_preempted "$RUN_DIR" unlaunched
  if [[ -n "$ST_CONTINUES" ]]; then
    local from
    from=$(printf '%s\n' "$ST_CHECK_OUT" | sed -n 's/^  resume *ok: //p' | head -n1)
    st_log "RUN_DIR=$RUN_DIR was named for this job and holds checkpoints: its first start continues that run, from ${from:-$CHECKPOINT_DIR/$ST_CONTINUES}"
  fi

  local train
  train=("$SHARDTRAIN_BIN" train "${ST_RUN_ARGS[@]}" --logging.progress lines)
  st_launcher
  st_log "running: ${ST_LAUNCH[*]} ${train[*]}"
  rm -rf "$RUN_DIR/result.json" "$RUN_DIR/failures"  # written again by this run when it finishes, stops or fails
  [[ -n "$ST_STOP" ]] && st_requeue_preempted "$RUN_DIR" unlaunched
  ST_LAUNCHING=1  # from here a stop goes to the ranks once they are up
  st_launch "${ST_LAUNCH[@]}" "${train[@]}"
  ST_LAUNCHING=""
  st_requeue_or_exit "$RUN_DIR"
}
