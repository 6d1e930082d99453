#!/usr/bin/env python3
"""`shardtrain bench comm` end to end, small sweeps (a few seconds):
- host memory (the CPU backend, MPI): 2 ranks FULL_SHARD in f32 (world and shard; the replicate axis, one rank, left
  out) and 4 ranks as 2 simulated nodes of 2, HYBRID_SHARD, in bf16 (world 4, shard 2, replicate 2): the JSON's schema
  as the step-time model reads it, every point's bytes the sizes requested (rounded down to whole elements on every
  rank for a size that does not divide), every time positive, every busbw finite and positive (host_all_reduce:
  latency only, null), every fitted latency >= 0, one summary line per axis and kind; nothing timing-dependent
  beyond positivity;
- with --gpu (the CUDA emulator: SHARDTRAIN_CUDA=EMULATED, 2 emulated GPUs): device memory over NCCL (the world axis
  stays MPI, staged) and over MPI with host staging;
- bad input: a size that is no size, --memory device without a GPU, one rank (nothing to time), each exit 2 with
  one message."""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--shardtrain", required=True)
parser.add_argument("--mpiexec", default="mpirun")
parser.add_argument("--workdir", required=True)
parser.add_argument("--gpu", action="store_true", help="device memory on 2 emulated GPUs (the emulated build)")
args = parser.parse_args()
failures = []
work = os.path.abspath(args.workdir)
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

KINDS = ["all_gather", "reduce_scatter", "all_reduce", "host_all_reduce"]
TOP = ["device", "backend", "ranks", "ranks_per_node", "axes"]


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def run(np, *cli, extra_env=None, device="cpu"):
    env = dict(os.environ)
    for k in ("SHARDTRAIN_RANKS_PER_NODE", "SHARDTRAIN_CPU_BINDING", "CUDA_VISIBLE_DEVICES"):
        env.pop(k, None)
    env.update(extra_env or {})
    # --device cpu: the host-memory cases are the CPU backend's in the emulated build too (its GPUs are emulated).
    cmd = [args.mpiexec, "--oversubscribe", "-np", str(np), args.shardtrain, "bench", "comm", "--device", device, *cli]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    return p.returncode, p.stdout, p.stderr


