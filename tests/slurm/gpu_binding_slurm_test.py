#!/usr/bin/env python3
"""Both GPU binding styles of jobs/slurm on a real Slurm (minislurm.py), with the CUDA-emulated binary
(SHARDTRAIN_CUDA=EMULATED: two emulated GPUs with UUIDs per machine, CUDA_VISIBLE_DEVICES honored as the CUDA
runtime does). Slurm allocates the nodes' GPU GRES and sets CUDA_VISIBLE_DEVICES as on a cluster:
1. srun --gpus-per-task=1 and mpirun through jobs/slurm/bind-gpu.sh give each rank one GPU (cuda:0, a different
   UUID each); plain srun shows every rank both and each takes its own: `shardtrain env` on an allocation.
2. train-single-node.sbatch, 2 tasks on 2 GPUs, in each style (GPU_BIND=node with mpirun, GPU_BIND=task with
   srun and with mpirun): the start line says "nccl: 2 ranks on this node, each on its own GPU", the job
   completes, and the three runs' losses are equal bit for bit.
3. 2 tasks on 1 GPU: MPI with host staging, the start line naming the ranks and the GPU they share; the same
   with TRAIN_ARGS --fsdp.comm_backend nccl fails at once with exit code 3 (FAILED 3:0, not requeued) and
   one error line naming them.
The daemons are stopped at the end, also when a check fails or the test is interrupted."""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, HERE)
import clitest  # noqa: E402
from minislurm import OPEN_MPI_ENV, MiniSlurm  # noqa: E402

args = clitest.parse_args()
if os.geteuid() != 0:
    print("SKIPPED: the test Slurm runs its daemons as root (as CI does); run as root to test jobs/slurm")
    sys.exit(77)
check = clitest.Checks()
work = clitest.fresh_workdir(args)
_, ds = clitest.prepare_dataset(args, clitest.corpus(args, "moby-dick"), work, 512, "moby-bpe512", 0.05)

TRAIN_ARGS = " ".join([
    "--data.path", ds, "--model.vocab_size", "512", "--model.hidden_size", "64", "--model.intermediate_size", "128",
    "--model.num_hidden_layers", "1", "--model.num_attention_heads", "4", "--model.num_key_value_heads", "2",
    "--data.seq_len", "16", "--data.global_batch_size", "4", "--schedule.max_steps", "3", "--schedule.warmup_steps", "1",
    "--schedule.eval_every", "0", "--checkpoint.every_n_steps", "0", "--logging.peak_flops", "1e12", "--logging.log_every", "1"])


def job_env(**extra):
    env = dict(os.environ)
    env.update(SHARDTRAIN_HOME=args.source, SHARDTRAIN_BIN=args.shardtrain, CONFIG="configs/tiny-cpu.toml",
               TRAIN_ARGS=TRAIN_ARGS, SHARDTRAIN_CUDA_EMULATOR_DEVICES="2", GPU_MEMORY="0")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(OPEN_MPI_ENV)  # two Slurm nodes on one machine (minislurm.py)
    env.update(extra)
    return env


def output(info):
    path = info.get("StdOut", "")
    return open(path, errors="replace").read() if os.path.exists(path) else f"(no output file {path})"


