#!/usr/bin/env python3
"""What `shardtrain train` reports, held to what happened, through the binary on 2 ranks:
- result.json that cannot be written (the run directory's file system refuses it) does not turn a finished run
  into an I/O error (exit 0), nor a preempted one into the end of its job (exit 75): one error line names it;
- result.json's max_steps is the run's length however it was set (schedule.max_tokens here), not the key's 0;
- output sent to a file or a pipe gets plain progress lines, not the terminal's bar (mpirun's pty), and the closing
  line's time is not "0s" for a short run, its tokens/s said to be the steps' own;
- after a resume, the progress line's time left counts the steps of this start (it said "eta 0s" for a run with
  seconds to go: elapsed time over the step number), and the start's first step has its line;
- a skipped step is said once for the job (rank 0), not once per rank;
- an earlier start's metrics line cut off part-way (a crash inside its write) is removed at the next start, so
  every line of metrics.jsonl parses as strict JSON (no NaN), the resumed steps' lines included, and the two
  starts' TensorBoard event files, read with a reader written here from the public TFRecord and protobuf formats,
  hold the same values;
- scripts/plot-metrics.sh leaves out, and names, a line that is not JSON instead of failing, draws in a run
  directory whose name holds a quote, and reads the file the run's logging.metrics_file names."""
import glob
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402
import tfrecord  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
st = args.shardtrain
tok, ds = clitest.prepare_dataset(args, clitest.corpus(args, "moby-dick"), work, 512, "moby-bpe512", 0.05)

BASE = ["--model.vocab_size", "512", "--model.hidden_size", "64", "--model.intermediate_size", "128",
        "--model.num_hidden_layers", "2", "--model.num_attention_heads", "4", "--model.num_key_value_heads", "2",
        "--data.seq_len", "64", "--data.global_batch_size", "8", "--schedule.warmup_steps", "2", "--schedule.eval_every", "0",
]


