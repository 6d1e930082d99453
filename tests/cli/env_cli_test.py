#!/usr/bin/env python3
"""`shardtrain env` end to end: the JSON mesh of every strategy, and one clear error with the
documented exit code (no hang) for each kind of bad input."""
import argparse
import json
import os
import subprocess
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--shardtrain", required=True)
parser.add_argument("--mpiexec", default="mpirun")
args = parser.parse_args()
failures = []


def run(np, *cli, env_rpn=None, mpi_flags=(), extra_env=None):
    env = dict(os.environ)
    env.pop("SHARDTRAIN_RANKS_PER_NODE", None)
    env.pop("SHARDTRAIN_CPU_BINDING", None)
    env.update(extra_env or {})
    if env_rpn:
        env["SHARDTRAIN_RANKS_PER_NODE"] = str(env_rpn)
    cmd = [args.mpiexec, "--oversubscribe", *mpi_flags, "-np", str(np), args.shardtrain, *cli]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


# The acceptance check: 4 ranks as 2 simulated nodes, HYBRID_SHARD -> a 2 x 2 mesh.
rc, out, err = run(4, "env", "--strategy", "HYBRID_SHARD", "--ranks-per-node", "2", "--json")
check(rc == 0, f"env --json exit code {rc}: {err}")
j = json.loads(out)
check(j["world_size"] == 4 and j["nodes"] == 2 and j["ranks_per_node"] == 2, f"topology {j}")
check(j["mesh"]["shape"] == [2, 2], f"mesh shape {j['mesh']['shape']}")
check(j["mesh"]["shard_groups"] == [[0, 1], [2, 3]], f"shard groups {j['mesh']['shard_groups']}")
check(j["mesh"]["replicate_groups"] == [[0, 2], [1, 3]], f"replicate groups {j['mesh']['replicate_groups']}")
check(j["axis_check"] is True, "axis check")
coords = [(r["rank"], r["node"], r["local_rank"], r["coord"]["replicate"], r["coord"]["shard"]) for r in j["ranks"]]
check(coords == [(0, 0, 0, 0, 0), (1, 0, 1, 0, 1), (2, 1, 0, 1, 0), (3, 1, 1, 1, 1)], f"rank coordinates {coords}")

# Every strategy's shape at 4 ranks, simulated nodes given through the environment this time.
expected = {"FULL_SHARD": [1, 4], "SHARD_GRAD_OP": [1, 4], "NO_SHARD": [4, 1], "HYBRID_SHARD": [2, 2],
            "HYBRID_SHARD_ZERO2": [2, 2], "5": [2, 2]}
for strategy, shape in expected.items():
    rc, out, err = run(4, "env", "--strategy", strategy, "--json", env_rpn=2)
    check(rc == 0 and json.loads(out)["mesh"]["shape"] == shape, f"{strategy}: rc {rc}, want {shape}: {out[:200]} {err}")

# An explicit shard size: 4 ranks as 4 nodes of 1, shard over pairs of nodes.
rc, out, err = run(4, "env", "--strategy", "HYBRID_SHARD", "--shard-size", "2", "--ranks-per-node", "1", "--json")
check(rc == 0 and json.loads(out)["mesh"]["shard_groups"] == [[0, 1], [2, 3]], f"shard-size 2: {out[:200]} {err}")

# The human-readable form names the mesh.
rc, out, err = run(2, "env", "--strategy", "NO_SHARD")
check(rc == 0 and "mesh 2 (replicate) x 1 (shard)" in out and "axis check" in out, f"text output: {out} {err}")

# CPU binding: Open MPI binds each of 2 ranks or fewer to one core unless told otherwise; shardtrain releases that
# default (its host work, CPU offload's optimizer above all, would run on one thread), keeps a binding asked
# for (and says what it costs), and SHARDTRAIN_CPU_BINDING=keep keeps the default one too.
cores = len(os.sched_getaffinity(0))
if cores < 2:
    print(f"cpu binding checks skipped: this process may use {cores} core")
