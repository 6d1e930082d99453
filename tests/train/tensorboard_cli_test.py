#!/usr/bin/env python3
"""TensorBoard event files of `shardtrain train`, read back with a decoder independent of the writer's code:
the Event and Summary message classes are built at run time from TensorFlow's public field numbers
(descriptor_pb2, Python's protobuf package) and every record's CRC-32C is computed here, from the published
algorithm (Castagnoli polynomial, reflected), not with the library shardtrain links. On 2 ranks, a data
mixture (a validation loss per source) with one non-finite step: one event file in the run directory (rank 0
only), the file version first, then one Event per train and eval line of metrics.jsonl whose scalars are that
line's numbers, as floats. logging.tensorboard = false writes none; a preempted run's file holds every
record metrics.jsonl holds, and resumed in the same directory it adds a second file that continues it."""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

try:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
except ImportError:
    print(f"FAIL: {sys.executable} has no protobuf package: run ./scripts/setup.sh (it installs python3-protobuf)", file=sys.stderr)
    sys.exit(1)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402
import tfrecord  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
st = args.shardtrain


# CRC-32C: reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF; TFRecord masks it.
def event_class():
    """tensorflow/core/util/event.proto's Event and framework/summary.proto's Summary, by field number."""
    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="tensorboard_cli_test_event.proto", package="tbtest", syntax="proto3")
    summary = f.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.oneof_decl.add(name="value")
    value.field.add(name="node_name", number=7, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL, oneof_index=0)
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED, type_name=".tbtest.Summary.Value")
    event = f.message_type.add(name="Event")
    event.oneof_decl.add(name="what")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".tbtest.Summary",
                    oneof_index=0)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    desc = pool.FindMessageTypeByName("tbtest.Event")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf 4.x
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


Event = event_class()


def read_events(path):
    """Every Event of a file; a bad length, CRC or torn record is a failure."""
    events = []
    for at, body, problem in tfrecord.records(open(path, "rb").read()):
        if problem:
            check(False, f"{path}: {problem} at byte {at}")
            break
        e = Event()
        e.ParseFromString(body)
        # Nothing outside the public fields, and the canonical encoding: it serializes back to the same bytes.
        check(e.SerializeToString(deterministic=True) == body, f"{path}: record at byte {at} holds fields this decoder does not know")
        events.append(e)
    return events


def compare(run_dir, started, ended, files_expected=1):
    """The run's event files (rank 0's: one per process start) against its metrics.jsonl, in file-name order;
    returns the train lines' steps."""
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    check(len(files) == files_expected, f"{run_dir}: {files_expected} event file(s), found {files}")
    scalars = []
    for path in files:
        name = os.path.basename(path).split(".")
        check(len(name) >= 5 and name[3].isdigit() and started - 2 <= int(name[3]) <= ended, f"events.out.tfevents.<time>.<host>: {path}")
        events = read_events(path)
        check(events and events[0].WhichOneof("what") == "file_version" and events[0].file_version == "brain.Event:2",
              f"{path}: the first event names the file version")
        check(all(e.WhichOneof("what") == "summary" for e in events[1:]), f"{path}: summaries after the file version")
        scalars += [(path, e) for e in events[1:]]
    lines = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    lines = [l for l in lines if l["kind"] in ("train", "eval")]
    check(len(scalars) == len(lines), f"{run_dir}: {len(scalars)} summary events for {len(lines)} train and eval lines")
    for (path, e), line in zip(scalars, lines):
        what = f"{path}: the {line['kind']} line of step {line['step']}"
        check(e.step == line["step"], f"{what}: event step {e.step}")
        check(started - 2 <= e.wall_time <= ended, f"{what}: wall time {e.wall_time} outside the run")
        got = {v.tag: v.simple_value for v in e.summary.value}
        check(len(got) == len(e.summary.value), f"{what}: a tag twice")
        want = {tag: tfrecord.f32(x) for tag, x in tfrecord.expected_scalars(line).items()}
        check(got == want, f"{what}: scalars {got}, expected {want}")
    return [l["step"] for l in lines if l["kind"] == "train"]


moby = clitest.corpus(args, "moby-dick")
tok, ds = clitest.prepare_dataset(args, moby, work, 512, "moby-bpe512", 0.05)
speeches = os.path.join(work, "speeches")
os.makedirs(speeches)
for name in sorted(os.listdir(clitest.corpus(args, "sotu")))[::30]:
    shutil.copy(os.path.join(clitest.corpus(args, "sotu"), name), speeches)
sotu_ds = os.path.join(work, "sotu-bpe512.h5")
subprocess.run([st, "prepare-data", "-t", tok, "-i", speeches, "-o", sotu_ds, "--validation-fraction", "0.2", "--log-level", "warn"],
               check=True)

BASE = ["--model.vocab_size", "512", "--model.hidden_size", "64", "--model.intermediate_size", "128",
        "--model.num_hidden_layers", "2", "--model.num_attention_heads", "4", "--model.num_key_value_heads", "2",
        "--data.seq_len", "64", "--data.global_batch_size", "8", "--schedule.warmup_steps", "2",
        "--logging.progress", "lines", "--logging.peak_flops", "1e10", "--checkpoint.every_n_steps", "0"]


