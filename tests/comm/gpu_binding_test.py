#!/usr/bin/env python3
"""GPU binding by identity, on the CUDA emulator (SHARDTRAIN_CUDA=EMULATED; docs/gpu.md): 4 ranks as 2 simulated
nodes of 2 on one machine whose emulated GPUs have UUIDs and PCI bus ids, bound as launchers bind them:
- every rank sees every GPU and takes the one at its place on the machine -> NCCL;
- every rank sees exactly one GPU through CUDA_VISIBLE_DEVICES set per rank by jobs/slurm/bind-gpu.sh (srun
  --gpus-per-task=1 does the same), each a different one, named by index or by UUID -> NCCL, although every
  rank's GPU is cuda:0;
- two ranks see the same single GPU -> MPI with host staging, the start line naming the ranks and the GPU;
- every GPU visible but fewer GPUs than ranks on the machine (two simulated nodes, one machine) -> MPI;
- comm_backend = "nccl" on a shared GPU -> one clear error, exit code 3 (docs/exit-codes.md), from `env` and
  from `train`;
- a rank whose CUDA_VISIBLE_DEVICES names no GPU beside ranks on GPUs (--device auto) -> one error, exit code 7,
  naming the rank, its host and the variable (it ran on the CPU backend, and the job hung);
- a GPU that stopped answering (SHARDTRAIN_CUDA_EMULATOR_HUNG=1 on rank 1: its first CUDA call never returns) ends
  the job with exit code 10 after fsdp.startup_timeout, in one line from rank 1 naming CUDA's start (the other
  ranks, waiting in the exchange of GPU identities, give it the first word), and rank 1's failure record in the
  run directory names its node for the Slurm scripts to leave out;
and the emulator's reading of CUDA_VISIBLE_DEVICES (an entry naming no GPU ends the list; an empty list hides all).
`shardtrain env --json` gives each rank's GPU identity and the backend with its reason; `train` runs one step
on a small dataset made here (a 512-token BPE of the fetched Moby Dick)."""
import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
_, dataset = clitest.prepare_dataset(args, clitest.corpus(args, "moby-dick"), work, 512, "moby-bpe512", 0.05)


# The wrapper jobs/slurm ships for launchers that bind no GPUs (mpirun; GPU_BIND=task): before each rank, it
# narrows CUDA_VISIBLE_DEVICES to the entry at the rank's place on its node (OMPI_COMM_WORLD_LOCAL_RANK).
wrapper = os.path.join(args.source, "jobs", "slurm", "bind-gpu.sh")


