#!/usr/bin/env python3
"""Where a training step on the GPU makes the host wait for the device, counted on the CUDA emulator
(SHARDTRAIN_CUDA_EMULATOR_WAITS lists every call that waited for device work not yet run). The same run for
2 and for 4 steps: what the two extra steps add is what every step costs. The GPU backend promises one wait
per step on one rank (the loss and the gradient norm read together); a cudaFree in a step would synchronize
the whole device, so none is allowed. With CPU offload the gradients come down to the host for AdamW: the
wait that adds is pinned here too, so a new one shows up as a failure.

The same runs count every call (SHARDTRAIN_CUDA_EMULATOR_CALLS): in a steady state a step allocates and frees
no device or pinned memory (cudaMalloc can take milliseconds, cudaFree synchronizes the device), creates no
stream or event, and builds no cuBLASLt descriptor and asks no heuristic (cached per shape); what it queues
(kernel launches, GEMMs, collectives, copies) is printed."""
import collections
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
_, ds = clitest.prepare_dataset(args, clitest.corpus(args, "sotu"), work, 4096, "sotu-bpe4k", 0.02)


# Calls a steady-state step must not make at all.
SET_UP_ONLY = ["cudaMalloc", "cudaFree", "cudaMallocHost", "cudaFreeHost", "cudaStreamCreateWithFlags",
               "cudaStreamCreateWithPriority", "cudaStreamDestroy",
               "cudaEventCreateWithFlags", "cudaEventDestroy", "cudaDeviceSynchronize", "cublasLtCreate",
               "cublasLtMatmulDescCreate", "cublasLtMatrixLayoutCreate", "cublasLtMatmulPreferenceCreate",
               "cublasLtMatmulAlgoGetHeuristic", "ncclCommInitRank"]


def waits(name, steps, np, extra):
    """The host waits and the calls of one run, all ranks together: two Counters of API names. Each rank has a
    device of its own (with two ranks: NCCL)."""
    log = os.path.join(work, f"{name}-{steps}.waits")
    calls_log = os.path.join(work, f"{name}-{steps}.calls")
    for f in (log, calls_log):
        if os.path.exists(f):
            os.remove(f)
    env = dict(os.environ, SHARDTRAIN_CUDA_EMULATOR_WAITS=log, SHARDTRAIN_CUDA_EMULATOR_CALLS=calls_log,
               SHARDTRAIN_CUDA_EMULATOR_DEVICES=str(np))
    cmd = [args.mpiexec, "--oversubscribe", "-np", str(np), args.shardtrain, "--device", "cuda", "train", "--config",
           "configs/tiny-cpu.toml", "--data.path", ds, "--schedule.max_steps", str(steps), "--schedule.warmup_steps", "1",
           "--schedule.eval_batches", "0", "--checkpoint.every_n_steps", "0", "--logging.peak_flops", "1e12",
           "--data.seq_len", "64", "--logging.run_dir", os.path.join(work, f"{name}-{steps}"), "--log-level", "warn", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=args.source)
    check(p.returncode == 0, f"{name}, {steps} steps: exit {p.returncode}: {p.stderr[-2000:]}")
    lines = open(log).read().split("\n") if os.path.exists(log) else []
    calls = collections.Counter()
    for line in open(calls_log).read().split("\n") if os.path.exists(calls_log) else []:
        if line:
            what, n = line.split(" ", 1)[1].rsplit(" ", 1)  # "<pid> <name, maybe with spaces> <count>"
            calls[what] += int(n)
    check(calls["cublasLtMatmul"] > 0 and calls["kernel launch"] > 0, f"{name}, {steps} steps: no calls counted ({calls_log})")
    return collections.Counter(l.split(" ", 1)[1] for l in lines if l), calls