def train(name, *extra, fault=None, popen=False):
    env = dict(os.environ)
    env.pop("SHARDTRAIN_FAULT", None)
    if fault:
        env["SHARDTRAIN_FAULT"] = fault
    cmd = [args.mpiexec, "--oversubscribe", "-np", "2", st, "train", "--config", "configs/tiny-cpu.toml", "--data.path", ds,
           "--logging.run_dir", os.path.join(work, name), *BASE, *extra]
    if popen:
        return subprocess.Popen(cmd, cwd=args.source, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    return subprocess.run(cmd, cwd=args.source, env=env, capture_output=True, text=True, errors="replace", timeout=600)


def strict_json(text, what):
    """Python's json, refusing NaN and Infinity as a strict parser (jq, JavaScript's JSON.parse) does."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError as e:
        check(False, f"{what}: not strict JSON ({e}): {text[:200]!r}")
        return None


def metrics_lines(run_dir):
    out = []
    with open(os.path.join(run_dir, "metrics.jsonl"), errors="replace") as f:
        for n, line in enumerate(f, 1):
            out.append(strict_json(line, f"{run_dir}/metrics.jsonl line {n}"))
    return out


def protobuf_fields(data):
    """(field number, value) of a protobuf message: varints as ints, fixed64 and fixed32 as bytes, the rest as bytes."""
    at = 0

    def varint():
        nonlocal at
        v = shift = 0
        while True:
            b = data[at]
            at += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v
    while at < len(data):
        key = varint()
        wire = key & 7
        if wire == 0:
            yield key >> 3, varint()
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            yield key >> 3, data[at:at + n]
            at += n
        elif wire == 2:
            n = varint()
            yield key >> 3, data[at:at + n]
            at += n
        else:
            raise ValueError(f"wire type {wire}")


def read_event_file(path):
    """[(step, {tag: float})] of the summaries, after checking every frame (TFRecord: uint64 length, masked CRC of it,
    the Event, masked CRC of it) and that the first Event is the file version (tensorflow's event.proto: 1 wall_time,
    2 step, 3 file_version, 5 summary; summary.proto: 1 value, and in it 1 tag, 2 simple_value)."""
    out, first = [], True
    for at, body, problem in tfrecord.records(open(path, "rb").read()):
        check(problem is None, f"{path}: a bad frame at byte {at}: {problem}")
        if problem:
            break
        if first:
            fields = dict(protobuf_fields(body))
            check(fields.get(3) == b"brain.Event:2", f"{path}: the first event names the file version: {fields}")
        else:
            step, scalars = 0, {}
            for f, v in protobuf_fields(body):
                if f == 2:
                    step = v
                elif f == 5:
                    for vf, value in protobuf_fields(v):
                        if vf == 1:
                            parts = dict(protobuf_fields(value))
                            scalars[parts[1].decode()] = struct.unpack("<f", parts[2])[0]
            out.append((step, scalars))
        first = False
    return out


def seconds(duration):
    """format_duration's text back to seconds: 12s, 3m07s, 1h02m."""
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", duration)
    if not m:
        return None
    h, mi, s = (int(x) if x else 0 for x in m.groups())
    return 3600 * h + 60 * mi + s


def wait_for_lines(run_dir, n, p):
    metrics = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= n:
            return True
        time.sleep(0.02)
    return False


# 1. result.json refused by the file system: a directory of that name, made once the run is under way (rename(2)
# onto it fails with EISDIR, as a full disk fails the write). The run finished: exit 0, one error naming the file.
for name, stop in (("refused", False), ("refused-preempted", True)):
    run_dir = os.path.join(work, name)
    p = train(name, "--schedule.max_steps", "12", "--checkpoint.every_n_steps", "0", fault="slow_step:150", popen=True)
    started = wait_for_lines(run_dir, 1, p)
    check(started, f"{name}: no metrics line appeared")
    os.makedirs(os.path.join(run_dir, "result.json", "held"))
    if stop:
        os.kill(p.pid, signal.SIGUSR1)
    out = p.communicate(timeout=300)[0].decode(errors="replace")
    want = 75 if stop else 0
    check(p.returncode == want, f"{name}: exit code {p.returncode}, expected {want} (the training's own outcome): {out[-1500:]}")
    errors = [l for l in out.splitlines() if "result.json" in l and " E]" in l]
    check(len(errors) == 1 and ("stopped for a requeue" if stop else "finished") in errors[0],
          f"{name}: one error line naming result.json and how the run ended: {errors}")
    check(not os.path.exists(os.path.join(run_dir, "failures", "rank_0.json")), f"{name}: no failure record for a run that did not fail")
print("result.json refused: exit 0 for a finished run, 75 for a preempted one, one error line each")

# 2. result.json of a run whose length is set in tokens: max_steps is its steps (2048 tokens / 512 per step = 4).
# Its output goes to pipes (as `mpirun ... > train.log` sends it to a file) with logging.progress "auto": plain
# lines, not the bar (mpirun gives the ranks' stdout a pty of its own, and the bar was drawn into the log).
r = train("tokens", "--schedule.max_steps", "0", "--schedule.max_tokens", "2048", "--checkpoint.every_n_steps", "0")
check(r.returncode == 0, f"max_tokens run: {r.stderr[-1500:]}")
check("\r" not in r.stdout + r.stderr and "\033[" not in r.stdout + r.stderr and "] step 1/4 loss" in r.stderr,
      f"plain progress lines when the output is no terminal: stdout {r.stdout[-300:]!r}")
# The closing line: the loop's time to the hundredth (it said "in 0s"), and tokens/s over the steps' own time,
# said as such: 2048 tokens over the sum of metrics.jsonl's step_time_s.
done = re.search(r"train: done: 4 steps, 2048 tokens in (\d+\.\d\d)s, (\d+) tokens/s in the steps", r.stderr)
step_s = sum(l["step_time_s"] for l in metrics_lines(os.path.join(work, "tokens")) if l and l.get("kind") == "train")
check(done and float(done.group(1)) > 0 and abs(int(done.group(2)) - 2048 / step_s) <= 1 + 0.001 * 2048 / step_s,
      f"closing line against the steps' times ({2048 / step_s:.0f} tokens/s): {done.group(0) if done else r.stderr[-600:]}")
result = strict_json(open(os.path.join(work, "tokens", "result.json")).read(), "tokens/result.json") or {}
check(result.get("step") == 4 and result.get("max_steps") == 4, f"result.json of a 4-step max_tokens run: {result}")

# 3. A run stopped at step 4 with its last metrics line cut off part-way, resumed to step 40 at about 0.1 s a step,
# with step 6 non-finite on both ranks.
r = train("resumed", "--schedule.max_steps", "4", "--checkpoint.every_n_steps", "4")
check(r.returncode == 0, f"first start: {r.stderr[-1500:]}")
metrics = os.path.join(work, "resumed", "metrics.jsonl")
before = open(metrics).read()
with open(metrics, "a") as f:
    f.write('{"kind":"train","step":5,"epoch":0,"tokens":25')  # a line the crash cut off
r = train("resumed", "--schedule.max_steps", "40", "--checkpoint.every_n_steps", "0", "--resume", "auto",
          "--logging.log_every", "10", "--logging.progress", "lines", fault="slow_step:100;nan_grad:6")
check(r.returncode == 0, f"resumed start: {r.stderr[-1500:]}")
lines = metrics_lines(os.path.join(work, "resumed"))
check(open(metrics).read().startswith(before), "the first start's whole lines stay as they were")
steps = [l["step"] for l in lines if l and l.get("kind") == "train"]
check(steps == list(range(1, 41)), f"train lines of steps 1..40, the resumed step 5's included: {steps}")
skipped = [l for l in lines if l and l.get("kind") == "train" and l.get("step") == 6]
check(len(skipped) == 1 and skipped[0]["skipped"] and skipped[0]["grad_norm"] is None,
      f"step 6 skipped, its non-finite norm written as null: {skipped}")
check(any("cut off part-way" in l and "metrics.jsonl" in l for l in r.stderr.splitlines()), "the removed fragment is named in the log")
said = [l for l in r.stderr.splitlines() if "step 6 skipped" in l]
check(len(said) == 1 and said[0].startswith("[r0"), f"the skipped step is said once, by rank 0: {said}")
# Step 6 of 40 after 2 steps of this start: 34 steps left at >= 0.1 s each (slow_step), so at least 3 s.
eta = re.search(r"step 6/40 .* eta (\S+)", r.stderr)
left = seconds(eta.group(1)) if eta else None
check(left is not None and left >= 3, f"time left at step 6 of 40 after a resume at step 4: {eta.group(0) if eta else r.stderr[-800:]}")
# The two starts' event files, read with the reader above (no protobuf package), hold metrics.jsonl's train and eval
# lines in its order, each scalar its line's number as a float: step 6's null norm has no point.
events = []
for path in sorted(glob.glob(os.path.join(work, "resumed", "events.out.tfevents.*"))):
    events += read_event_file(path)
want = [(l["step"], {t: tfrecord.f32(v) for t, v in tfrecord.expected_scalars(l).items()})
        for l in lines if l and l.get("kind") in ("train", "eval")]
check(len(glob.glob(os.path.join(work, "resumed", "events.out.tfevents.*"))) == 2, "one event file per start")
check(events == want, f"event files against metrics.jsonl: {len(events)} events for {len(want)} lines; first difference "
      f"{next(((e, w) for e, w in zip(events, want) if e != w), None)}")
check(not any("train/grad_norm" in sc for st_, sc in events if st_ == 6) and any(st_ == 6 for st_, _ in events),
      "step 6 has an event, without a grad_norm point")

# Lines every 10 steps: the first step of this start (5) is shown too, and every skipped one.
shown = [int(x) for x in re.findall(r"\] step (\d+)/40 ", r.stderr)]
check(shown == [5, 6, 10, 20, 30, 40], f"progress lines of the resumed start: steps {shown}")
print(f"resumed: 40 train lines, all strict JSON; one skip line; time left at step 6: {eta.group(1) if eta else None}")

# 4. plot-metrics.sh on a file with a line that is not JSON (as older versions left after a crash), in a run
# directory whose name holds a quote (gnuplot's strings are single-quoted: it once failed there).
if shutil.which("gnuplot"):
    plots = os.path.join(work, "it's plots")
    os.makedirs(plots)
    with open(os.path.join(plots, "metrics.jsonl"), "w") as f:
        f.write(before + '{"kind":"train","step":5,"epo{"kind":"train","step":5}\n')
    plot = subprocess.run([os.path.join(args.source, "scripts/plot-metrics.sh"), plots], capture_output=True, text=True)
    check(plot.returncode == 0 and os.path.getsize(os.path.join(plots, "loss.png")) > 1000,
          f"plot-metrics.sh with a line that is not JSON: {plot.stderr}")
    bad = len(before.splitlines()) + 1
    check(f"left out 1 line(s) that are not JSON: line(s) {bad}" in plot.stderr, f"plot-metrics.sh names line {bad}: {plot.stderr}")
    # A run whose logging.metrics_file names another file (its config.toml says which): it looked for metrics.jsonl.
    named = os.path.join(work, "named")
    os.makedirs(named)
    with open(os.path.join(named, "config.toml"), "w") as f:
        f.write('[logging]\nmetrics_file = "train.jsonl"\n')
    with open(os.path.join(named, "train.jsonl"), "w") as f:
        f.write(before)
    plot = subprocess.run([os.path.join(args.source, "scripts/plot-metrics.sh"), named], capture_output=True, text=True)
    check(plot.returncode == 0 and os.path.getsize(os.path.join(named, "loss.png")) > 1000,
          f"plot-metrics.sh reads the run's logging.metrics_file: exit {plot.returncode}: {plot.stderr}")
else:
    print("gnuplot missing: plot-metrics.sh not checked (scripts/setup.sh installs gnuplot-nox)")

check.finish("all report checks passed")