def positive(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def check_profile(name, j, ranks, rpn, backend, axis_ranks, sizes, elem, host_values=4):
    """The schema of docs/cluster.md ("Measuring the links"), the requested sizes, positive times and fits."""
    check(list(j)[:len(TOP)] == TOP, f"{name}: the schema's keys first, in order: {list(j)}")
    check(isinstance(j.get("device"), str) and j.get("device"), f"{name}: device {j.get('device')}")
    check(j.get("backend") == backend, f"{name}: backend {j.get('backend')}, expected {backend}")
    check(j.get("ranks") == ranks and j.get("ranks_per_node") == rpn,
          f"{name}: ranks {j.get('ranks')} ranks_per_node {j.get('ranks_per_node')}, expected {ranks} {rpn}")
    axes = j.get("axes", {})
    check(list(axes) == list(axis_ranks), f"{name}: axes {list(axes)}, expected {list(axis_ranks)}")
    check(j.get("axis_ranks") == axis_ranks, f"{name}: axis_ranks {j.get('axis_ranks')}")
    for axis, n in axis_ranks.items():
        kinds = axes.get(axis, {})
        check(list(kinds) == KINDS, f"{name} {axis}: kinds {list(kinds)}")
        for kind, k in kinds.items():
            where = f"{name} {axis} {kind}"
            check(sorted(k) == ["busbw_bytes_per_s", "latency_s", "points"], f"{where}: keys {sorted(k)}")
            points = k.get("points", [])
            check(all(sorted(p) == ["bytes", "seconds"] for p in points), f"{where}: point keys {points}")
            check(all(positive(p.get("seconds")) for p in points), f"{where}: a time not positive: {points}")
            lat = k.get("latency_s")
            check(isinstance(lat, (int, float)) and math.isfinite(lat) and lat >= 0, f"{where}: latency {lat}")
            if kind == "host_all_reduce":
                check([p.get("bytes") for p in points] == [8 * host_values], f"{where}: bytes {points}")
                check(k.get("busbw_bytes_per_s") is None, f"{where}: busbw {k.get('busbw_bytes_per_s')}, expected null")
                continue
            # Requested sizes, rounded down to whole elements on every rank (all_gather, reduce_scatter: bytes / n).
            block = elem if kind == "all_reduce" else elem * n
            want = [s // block * block for s in sizes]
            got = [p.get("bytes") for p in points]
            check(got == want, f"{where}: bytes {got}, expected {want}")
            check(positive(k.get("busbw_bytes_per_s")), f"{where}: busbw {k.get('busbw_bytes_per_s')}")


def check_table(name, out, axis_ranks):
    """One summary line per axis and kind: axis, kind, latency, busbw ('-' for host_all_reduce)."""
    lines = {tuple(line.split()[:2]) for line in out.splitlines() if len(line.split()) >= 3}
    for axis in axis_ranks:
        for kind in KINDS:
            check((axis, kind) in lines, f"{name}: no summary line for {axis} {kind}\n{out}")


SMALL = ["--min-bytes", "4KiB", "--max-bytes", "64KiB", "--iters", "3", "--warmup", "1"]
SIZES = [4096, 16384, 65536]

if not args.gpu:
    # 2 ranks, FULL_SHARD, f32: world and shard (the same 2 ranks); replicate has one rank.
    path = os.path.join(work, "np2.json")
    rc, out, err = run(2, "--strategy", "FULL_SHARD", *SMALL, "--json", path)
    check(rc == 0, f"np2 exit {rc}: {err[-2000:]}")
    check("the replicate axis has one rank" in err, f"np2: the replicate axis named as left out: {err[-2000:]}")
    check("busbw = algbw * bytes_factor" in out and "(n-1)/n" in out and "2(n-1)/n" in out,
          f"np2: the header states nccl-tests' factors:\n{out[:2000]}")
    if rc == 0:
        j = json.load(open(path))
        check_profile("np2", j, 2, 2, "mpi", {"world": 2, "shard": 2}, SIZES, 4)
        check(j.get("dtype") == "f32" and j.get("memory") == "host" and j.get("strategy") == "FULL_SHARD",
              f"np2: dtype {j.get('dtype')} memory {j.get('memory')} strategy {j.get('strategy')}")
        check(j.get("axis_backends") == {"world": "mpi", "shard": "mpi"}, f"np2: axis_backends {j.get('axis_backends')}")
        check_table("np2", out, {"world": 2, "shard": 2})

    # 4 ranks as 2 nodes of 2, HYBRID_SHARD, bf16; 4100 bytes does not divide: all_gather and reduce_scatter move
    # 4096 on the world axis (256 bf16 per rank: 4100 // (2 * 4) = 256), 4100 on shard and replicate, all_reduce 4100.
    path = os.path.join(work, "np4.json")
    rc, out, err = run(4, "--ranks-per-node", "2", "--strategy", "HYBRID_SHARD", "--dtype", "bf16", "--min-bytes", "4100",
                       "--max-bytes", "70000", "--iters", "3", "--warmup", "1", "--host-values", "3", "--json", path)
    check(rc == 0, f"np4 exit {rc}: {err[-2000:]}")
    if rc == 0:
        j = json.load(open(path))
        for axis, n in {"world": 4, "shard": 2, "replicate": 2}.items():
            one = dict(j, axes={axis: j["axes"].get(axis, {})}, axis_ranks={axis: j["axis_ranks"].get(axis)})
            check_profile(f"np4 {axis}", one, 4, 2, "mpi", {axis: n}, [4100, 16400, 65600], 2, host_values=3)
        check(list(j.get("axes", {})) == ["world", "shard", "replicate"], f"np4: axes {list(j.get('axes', {}))}")
        check(j["axes"]["world"]["all_gather"]["points"][0]["bytes"] == 4096, "np4: 4100 bytes over 4 ranks -> 4096")
        check(j.get("dtype") == "bf16", f"np4: dtype {j.get('dtype')}")
        check_table("np4", out, {"world": 4, "shard": 2, "replicate": 2})

    # Bad input: exit 2 and one message each.
    for cli, np, says in ((["--min-bytes", "4 parsecs"], 2, "is not a size"),
                          (["--min-bytes", "1MiB", "--max-bytes", "4KiB"], 2, "is above --max-bytes"),
                          (["--memory", "device"], 2, "needs a GPU"),
                          (["--kinds", "all_to_all"], 2, "expected all_gather"),
                          (["--min-bytes", "4", "--max-bytes", "4"], 2, "holds less than one f32 element per rank"),
                          (SMALL, 1, "nothing to time")):
        rc, out, err = run(np, *cli)
        check(rc == 2 and says in err, f"{cli} on {np} rank(s): exit {rc} (expected 2), '{says}' in: {err[-1500:]}")
else:
    emu = {"SHARDTRAIN_CUDA_EMULATOR_DEVICES": "2"}
    # NCCL on device memory: shard over NCCL, the world axis over MPI staged through the host (mesh_comms.hpp).
    path = os.path.join(work, "gpu-nccl.json")
    rc, out, err = run(2, "--strategy", "FULL_SHARD", "--comm-backend", "nccl", *SMALL, "--json", path, extra_env=emu,
                       device="cuda")
    check(rc == 0, f"gpu nccl exit {rc}: {err[-2000:]}")
    if rc == 0:
        j = json.load(open(path))
        check_profile("gpu nccl", j, 2, 2, "nccl", {"world": 2, "shard": 2}, SIZES, 4)
        check(j.get("memory") == "device" and j.get("axis_backends") == {"world": "mpi", "shard": "nccl"},
              f"gpu nccl: memory {j.get('memory')} axis_backends {j.get('axis_backends')}")
    # MPI staged through pinned host memory, bf16.
    path = os.path.join(work, "gpu-mpi.json")
    rc, out, err = run(2, "--strategy", "FULL_SHARD", "--fsdp.comm_backend", "mpi", "--dtype", "bf16", "--axes", "shard",
                       *SMALL, "--json", path, extra_env=emu, device="cuda")
    check(rc == 0, f"gpu mpi exit {rc}: {err[-2000:]}")
    if rc == 0:
        j = json.load(open(path))
        check_profile("gpu mpi", j, 2, 2, "mpi", {"shard": 2}, SIZES, 2)
        check(j.get("memory") == "device", f"gpu mpi: memory {j.get('memory')}")

print(f"{len(failures)} failed" if failures else "bench comm: schema, sizes, positive times and fits, bad input: ok")
sys.exit(1 if failures else 0)