def run(np, cli, devices=4, bind=None, visible=None, timeout=180):
    """mpirun -np NP shardtrain CLI on DEVICES emulated GPUs; BIND: each local rank's CUDA_VISIBLE_DEVICES,
    given as the node's list to the wrapper; VISIBLE: CUDA_VISIBLE_DEVICES as every rank sees it."""
    env = dict(os.environ)
    for k in ("SHARDTRAIN_RANKS_PER_NODE", "CUDA_VISIBLE_DEVICES"):
        env.pop(k, None)
    env["SHARDTRAIN_CUDA_EMULATOR_DEVICES"] = str(devices)
    cmd = [args.mpiexec, "--oversubscribe", "-np", str(np)]
    if bind is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(bind)
        cmd.append(wrapper)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    p = subprocess.run(cmd + [args.shardtrain, *cli], capture_output=True, text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout, p.stderr


def env_json(what, np=4, **kw):
    rc, out, err = run(np, ["env", "--strategy", "HYBRID_SHARD", "--ranks-per-node", str(min(np, 2)), "--json"], **kw)
    check(rc == 0, f"{what}: env exit code {rc}: {err[-600:]}")
    if rc != 0:
        return None
    return json.loads(out)


# ---- every rank sees every GPU: each takes the one at its place on the machine
j = env_json("all visible")
physical = [r["gpu_uuid"] for r in j["ranks"]] if j else [""] * 4
if j:
    check([r["device_index"] for r in j["ranks"]] == [0, 1, 2, 3], f"all visible: device indices {[r['device_index'] for r in j['ranks']]}")
    check(len(set(physical)) == 4 and all(u.startswith("GPU-") and len(u) == 40 for u in physical), f"all visible: UUIDs {physical}")
    check([r["pci_bus_id"] for r in j["ranks"]] == ["0000:10:00.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0"],
          f"all visible: PCI bus ids {[r['pci_bus_id'] for r in j['ranks']]}")
    check(j["comm_backend"] == "nccl" and j["comm_backend_reason"] == "4 ranks on this node, each on its own GPU"
          and j["comm_host_staging"] is False, f"all visible: backend {j['comm_backend']}: {j['comm_backend_reason']}")
    check([r["ranks_sharing_gpu"] for r in j["ranks"]] == [1, 1, 1, 1], "all visible: no GPU shared")
    check(j["axis_check"] is True, "all visible: axis check over NCCL")

# ---- one GPU each through CUDA_VISIBLE_DEVICES, in reverse order: every rank's GPU is cuda:0, all different
for label, bind in (("one each by index", ["3", "2", "1", "0"]), ("one each by UUID", [physical[3], physical[2], physical[1], physical[0]])):
    j = env_json(label, bind=bind)
    if not j:
        continue
    check([r["device_index"] for r in j["ranks"]] == [0, 0, 0, 0], f"{label}: device indices {[r['device_index'] for r in j['ranks']]}")
    check([r["gpu_uuid"] for r in j["ranks"]] == physical[::-1], f"{label}: each rank's GPU is physical device 3 - rank: {[r['gpu_uuid'] for r in j['ranks']]}")
    check(j["comm_backend"] == "nccl" and j["comm_backend_reason"] == "4 ranks on this node, each on its own GPU",
          f"{label}: backend {j['comm_backend']}: {j['comm_backend_reason']}")
    check(j["axis_check"] is True, f"{label}: axis check over NCCL")

# ---- two ranks on each GPU through CUDA_VISIBLE_DEVICES: MPI with host staging, and why
shared_pairs = ["0", "0", "1", "1"]
shared_reason = f"ranks 0 and 1 share {physical[0]} (0000:10:00.0)"
j = env_json("pairs", bind=shared_pairs)
if j:
    check([r["gpu_uuid"] for r in j["ranks"]] == [physical[0], physical[0], physical[1], physical[1]], f"pairs: UUIDs {j['ranks']}")
    check(j["comm_backend"] == "mpi" and j["comm_host_staging"] is True and j["comm_backend_reason"] == shared_reason,
          f"pairs: backend {j['comm_backend']} (staging {j['comm_host_staging']}): {j['comm_backend_reason']}")
    check([r["ranks_sharing_gpu"] for r in j["ranks"]] == [2, 2, 2, 2], f"pairs: ranks per GPU {[r['ranks_sharing_gpu'] for r in j['ranks']]}")
    check(j["axis_check"] is True, "pairs: axis check over MPI staging")
rc, out, err = run(4, ["env", "--ranks-per-node", "2"], bind=shared_pairs)
check(rc == 0 and f"collectives: mpi (host staging): {shared_reason}\n" in out, f"pairs: the text names the backend and why: {out}")

# ---- every GPU visible, 2 GPUs for 4 ranks of two simulated nodes on one machine: ranks 0 and 2 share GPU 0
j = env_json("2 GPUs for 4 ranks", devices=2)
if j:
    check([r["device_index"] for r in j["ranks"]] == [0, 1, 0, 1], f"2 GPUs: device indices {[r['device_index'] for r in j['ranks']]}")
    check(j["comm_backend"] == "mpi" and j["comm_backend_reason"] == f"ranks 0 and 2 share {physical[0]} (0000:10:00.0)",
          f"2 GPUs: backend {j['comm_backend']}: {j['comm_backend_reason']}")

# ---- comm_backend = "nccl" on a shared GPU: one clear error, exit code 3, before any training
nccl_refused = f"comm backend nccl (fsdp.comm_backend or --comm-backend): {shared_reason}, and NCCL needs a GPU of its own for each rank"
rc, out, err = run(4, ["env", "--ranks-per-node", "2", "--comm-backend", "nccl"], bind=shared_pairs)
check(rc == 3, f"env --comm-backend nccl on shared GPUs: exit code {rc}, expected 3: {err[-600:]}")
check(len([l for l in err.splitlines() if nccl_refused in l]) == 1, f"env --comm-backend nccl: the error once: {err[-800:]}")

config = os.path.join(args.source, "configs", "tiny-cpu.toml")


def train(name, bind, *extra, device="cuda"):
    run_dir = os.path.join(work, name)
    cli = ["--device", device, "train", "--config", config, "--data.path", dataset, "--model.vocab_size", "512", "--ranks-per-node", "2",
           "--schedule.max_steps", "1", "--schedule.warmup_steps", "0", "--schedule.eval_batches", "0",
           "--checkpoint.every_n_steps", "0", "--logging.peak_flops", "1e12", "--logging.progress", "lines",
           "--logging.run_dir", run_dir, "--model.num_hidden_layers", "1", "--data.seq_len", "16",
           "--data.global_batch_size", "4", *extra]
    rc, out, err = run(4, cli, bind=bind, timeout=300)
    return rc, out + err, run_dir


rc, log, _ = train("train_nccl_refused", shared_pairs, "--fsdp.comm_backend", "nccl")
check(rc == 3, f"train --fsdp.comm_backend nccl on shared GPUs: exit code {rc}, expected 3: {log[-600:]}")
check(len([l for l in log.splitlines() if nccl_refused in l and "configuration error" in l]) == 1,
      f"train --fsdp.comm_backend nccl: one configuration error naming the ranks and the GPU: {log[-800:]}")


# ---- a rank the binding left without a GPU (its CUDA_VISIBLE_DEVICES names none: "7" of 4) beside ranks on GPUs, under
# --device auto: one error, exit 7, from env and from train. That rank ran on the CPU backend, whose collectives do not
# match the GPU ranks': the job hung until fsdp.collective_timeout, then blamed the network.
mixed = f'rank 3 (on {socket.gethostname()}, CUDA_VISIBLE_DEVICES "7") has no GPU and runs on the CPU backend, while rank 0 runs on a GPU'
rc, out, err = run(4, ["env"], bind=["0", "1", "2", "7"])
check(rc == 7 and len([l for l in err.splitlines() if mixed in l and "device error" in l]) == 1,
      f"env with a rank without a GPU: exit {rc}, expected 7 and one line: {err[-800:]}")
rc, log, _ = train("train_mixed", ["0", "1", "2", "7"], device="auto")
check(rc == 7 and len([l for l in log.splitlines() if mixed in l]) == 1, f"train with a rank without a GPU: exit {rc}: {log[-800:]}")

# ---- a GPU that stopped answering: rank 1 hangs in CUDA's start, the others in the exchange of GPU identities
hung_cli = ["--device", "cuda", "train", "--config", config, "--data.path", dataset, "--model.vocab_size", "512",
            "--logging.run_dir", os.path.join(work, "hung"), "--fsdp.startup_timeout", "3"]  # resolves: one that does not gets 1800 s
hung_env = dict(os.environ, SHARDTRAIN_CUDA_EMULATOR_DEVICES="4")
hung_env.pop("CUDA_VISIBLE_DEVICES", None)
hung_env.pop("SHARDTRAIN_RANKS_PER_NODE", None)
hung_env.pop("SLURMD_NODENAME", None)
started = time.time()
p = subprocess.run([args.mpiexec, "--oversubscribe", "-np", "1", args.shardtrain, *hung_cli, ":", "-np", "1", "env",
                    "SHARDTRAIN_CUDA_EMULATOR_HUNG=1", args.shardtrain, *hung_cli, ":", "-np", "1", args.shardtrain, *hung_cli],
                   capture_output=True, text=True, timeout=120, env=hung_env)
lines = [l for l in (p.stdout + p.stderr).splitlines() if "start-up:" in l]
check(p.returncode == 10, f"a hung GPU: exit code {p.returncode}, expected 10: {p.stderr[-800:]}")
check(len(lines) == 1 and "start-up: CUDA's start on this rank (its GPUs, the one it takes, that GPU's identity) has not "
      "finished after 3 s (fsdp.startup_timeout) on rank 1 (" in lines[0], f"a hung GPU: rank 1's line, once: {lines}")
check(time.time() - started < 60, f"a hung GPU: the job ended {time.time() - started:.0f} s after its start")
# Its record, for the Slurm scripts' restart: restartable, naming rank 1's node as the one to leave out.
records = os.path.join(work, "hung", "failures")
names = sorted(os.listdir(records)) if os.path.isdir(records) else []
record = json.load(open(os.path.join(records, "rank_00001.json"))) if "rank_00001.json" in names else {}
check(names == ["rank_00001.json"] and record.get("exit_code") == 10 and record.get("restartable") is True
      and record.get("suspect_nodes") == [socket.gethostname()] and record.get("rank") == 1,
      f"a hung GPU: rank 1's failure record names its node: {names} {record}")


def first_loss(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        steps = [json.loads(l) for l in f if '"step"' in l]
    return steps[0]["loss"] if steps else None


# ---- the start line says which backend and why; both bindings train the same step
losses = {}
for name, bind, said in (("train_own", ["3", "2", "1", "0"], "collectives over nccl: 4 ranks on this node, each on its own GPU;"),
                         ("train_pairs", shared_pairs, f"collectives over mpi (host staging): {shared_reason};")):
    rc, log, run_dir = train(name, bind)
    check(rc == 0, f"{name}: exit code {rc}: {log[-800:]}")
    if rc == 0:
        check(said in log, f"{name}: the start line should say '{said}': {[l for l in log.splitlines() if 'collectives' in l]}")
        losses[name] = first_loss(run_dir)
if len(losses) == 2:
    a, b = losses["train_own"], losses["train_pairs"]
    check(a is not None and b is not None and abs(a - b) <= 1e-5 * abs(b), f"step 1's loss over NCCL {a} vs MPI staging {b}")

# ---- the emulator's CUDA_VISIBLE_DEVICES: an entry naming no GPU ends the list; an empty list hides every GPU
j = env_json("CUDA_VISIBLE_DEVICES=1,7,2", np=1, visible="1,7,2")
if j:
    r = j["ranks"][0]
    check(r["device_index"] == 0 and r["gpu_uuid"] == physical[1] and j["comm_backend"] == "nccl",
          f"CUDA_VISIBLE_DEVICES=1,7,2: one device, physical 1: {r}")
rc, out, err = run(1, ["env", "--json"], visible="")
j = json.loads(out) if rc == 0 else {}
check(rc == 0 and j.get("backend") == "cpu" and j.get("comm_backend_reason") == "the CPU backend",
      f"CUDA_VISIBLE_DEVICES='': the CPU backend: rc {rc} {out[:300]} {err[-300:]}")
rc, out, err = run(1, ["--device", "cuda", "env"], visible="")
check(rc == 7 and "cudaErrorNoDevice" in err, f"CUDA_VISIBLE_DEVICES='' with --device cuda: exit {rc}, expected 7: {err[-300:]}")

check.finish("all GPU binding checks passed")
