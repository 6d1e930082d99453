#!/usr/bin/env bash
# Draws a training run's loss and throughput curves from RUN/metrics.jsonl (or the run's logging.metrics_file; docs/training.md) with
# gnuplot: RUN/loss.png (training loss per step, validation loss at each evaluation, and each source's
# with a data mixture) and
# RUN/throughput.png (tokens/s and MFU per step).
#   scripts/plot-metrics.sh runs/tiny-cpu-20260101-120000
set -euo pipefail

run="${1:?usage: scripts/plot-metrics.sh RUN_DIR}"
# logging.metrics_file as the run's config.toml records it, metrics.jsonl by default: the job scripts' own lookup.
source "$(dirname "${BASH_SOURCE[0]}")/../jobs/slurm/lib.sh"
metrics=$(st_metrics_file "$run")
[[ -f "$metrics" ]] || { echo "plot-metrics: $metrics not found" >&2; exit 1; }
command -v gnuplot >/dev/null 2>&1 || { echo "plot-metrics: gnuplot not found (apt-get install gnuplot-nox; scripts/setup.sh installs it)" >&2; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "plot-metrics: python3 not found" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# JSON lines -> whitespace columns gnuplot reads (skipped steps have a null loss: left out). When the steps go
# back (a rollback after a divergence, or a resume from an older checkpoint into the same run directory), the
# points of the abandoned stretch are dropped: the curves show the run the weights come from.
python3 - "$metrics" "$tmp" <<'PY'
import json, sys
src, out = sys.argv[1], sys.argv[2]
train, evals, last, bad = [], [], 0, []
with open(src, errors="replace") as f:
    for number, line in enumerate(f, 1):
        line = line.strip()
        if not line:
            continue
        # A line that is not JSON (a line a crash cut off, joined to the next start's first line by an older
        # shardtrain, or an edit by hand) is left out and named, not the end of the plots.
        try:
            j = json.loads(line)
        except ValueError:
            bad.append(number)
            continue
        if not isinstance(j, dict) or j.get("kind") not in ("train", "eval"):
            continue
        if j["kind"] == "train" and j["step"] <= last:
            train = [t for t in train if t["step"] < j["step"]]
            evals = [e for e in evals if e["step"] < j["step"]]
        last = j["step"] if j["kind"] == "train" else last
        (train if j["kind"] == "train" else evals).append(j)
if bad:
    print(f"plot-metrics: {src}: left out {len(bad)} line(s) that are not JSON: line(s) {', '.join(map(str, bad[:10]))}"
          f"{' ...' if len(bad) > 10 else ''}", file=sys.stderr)
with open(out + "/train.dat", "w") as t:
    for j in train:
        if j.get("loss") is not None:
            t.write(f'{j["step"]} {j["loss"]} {j["tokens_per_s"]} {100 * j["mfu"]} {j["lr"]}\n')
with open(out + "/eval.dat", "w") as e:
    for j in evals:
        if j.get("val_loss") is None:
            continue
        e.write(f'{j["step"]} {j["val_loss"]}\n')
        # A data mixture: one file per source, source-N.dat, and its name in source-N.name.
        for k, (path, loss) in enumerate(j.get("val_loss_by_source", {}).items()):
            if loss is None:
                continue
            with open(f"{out}/source-{k}.dat", "a") as s:
                s.write(f'{j["step"]} {loss}\n')
            with open(f"{out}/source-{k}.name", "w") as n:
                n.write(path.rsplit("/", 1)[-1].removesuffix(".h5"))
PY
[[ -s "$tmp/train.dat" ]] || { echo "plot-metrics: no training steps in $metrics" >&2; exit 1; }

# gnuplot's single-quoted strings: a quote inside is written twice (a run directory "it's-run" broke the script).
gq() { local text=$1; printf '%s' "${text//\'/\'\'}"; }
out="$(gq "$run")"
eval_plot=""
if [[ -s "$tmp/eval.dat" ]]; then
  eval_plot=", '$tmp/eval.dat' using 1:2 with linespoints lw 2 pt 7 title 'validation loss'"
fi
for dat in "$tmp"/source-*.dat; do
  [[ -s "$dat" ]] || continue
  eval_plot+=", '$dat' using 1:2 with linespoints lw 1 pt 6 title 'validation: $(gq "$(cat "${dat%.dat}.name")")'"
done
gnuplot <<GP
set terminal pngcairo size 1000,600 noenhanced
set grid
set xlabel 'step'
set output '$out/loss.png'
set title 'loss: $out'
set ylabel 'cross-entropy (nats/token)'
plot '$tmp/train.dat' using 1:2 with lines lw 2 title 'training loss'$eval_plot
set output '$out/throughput.png'
set title 'throughput: $out'
set ylabel 'tokens/s'
set y2label 'MFU (%)'
set ytics nomirror
set y2tics
plot '$tmp/train.dat' using 1:3 with lines lw 2 title 'tokens/s', '' using 1:4 axes x1y2 with lines lw 2 title 'MFU (%)'
GP
echo "plot-metrics: wrote $run/loss.png and $run/throughput.png"
