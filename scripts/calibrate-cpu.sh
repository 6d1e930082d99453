#!/usr/bin/env bash
# `shardtrain predict` against the CPU backend of this machine (docs/predict.md, "Calibration"): for 1, 2 and 4
# ranks, in one run, side by side:
#   1. the collectives of N ranks (`bench comm`, FULL_SHARD, host memory, MPI), three sessions, and per axis and
#      kind the median of their latencies and of their bus bandwidths (on 2 cores, one session's fits differ from
#      the next's by up to 3x: ranks share the cores, and where the scheduler puts them decides);
#   2. the real step (`bench step`, N ranks, median of 10 after 3 warm-up), with --ops-profile: each op call's time
#      inside those steps (rank 0's; the median over the steps of each step's mean per call), the caches and the other
#      ranks' load as the step has them; `bench ops` times each op alone and is up to 2x off on this machine;
#   3. the prediction from 1 and 2 (`predict --gpu cpu`),
# and a table of predicted against measured, with the load average before each step. Every raw output stays in the
# output folder.
#   scripts/calibrate-cpu.sh [OUT]       (default docs/predict-runs/<date>-cpu)
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$ROOT"
OUT="${1:-docs/predict-runs/$(date +%F)-cpu}"
CONFIG="${SHARDTRAIN_CALIBRATE_CONFIG:-configs/tiny-cpu.toml}"
BIN="$BUILD_DIR/bin/shardtrain"
[[ -x "$BIN" ]] || { echo "calibrate-cpu: $BIN not found: build first (scripts/test.sh or scripts/quickstart.sh)" >&2; exit 2; }
# The default config's dataset, as the quickstart prepares it (a fresh clone has none).
[[ -n "${SHARDTRAIN_CALIBRATE_CONFIG:-}" ]] || prepare_default_dataset "$BIN"
mkdir -p "$OUT"
cores=$(nproc)
table="$OUT/calibration.md"
{
  echo "# predict vs measured, CPU backend ($CONFIG, $(date -u +%FT%TZ), $(git rev-parse --short HEAD), $cores cores)"
  echo
  echo "| ranks | threads/rank | measured step (median) | predicted step | predicted / measured | exposed comm (predicted) |"
  echo "|---|---|---|---|---|---|"
} >"$table"
loads=()
for n in 1 2 4; do
  threads=$((cores / n)); ((threads >= 1)) || threads=1
  links=(--links h100-dgx)  # one rank: no collectives
  if ((n > 1)); then
    say "ranks $n: collectives (bench comm, three sessions)"
    for s in 1 2 3; do
      mpirun -np "$n" "$BIN" bench comm --strategy FULL_SHARD --memory host --comm-backend mpi --dtype f32 \
        --max-bytes 16MiB --json "$OUT/comm-np$n-$s.json" >"$OUT/comm-np$n-$s.txt" 2>&1
    done
    # The first session's file with each fit replaced by the median over the three (points: the first's).
    python3 - "$OUT/comm-np$n.json" "$OUT"/comm-np$n-{1,2,3}.json <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], [json.load(open(p)) for p in sys.argv[2:]]
merged = runs[0]
merged["sessions"] = sys.argv[2:]
for axis, kinds in merged["axes"].items():
    for kind, fit in kinds.items():
        if not isinstance(fit, dict):
            continue
        for key in ("latency_s", "busbw_bytes_per_s"):
            values = [r["axes"][axis][kind][key] for r in runs if r["axes"][axis][kind][key] is not None]
            if values:  # a host all-reduce of a few values has a latency only
                fit[key] = statistics.median(values)
json.dump(merged, open(out, "w"), indent=1)
PY
    links=(--links "$OUT/comm-np$n.json")
  fi
  say "ranks $n: the step and its op times (bench step --ops-profile)"
  loads+=("ranks $n: load average $(cut -d' ' -f1-3 /proc/loadavg) before the step")
  mpirun -np "$n" "$BIN" bench step --config "$CONFIG" --steps 10 --warmup 3 --json "$OUT/step-np$n.json" \
    --ops-profile "$OUT/stepprof-np$n.json" >"$OUT/step-np$n.txt" 2>&1
  say "ranks $n: the prediction"
  "$BIN" predict --config "$CONFIG" --gpu cpu --nodes 1 --gpus-per-node "$n" --cpu-threads "$threads" \
    --ops-profile "$OUT/stepprof-np$n.json" "${links[@]}" --json "$OUT/predict-np$n.json" >"$OUT/predict-np$n.txt" 2>&1
  python3 - "$OUT" "$n" "$threads" >>"$table" <<'PY'
import json, sys
out, n, threads = sys.argv[1], sys.argv[2], sys.argv[3]
measured = json.load(open(f"{out}/step-np{n}.json"))["step_time_median_s"]
p = json.load(open(f"{out}/predict-np{n}.json"))
print(f"| {n} | {threads} | {measured*1e3:.1f} ms | {p['step_s']*1e3:.1f} ms | {p['step_s']/measured:.3f} | "
      f"{p['exposed_comm_s']*1e3:.1f} ms |")
PY
done
{
  echo
  echo "Op times from \`bench step --ops-profile\` in the same run as the measured step (stepprof-npN.json)."
  for l in "${loads[@]}"; do echo "- $l"; done
} >>"$table"
cat "$table"