else:
    rc, out, err = run(1, "env", "--json")
    r = json.loads(out)["ranks"][0] if rc == 0 else {}
    check(rc == 0 and r.get("cores_at_start") == 1 and r.get("cpu_binding_released") is True and r.get("host_threads", 0) >= 2,
          f"mpirun -np 1 (default binding): expected 1 core at start, released, >= 2 host threads: rc {rc} {r} {err[-300:]}")
    check("released: Open MPI's default binding" in err, f"the release is logged: {err[-300:]}")
    for label, flags, extra in (("--bind-to core", ["--bind-to", "core"], None),
                                ("SHARDTRAIN_CPU_BINDING=keep", [], {"SHARDTRAIN_CPU_BINDING": "keep"})):
        rc, out, err = run(1, "env", "--json", mpi_flags=flags, extra_env=extra)
        r = json.loads(out)["ranks"][0] if rc == 0 else {}
        check(rc == 0 and r.get("cpu_binding_released") is False and r.get("host_threads") == 1,
              f"{label}: expected the binding kept and 1 host thread: rc {rc} {r} {err[-300:]}")
        check("cpu binding: this rank may use 1 of the" in err, f"{label}: the warning: {err[-400:]}")
    rc, out, err = run(1, "env", "--json", mpi_flags=["--bind-to", "none"])
    r = json.loads(out)["ranks"][0] if rc == 0 else {}
    check(rc == 0 and r.get("cores_at_start", 0) >= 2 and r.get("cpu_binding_released") is False and "cpu binding" not in err,
          f"--bind-to none: nothing to release, nothing said: rc {rc} {r} {err[-300:]}")
    rc, out, err = run(1, "env", extra_env={"SHARDTRAIN_CPU_BINDING": "loose"})
    check(rc == 3 and "SHARDTRAIN_CPU_BINDING='loose': expected auto, keep or release" in err,
          f"SHARDTRAIN_CPU_BINDING=loose: exit {rc}, expected 3 and the variable named: {err[-300:]}")

# Bad input: one clear error each, the documented exit code, and no hang (the timeout above).
bad = [
    (6, ["env", "--strategy", "HYBRID_SHARD", "--ranks-per-node", "4"], 3, "world size 6 is not divisible by ranks_per_node 4"),
    (4, ["env", "--strategy", "HYBRID_SHARD", "--shard-size", "3"], 3, "shard_size 3 does not divide world size 4"),
    (2, ["env", "--strategy", "ZERO3"], 3, "unknown sharding strategy 'ZERO3'"),
    (2, ["env", "--no-such-flag"], 2, "--no-such-flag"),
    (2, ["env", "--log-level", "loud"], 2, "unknown level 'loud'"),
]
for np, cli, code, message in bad:
    rc, out, err = run(np, *cli)
    check(rc == code, f"{' '.join(cli)}: exit code {rc}, expected {code}")
    check(message in err, f"{' '.join(cli)}: message '{message}' not in: {err[-500:]}")
    lines = [l for l in err.splitlines() if message in l]
    check(len(lines) == 1, f"{' '.join(cli)}: expected the error once, got {len(lines)} times")

# shardtrain plan (offline): a 7B Llama on 4 nodes x 8 GPUs. The sharded state of FULL_SHARD is 16 bytes per
# parameter over 32 ranks (padding aside); NO_SHARD cannot fit 80 GiB; the recommendation is a strategy that fits.
p = subprocess.run([args.shardtrain, "plan", "--nodes", "4", "--gpus-per-node", "8", "--strategy", "FULL_SHARD",
                    "--layers", "32", "--hidden", "4096", "--intermediate", "11008", "--heads", "32", "--kv-heads", "32",
                    "--vocab", "32000", "--seq", "4096", "--activation-checkpointing", "--json"],
                   capture_output=True, text=True, timeout=60)
check(p.returncode == 0, f"plan: exit {p.returncode}: {p.stderr}")
plan = json.loads(p.stdout)
params = plan["params"]
check(abs(plan["memory_per_rank_bytes"]["sharded_state"] - 16 * params / 32) < 16 * 64 * len(plan["units"]),
      f"FULL_SHARD sharded state {plan['memory_per_rank_bytes']['sharded_state']} vs 16 P / 32 = {16 * params / 32}")
by_name = {e["strategy"]: e for e in plan["strategies"]}
check(set(by_name) == {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"}, f"strategies {list(by_name)}")
check(not by_name["NO_SHARD"]["fits"] and by_name["FULL_SHARD"]["fits"], "NO_SHARD does not fit 80 GiB, FULL_SHARD does")
check(by_name["HYBRID_SHARD"]["comm_s"] < by_name["FULL_SHARD"]["comm_s"], "hybrid sends less across nodes than FULL_SHARD")
check(plan["recommended"] in by_name and by_name[plan["recommended"]]["fits"], f"recommended {plan['recommended']}")

# --device takes the spellings --help gives (auto, cpu, cuda); "gpu" was taken as cuda without a word.
rc, out, err = run(1, "--device", "gpu", "env")
check(rc == 2 and "--device: unknown device 'gpu' (expected auto, cpu or cuda)" in err, f"--device gpu: exit {rc}: {err[-400:]}")

print(f"{len(failures)} failed" if failures else "all env CLI checks passed")
sys.exit(1 if failures else 0)