def losses(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    return [m["loss"] for m in map(json.loads, open(path)) if m.get("kind") == "train"]


single = os.path.join(args.source, "jobs", "slurm", "train-single-node.sbatch")
own = "collectives over nccl: 2 ranks on this node, each on its own GPU;"

with MiniSlurm(os.path.join(work, "slurm"), nodes=2, cpus=4, gpus=2) as slurm:
    # ---- 1. what each rank sees, as `shardtrain env` reports it on an allocation of 2 tasks x 2 GPUs
    views = {
        "srun --gpus-per-task=1": f"srun --mpi=pmix --gpus-per-task=1 {args.shardtrain} env --json",
        "mpirun bind-gpu.sh": f"mpirun -np 2 --bind-to none {args.source}/jobs/slurm/bind-gpu.sh {args.shardtrain} env --json",
        "srun (every GPU visible)": f"srun --mpi=pmix {args.shardtrain} env --json",
    }
    seen = {}
    for label, command in views.items():
        p = subprocess.run(["salloc", "--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=2", "--cpus-per-task=1",
                            "bash", "-c", command], env=dict(job_env(), SLURM_CONF=slurm.conf), capture_output=True,
                           text=True, timeout=180)
        try:
            j = json.loads(p.stdout)
        except ValueError:
            check(False, f"{label}: no JSON from env (exit {p.returncode}): {p.stdout[-300:]} {p.stderr[-600:]}")
            continue
        seen[label] = [(r["device_index"], r["gpu_uuid"]) for r in j["ranks"]]
        check(j["comm_backend"] == "nccl" and j["comm_backend_reason"] == "2 ranks on this node, each on its own GPU",
              f"{label}: backend {j['comm_backend']}: {j['comm_backend_reason']}")
    uuids = [u for _, u in seen.get("srun (every GPU visible)", [])]
    check(seen.get("srun (every GPU visible)", [(0, "")])[0][0] == 0 and len(set(uuids)) == 2
          and [i for i, _ in seen["srun (every GPU visible)"]] == [0, 1], f"every GPU visible: cuda:0 and cuda:1: {seen}")
    for label in ("srun --gpus-per-task=1", "mpirun bind-gpu.sh"):
        check(seen.get(label) == [(0, uuids[0] if uuids else None), (0, uuids[1] if len(uuids) > 1 else None)],
              f"{label}: each rank sees one GPU (cuda:0), rank r's is GPU r: {seen.get(label)}")

    # ---- 2. and 3. the training script in each style
    def submit(name, gpus, **extra):
        opts = [f"--job-name={name}", "--nodes=1", "--ntasks-per-node=2", f"--gpus-per-node={gpus}", "--cpus-per-task=1",
                "--time=15", f"--output={work}/%x-%j.out", f"--chdir={args.source}"]
        return slurm.sbatch([*opts, single], job_env(RUN_DIR=os.path.join(work, name), **extra))

    runs = {
        "node-mpirun": (submit("node-mpirun", 2, GPU_BIND="node", LAUNCHER="mpirun"), "running: mpirun"),
        "task-srun": (submit("task-srun", 2, GPU_BIND="task", LAUNCHER="srun"), "--gpus-per-task=1 "),
        "task-mpirun": (submit("task-mpirun", 2, GPU_BIND="task", LAUNCHER="mpirun"), "jobs/slurm/bind-gpu.sh "),
    }
    shared_job = submit("shared", 1, GPU_BIND="node", LAUNCHER="mpirun")
    refused_job = submit("refused", 1, GPU_BIND="node", LAUNCHER="mpirun", TRAIN_ARGS=TRAIN_ARGS + " --fsdp.comm_backend nccl")

    own_losses = {}
    for name, (job, launched) in runs.items():
        info = slurm.wait(job, timeout=300)
        out = output(info)
        check(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0",
              f"{name}: {info.get('JobState')} {info.get('ExitCode')}: {out[-1500:]}\n{slurm.logs_tail(8)}")
        check(launched in out, f"{name}: launched with '{launched}': {[l for l in out.splitlines() if 'running:' in l]}")
        check(own in out, f"{name}: the start line says '{own}': {[l for l in out.splitlines() if 'collectives' in l]}")
        own_losses[name] = losses(os.path.join(work, name))
    first = own_losses.get("node-mpirun")
    check(first and len(first) == 3 and all(v == first for v in own_losses.values()),
          f"the three bindings train the same losses, bit for bit: {own_losses}")

    info = slurm.wait(shared_job, timeout=300)
    out = output(info)
    check(info.get("JobState") == "COMPLETED",
          f"shared: {info.get('JobState')} {info.get('ExitCode')}: {out[-1500:]}\n{slurm.logs_tail(8)}")
    said = [l for l in out.splitlines() if "collectives over mpi (host staging): ranks 0 and 1 share GPU-" in l]
    # Slurm gives the job either GPU of the node: its UUID and bus id name it.
    check(len(said) == 1 and re.search(r"share GPU-[0-9a-f-]{36} \(0000:1[01]:00\.0\);", said[0]) is not None,
          f"shared: the start line names the ranks and the GPU: {said}")

    info = slurm.wait(refused_job, timeout=300)
    out = output(info)
    check(info.get("JobState") == "FAILED" and info.get("ExitCode") == "3:0" and info.get("Restarts") == "0",
          f"refused: {info.get('JobState')} {info.get('ExitCode')} restarts {info.get('Restarts')}, expected FAILED 3:0 "
          f"without a restart: {out[-1500:]}\n{slurm.logs_tail(8)}")
    lines = [l for l in out.splitlines() if "configuration error: comm backend nccl" in l]
    check(len(lines) == 1 and "ranks 0 and 1 share GPU-" in lines[0] and "NCCL needs a GPU of its own for each rank" in lines[0],
          f"refused: one error line naming the ranks and the GPU: {lines or out[-1500:]}")

check.finish("both GPU binding styles of jobs/slurm checked on Slurm")