def train(name, *extra, env_extra=None, popen=False):
    env = dict(os.environ)
    env.update(env_extra or {})
    cmd = [args.mpiexec, "--oversubscribe", "-np", "2", st, "train", "--config", "configs/tiny-cpu.toml", "--data.path", ds,
           "--logging.run_dir", os.path.join(work, name), *BASE, *extra]
    if popen:
        return subprocess.Popen(cmd, cwd=args.source, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    return subprocess.run(cmd, cwd=args.source, env=env, capture_output=True, text=True, timeout=600)


# A mixture, an evaluation every 4 steps, step 3's gradient non-finite (skipped; its grad_norm is null, so
# no scalar for it).
started = time.time()
r = train("mix", "--data.mixture", f"{ds}:0.7,{sotu_ds}:0.3", "--schedule.max_steps", "8", "--schedule.eval_every", "4",
          env_extra={"SHARDTRAIN_FAULT": "nan_grad:3"})
ended = time.time() + 1
check(r.returncode == 0, f"mixture run: {r.stderr[-2000:]}")
steps = compare(os.path.join(work, "mix"), started, ended)
check(steps == list(range(1, 9)), f"train events for steps {steps}")
files = glob.glob(os.path.join(work, "mix", "events.out.tfevents.*"))
if files:
    events = read_events(files[0])
    tags = set(v.tag for e in events[1:] for v in e.summary.value)
    for tag in ["train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/mfu", "train/peak_mem_bytes",
                "train/rss_peak_bytes", "train/comm_bytes/shard", "train/comm_bytes/replicate", "train/comm_bytes/world",
                "eval/val_loss", f"eval/val_loss_by_source/{ds}", f"eval/val_loss_by_source/{sotu_ds}"]:
        check(tag in tags, f"tag {tag} written")
    step3 = [e for e in events[1:] if e.step == 3]
    check(step3 and "train/grad_norm" not in {v.tag for v in step3[0].summary.value}, "a NaN grad norm (null in metrics.jsonl) has no scalar")
    evals = [e.step for e in events[1:] if any(v.tag == "eval/val_loss" for v in e.summary.value)]
    check(evals == [4, 8], f"validation events at steps {evals}")
    print(f"mix: {len(events)} events, {len(tags)} tags, all CRCs and values checked")

# Off.
r = train("off", "--schedule.max_steps", "3", "--logging.tensorboard", "false")
check(r.returncode == 0 and os.path.exists(os.path.join(work, "off", "metrics.jsonl")), f"run without TensorBoard: {r.stderr[-1500:]}")
check(not glob.glob(os.path.join(work, "off", "events.out.tfevents.*")), "logging.tensorboard = false writes no event file")

# Preemption (SIGUSR1, what Slurm sends before a time limit): the job saves and exits with 75; its event file
# holds every record metrics.jsonl holds, the last step's included.
started = time.time()
p = train("preempted", "--schedule.max_steps", "40", "--schedule.eval_every", "0", "--checkpoint.dir", os.path.join(work, "preempted", "ckpt"),
          popen=True)
metrics = os.path.join(work, "preempted", "metrics.jsonl")
deadline = time.time() + 120
while time.time() < deadline and (not os.path.exists(metrics) or sum(1 for _ in open(metrics)) < 3):
    time.sleep(0.02)
os.kill(p.pid, signal.SIGUSR1)
out = p.communicate(timeout=300)[0].decode(errors="replace")
ended = time.time() + 1
check(p.returncode == 75, f"preempted run: exit code {p.returncode}, expected 75: {out[-1500:]}")
steps = compare(os.path.join(work, "preempted"), started, ended)
check(3 <= len(steps) < 40 and steps == list(range(1, len(steps) + 1)), f"preempted run's train events: steps {steps}")
print(f"preempted at step {steps[-1] if steps else None}: every metrics line has its event")

# Resumed in the same run directory: a second file, and the two together hold metrics.jsonl's lines, the
# resumed steps' included.
time.sleep(1.1)  # another second: its own file name without the ".N" suffix
r = train("preempted", "--schedule.max_steps", "40", "--schedule.eval_every", "0", "--checkpoint.dir", os.path.join(work, "preempted", "ckpt"),
          "--resume", "auto")
ended = time.time() + 1
check(r.returncode == 0, f"resumed run: {r.stderr[-1500:]}")
steps = compare(os.path.join(work, "preempted"), started, ended, files_expected=2)
check(steps == list(range(1, 41)), f"preempted and resumed run's train events: steps {steps}")

# A run directory that fills up (a 16 KiB tmpfs, mounted as root; skipped where that is not allowed): metrics.jsonl
# drops lines whole, and the event file holds no step metrics.jsonl lacks (it went on writing steps metrics.jsonl had
# dropped, and took the room metrics.jsonl needed to write again).
small = os.path.join(work, "small-run-dir")
os.makedirs(small)
if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", small], capture_output=True).returncode == 0:
    try:
        r = train("small-run-dir/run", "--schedule.max_steps", "24", "--schedule.eval_every", "12",
                  "--checkpoint.dir", os.path.join(work, "small-ckpt"))
        run = os.path.join(small, "run")
        lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
        logged = {(l["kind"], l["step"]) for l in lines if l["kind"] in ("train", "eval")}
        events = [e for path in sorted(glob.glob(os.path.join(run, "events.out.tfevents.*"))) for e in read_events(path)[1:]]
        in_events = {("eval" if any(v.tag.startswith("eval/") for v in e.summary.value) else "train", e.step) for e in events}
        check(r.returncode == 0 and "a metrics line could not be written" in r.stderr and len(logged) < 26
              and in_events <= logged, f"a full run directory: exit {r.returncode}, events not in metrics.jsonl "
              f"{sorted(in_events - logged)}: {r.stderr[-1200:]}")
    finally:
        subprocess.run(["umount", small])
else:
    print("a full run directory: not checked (mounting a tmpfs needs root)")

check.finish("tensorboard_cli_test: all checks passed")