def step_cost(a, b, name, np, what):
    """What two more steps added, per step and rank."""
    diff = {api: b[api] - a[api] for api in set(a) | set(b) if b[api] != a[api]}
    check(all(v % (2 * np) == 0 for v in diff.values()), f"{name}: two steps added {what} {diff}, not a whole number per step and rank")
    return {api: v // (2 * np) for api, v in diff.items()}


def per_step(name, np, extra):
    """What one step adds on each rank: host waits, calls."""
    (wa, ca), (wb, cb) = waits(name, 2, np, extra), waits(name, 4, np, extra)
    return step_cost(wa, wb, name, np, "waits"), step_cost(ca, cb, name, np, "calls")


cases = [
    # name, ranks, options, the waits every step costs each rank
    ("bf16", 1, ["--data.global_batch_size", "4", "--fsdp.param_dtype", "bf16"], {"cudaStreamSynchronize": 1}),
    # Two micro-batches per step: still one read for the whole step.
    ("accumulation", 1, ["--data.global_batch_size", "8", "--data.micro_batch_size", "4", "--fsdp.param_dtype", "bf16"],
     {"cudaStreamSynchronize": 1}),
    # Two ranks over NCCL, the collectives on the engine's streams: the gradient norm's sums are taken on the
    # reduction stream and copied down with the loss, their cross-rank sum rides the step's one host all-reduce,
    # so still one.
    ("nccl_np2", 2, ["--data.global_batch_size", "4", "--fsdp.param_dtype", "bf16", "--fsdp.comm_backend", "nccl"],
     {"cudaStreamSynchronize": 1}),
    # Offload, two micro-batches: the second micro-batch's reductions are added into the host shards by host
    # functions on the download stream, with no wait of their own; after the last micro-batch the host waits
    # once for that stream (which waits for compute), then reads the loss (a copy on an idle device).
    ("offload", 1, ["--data.global_batch_size", "8", "--data.micro_batch_size", "4", "--fsdp.param_dtype", "bf16",
                    "--fsdp.offload_params", "true", "--fsdp.activation_checkpointing", "true"],
     {"cudaStreamSynchronize": 2}),
]
for name, np, extra, want in cases:
    got, calls = per_step(name, np, extra)
    check(got == want, f"{name}: host waits per step {got}, expected {want}")
    print(f"{name}: host waits per step {got}")
    made = {api: calls[api] for api in SET_UP_ONLY if calls.get(api)}
    check(not made, f"{name}: a steady-state step makes set-up calls {made}")
    check(calls.get("kernel launch", 0) > 0 and calls.get("cublasLtMatmul", 0) > 0, f"{name}: a step queued {calls}")
    print(f"{name}: per step and rank " + ", ".join(f"{api} {n}" for api, n in sorted(calls.items())))

# The offload runs' step metrics: from step 2 on, the previous step's host update (its wall time, and how long the
# step waited for it); step 1 has no previous update, a run without offload none.
def train_steps(run):
    with open(os.path.join(work, run, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r.get("kind") == "train"]


offload = train_steps("offload-4")
check([r["step"] for r in offload] == [1, 2, 3, 4], f"offload-4: steps {[r['step'] for r in offload]}")
check("host_update_s" not in offload[0], f"offload-4: step 1 reports a host update {offload[0]}")
# The wait is timed on the main thread and the update on the optimizer's worker: how they compare depends on when
# each thread is woken (on a busy 2-core machine a wait read 5.2 ms against an update of 2.6: issue 36). What
# the code guarantees: an update every step after the first, a wait that is not negative, and a wait inside
# its own step's wall time.
for r in offload[1:]:
    check(r.get("host_update_s", 0) > 0 and 0 <= r.get("update_wait_s", -1) <= r["step_time_s"],
          f"offload-4: step {r['step']}: host_update_s {r.get('host_update_s')}, update_wait_s {r.get('update_wait_s')}, "
          f"step_time_s {r.get('step_time_s')}")
print("offload: host update per step (s) " + ", ".join(f"{r.get('host_update_s', 0):.4f} (waited {r.get('update_wait_s', 0):.4f})"
                                                       for r in offload[1:]))
check(all("host_update_s" not in r for r in train_steps("bf16-4")), "bf16-4: a run without offload reports a host update")

check.finish("host waits per step as pinned; no set-up call in a steady-state step; offload's update timed")
