#!/usr/bin/env python3
"""`shardtrain predict` end to end, offline (no MPI, no GPU; well under a second a call):
- Llama 3 8B (configs/llama3-8b.toml) on 1 x 8 H100s with the checked-in H200 seed profile: the report says it is a
  prediction, the JSON's figures are consistent (tokens/s per GPU = tokens per rank / step, MFU of the datasheet's
  989 TFLOP/s in (0, 1], exposed communication <= collectives' time and < the step, peak memory under 80 GiB);
- the same on 4 nodes with HYBRID_SHARD: the replicas' all-reduce crosses the nodes (infiniband) and is among the
  causes; the step is no shorter than on one node;
- the compute stream's time by op adds up to its busy time, with each layer's GEMMs counted; the seed on one H200
  prices the GEMMs its profile lacks like the nearest ones it has, the 8B none (beyond 2x of every seed GEMM);
- an H100 predicted from the H200's profile: memory-bound calls scaled by the bandwidths, compute-bound ones not;
- the trace is Chrome's JSON with the compute stream and the collectives' streams;
- a config that does not fit (70B sharded over 8 GPUs) says DOES NOT FIT;
- a links file with a bandwidth of 0 or below or a negative latency: exit 3, naming the file and the field;
- a profile of another kind of device than --gpu: exit 3, naming the file, its device and --gpu; CPU ranks without
  --links are told they get the h100-dgx preset;
- a profile whose op times beat the spec peak (MFU above 100 %): exit 3 naming it; two profiles of one shape: exit 2
  naming both; profiles of different shapes that share a call kind: the first given prices it, and the report says so;
- --cpu-threads outside 1..1024, or more than the system starts: exit 2 naming the option;
- bad input: an unknown --gpu, a --links file that is not a bench comm JSON, --gpu cpu without a profile: exit 2
  (usage) or 3 (config) with one message naming the option or file."""
import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--shardtrain", required=True)
parser.add_argument("--source", required=True)
parser.add_argument("--workdir", required=True)
args = parser.parse_args()
failures = []
work = os.path.abspath(args.workdir)
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def predict(*extra, expect=0):
    cmd = [args.shardtrain, "predict", *extra]
    p = subprocess.run(cmd, cwd=args.source, capture_output=True, text=True, timeout=120)
    check(p.returncode == expect, f"{' '.join(extra)}: exit {p.returncode}, expected {expect}\n{p.stdout}{p.stderr}")
    return p


profile = ["--ops-profile", "profiles/h200/seed-b64-s512.json"]
one = os.path.join(work, "one.json")
trace = os.path.join(work, "trace.json")
p = predict("--config", "configs/llama3-8b.toml", "--nodes", "1", "--gpus-per-node", "8", "--gpu", "h100", *profile,
            "--json", one, "--trace", trace)
check("PREDICTION, not a measurement" in p.stdout, "the report says it is a prediction")
j = json.load(open(one))
check(j["prediction"] is True, "JSON: prediction true")
check(j["mesh"] == "1 (replicate) x 8 (shard)", f"mesh {j['mesh']}")
check(j["micro_batch"] == 1 and j["seq"] == 8192 and j["accumulation"] == 1, "batch 1 x 8192, one micro-batch")
check(abs(j["tokens_per_s_per_rank"] - 8192 / j["step_s"]) < 1e-6 * j["tokens_per_s_per_rank"], "tokens/s = 8192 / step")
check(j["spec_peak_flops"] == 989e12, f"datasheet peak {j['spec_peak_flops']}")
check(0 < j["mfu"] <= 1, f"MFU {j['mfu']}")
check(0 <= j["exposed_comm_s"] <= j["comm_busy_s"], "exposed <= collectives' time")
check(j["exposed_comm_s"] < j["step_s"] and j["compute_busy_s"] <= j["step_s"], "exposed and compute within the step")
check(0 < j["peak_device_bytes"] < 80 * 2**30, f"peak memory {j['peak_device_bytes']}")
check(j["op_calls_from_profile"] + j["op_calls_from_rates"] > 1000, "every op call priced")
by_op = {o["op"]: o for o in j.get("compute_by_op", [])}
check(abs(sum(o["seconds"] for o in by_op.values()) - j["compute_busy_s"]) < 1e-9 * j["compute_busy_s"],
      "compute by op adds up to the compute stream's busy time")
check(by_op.get("matmul", {}).get("calls") == 32 * 11 and by_op.get("matmul_add", {}).get("calls") == 32,
      f"32 layers' GEMMs a step: {by_op.get('matmul')}")
check(j.get("op_calls_at_nearest_gemm") == 0, "no 8B GEMM within 2x of a seed-profile GEMM: the ceiling prices them")
t = json.load(open(trace))["traceEvents"]
tids = {e["tid"] for e in t}
check("compute" in tids and len(tids) >= 3, f"trace streams {sorted(tids)}")
check(all(e["ph"] == "X" and e["dur"] >= 0 for e in t), "trace events are complete events")
check(any("all_gather shard" in e["name"] for e in t), "the trace holds the all-gathers")

# The seed on one H200 with its own profile: the fused q/k/v and gate/up GEMMs the profile lacks take the share of
# the ceiling of the profile's separate projections (within 2x in each dim).
seed = os.path.join(work, "seed.json")
p = predict("--config", "configs/llama-seed.toml", "--nodes", "1", "--gpus-per-node", "1", "--gpu", "h200", *profile,
            "--json", seed)
sj = json.load(open(seed))
seed_matmul = {o["op"]: o for o in sj.get("compute_by_op", [])}.get("matmul", {})
check(sj.get("op_calls_at_nearest_gemm", 0) > 0 and seed_matmul.get("calls_priced", {}).get("nearest_gemm", 0) > 0,
      f"seed: GEMMs priced like their nearest profiled GEMM: {sj.get('op_calls_at_nearest_gemm')} {seed_matmul}")
check("compute by op (per step; priced from):" in p.stdout and "nearest GEMM" in p.stdout, "the report's op table")

# The same seed step predicted for an H100 from the H200's profile: its memory-bound calls (RMSNorm's, all from the
# profile) take 4.8 / 3.35 (the two memories' bandwidths) of their measured time, its compute-bound ones (the fused
# loss) the measured time.
seed_h100 = os.path.join(work, "seed-h100.json")
p = predict("--config", "configs/llama-seed.toml", "--nodes", "1", "--gpus-per-node", "1", "--gpu", "h100", *profile,
            "--json", seed_h100)
check("memory-bound calls x 1.433 for h100-sxm's bandwidth" in p.stdout, f"the scaling said: {p.stdout[:600]}")
h100_ops = {o["op"]: o for o in json.load(open(seed_h100)).get("compute_by_op", [])}
h200_ops = {o["op"]: o for o in sj.get("compute_by_op", [])}
norm = [x.get("rmsnorm_forward", {}) for x in (h100_ops, h200_ops)]
check(all(n.get("calls_priced", {}).get("rates", 1) == 0 for n in norm)
      and abs(norm[0].get("seconds", 0) / norm[1].get("seconds", 1) - 4.8 / 3.35) < 1e-9,
      f"rmsnorm_forward from the profile, scaled to the H100's memory: {norm}")
loss = [x.get("linear_cross_entropy", {}).get("seconds") for x in (h100_ops, h200_ops)]
check(loss[0] is not None and loss[0] == loss[1], f"the fused loss, compute-bound, unscaled: {loss}")

four = os.path.join(work, "four.json")
predict("--config", "configs/llama3-8b.toml", "--nodes", "4", "--gpus-per-node", "8", "--gpu", "h100", *profile,
        "--fsdp.strategy", "HYBRID_SHARD", "--data.global_batch_size", "32", "--json", four)
k = json.load(open(four))
check(k["mesh"] == "4 (replicate) x 8 (shard)", f"hybrid mesh {k['mesh']}")
check("replicate: 4 ranks, infiniband" in k["links"], f"links {k['links']}")
idle = k.get("idle", [])
check(any("all_reduce replicate" in c["cause"] and c.get("communication") for c in idle),
      f"the replicas' all-reduce among the causes, as communication: {idle}")
# The last unit's gradient-norm sum, queued behind its all-reduce on the replicate stream: compute's wait after the
# all-reduce ends is the kernel's, not exposed communication; the exposed time is the communication causes' alone.
sums = [c for c in idle if "sum_squares" in c["cause"]]
check(len(sums) == 1 and not sums[0].get("communication") and 0 < sums[0]["seconds"] < 1e-3,
      f"one gradient-norm sum among the causes, not communication, under a millisecond: {sums}")
exposed = sum(c["seconds"] for c in idle if c.get("communication") and not c.get("copy"))
check(abs(exposed - k["exposed_comm_s"]) < 1e-9, f"exposed {k['exposed_comm_s']} = its collective causes' {exposed}")
copies = sum(c["seconds"] for c in idle if c.get("copy"))
check(abs(copies - k["exposed_copy_s"]) < 1e-9, f"exposed copies {k['exposed_copy_s']} = its copy causes' {copies}")
check(k["step_s"] >= j["step_s"], "4 nodes no faster a step than 1")

p = predict("--config", "configs/llama3-70b-hybrid.toml", "--nodes", "8", "--gpus-per-node", "8", "--fsdp.shard_size", "8",
            *profile)
check("DOES NOT FIT" in p.stdout, "70B over 8-GPU shard groups does not fit an H100")

p = predict("--config", "configs/llama3-8b.toml", "--gpu", "a100", expect=2)
check("--gpu a100" in p.stderr and p.stderr.count("\n") <= 2, f"unknown GPU named: {p.stderr}")
bad = os.path.join(work, "links.json")
open(bad, "w").write("{\"ranks\": 8}")
p = predict("--config", "configs/llama3-8b.toml", "--links", bad, expect=3)
check(bad in p.stderr and "bench comm" in p.stderr, f"bad links file named: {p.stderr}")
p = predict("--config", "configs/tiny-cpu.toml", "--gpu", "cpu", "--gpus-per-node", "2", expect=2)
check("--ops-profile" in p.stderr, f"cpu without a profile: {p.stderr}")


def refused(p, code, *parts):
    """Exit `code`, nothing on stdout, and one line of stderr holding every part."""
    lines = [l for l in p.stderr.splitlines() if all(x in l for x in parts)]
    check(p.returncode == code and p.stdout == "" and len(lines) == 1,
          f"exit {p.returncode} (expected {code}), one line with {parts}: {p.stdout[-300:]} {p.stderr[-800:]}")


# A links file with impossible figures (bench comm writes none): each fit's busbw from 1e3 to 1e14 bytes/s, its
# latency from 0 to 1 s, else exit 3 naming the file, the field and the range. They printed collectives of -17.29 ms,
# a step of -nan ms and MFU 100.0 %; a busbw of 1e-300 a step of inf ms, a latency of 1e300 a 300-digit step. The
# entries in the file's order of keys: the shard axis' all_gather first.
links2 = ["--config", "configs/tiny-cpu.toml", "--gpus-per-node", "2", "--gpu", "h100"]
good_links = json.load(open(os.path.join(args.source, "profiles/cpu-this-machine/comm-np2.json")))
good = os.path.join(work, "links-good.json")
p = predict(*links2, "--links", "profiles/cpu-this-machine/comm-np2.json", "--json", good)
check(p.returncode == 0 and json.load(open(good))["comm_busy_s"] > 0, f"the measured links as they are: {p.stderr[-500:]}")
busbw_range = "a bus bandwidth from 1000 to 1e+14 bytes/s"
for field, value, expected in [("busbw_bytes_per_s", -1e9, f"{busbw_range}, not -1000000000.0"),
                               ("busbw_bytes_per_s", 0, f"{busbw_range}, not 0"),
                               ("busbw_bytes_per_s", 1e-300, f"{busbw_range}, not 1e-300"),
                               ("busbw_bytes_per_s", 1e15, f"{busbw_range}, not 1e+15"),
                               ("latency_s", -1, "a latency from 0 to 1 s, not -1"),
                               ("latency_s", 1e300, "a latency from 0 to 1 s, not 1e+300")]:
    k = json.loads(json.dumps(good_links))
    for kinds in k["axes"].values():
        for fit in kinds.values():
            fit[field] = value
    path = os.path.join(work, f"links-{field}-{value}.json")
    json.dump(k, open(path, "w"))
    refused(predict(*links2, "--links", path, expect=3), 3, f"--links {path}: axes.shard.all_gather.{field}: expected {expected}")
# One bad entry among good ones (host_all_reduce's null bandwidth is a measurement: one size, no slope).
k = json.loads(json.dumps(good_links))
k["axes"]["world"]["reduce_scatter"]["latency_s"] = -1e-6
path = os.path.join(work, "links-one-bad.json")
json.dump(k, open(path, "w"))
refused(predict(*links2, "--links", path, expect=3), 3, f"--links {path}: axes.world.reduce_scatter.latency_s: expected")

# A profile measured on another kind of device than --gpu asks for: exit 3 naming the file, its device and --gpu. The
# H200 seed profile priced CPU ranks at a GPU's speed without a word.
def profile_file(name, device, backend, dtype, key, seconds, flops, bytes_, shape=None):
    j = {"device": device, "backend": backend, "dtype": dtype,
         "ceilings": {"matmul_flops_per_s": 1e11, "copy_bytes_per_s": 1e10},
         "rows": [{"op": "row", "shapes": "-", "kind": "bytes" if flops == 0 else "flops", "work": bytes_ or flops,
                   "seconds": seconds, "calls_per_microbatch": 1, "calls": [{"key": key, "flops": flops, "bytes": bytes_}]}]}
    if shape:
        j.update(shape)
    path = os.path.join(work, name)
    json.dump(j, open(path, "w"))
    return path


cpu_profile = profile_file("cpu-profile.json", "cpu", "cpu", "f32", "copy f32[250] f32[250]", 3e-5, 0, 2000)
cpu2 = ["--config", "configs/tiny-cpu.toml", "--gpu", "cpu", "--gpus-per-node", "2"]
refused(predict(*cpu2, "--ops-profile", "profiles/h200/seed-b64-s512.json", expect=3), 3,
        "--ops-profile profiles/h200/seed-b64-s512.json: measured on cuda:0 (NVIDIA H200, 139.8 GiB)", "--gpu cpu")
refused(predict(*links2, "--ops-profile", cpu_profile, expect=3), 3, f"--ops-profile {cpu_profile}: measured on cpu",
        "--gpu h100")
# A GPU predict has no rates for (an A100): its times priced the H100 as that GPU without a word; exit 3 naming it.
a100_profile = profile_file("a100-profile.json", "cuda:0 (NVIDIA A100-SXM4-80GB, 79.2 GiB)", "cuda", "bf16",
                            "copy bf16[250] bf16[250]", 3e-6, 0, 1000)
refused(predict(*links2, "--ops-profile", a100_profile, expect=3), 3, f"--ops-profile {a100_profile}: measured on",
        "NVIDIA A100-SXM4-80GB", "a GPU predict has no rates for", "--gpu h100")
# --cpu-threads is the CPU backend's: with --gpu h100 it was ignored; now a usage error.
refused(predict(*links2, "--cpu-threads", "4", expect=2), 2, "--cpu-threads 4: only with --gpu cpu", "--gpu h100")
# CPU ranks without --links: the h100-dgx preset, and the report says so (the JSON too); with --links, no such note.
note = "no --links given: the CPU ranks' collectives are priced at the h100-dgx preset"
cpu_json = os.path.join(work, "cpu.json")
p = predict(*cpu2, "--ops-profile", cpu_profile, "--json", cpu_json)
check(note in p.stdout and json.load(open(cpu_json)).get("links_preset_for_cpu_ranks") is True, f"the preset said: {p.stdout[:900]}")
p = predict(*cpu2, "--ops-profile", cpu_profile, "--links", "profiles/cpu-this-machine/comm-np2.json", "--json", cpu_json)
check(note not in p.stdout and json.load(open(cpu_json)).get("links_preset_for_cpu_ranks") is False,
      f"measured links: no note: {p.stdout[:900]}")

# --cpu-threads: 1 to 1024, else exit 2 (-3 and 0 went through; 100000 was a segmentation fault).
for t in ["-3", "0", "1025", "100000"]:
    refused(predict(*cpu2, "--ops-profile", cpu_profile, "--cpu-threads", t, expect=2), 2,
            f"--cpu-threads: Value {t} not in range 1 to 1024")
p = predict(*cpu2, "--ops-profile", cpu_profile, "--cpu-threads", "3")
check(p.returncode == 0, "--cpu-threads 3 predicts")
# More threads than the system starts: a usage error naming the option (as prepare-data's --threads). As root the
# thread limit (RLIMIT_NPROC) does not apply, so the child becomes the user nobody first; OpenBLAS and OpenMP are kept
# to one thread each so that the limit is met where the threads are asked for.
def limited():
    if os.geteuid() == 0:
        os.setgid(65534)
        os.setuid(65534)
    resource.setrlimit(resource.RLIMIT_NPROC, (16, 16))


env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
p = subprocess.run([args.shardtrain, "predict", *cpu2, "--ops-profile", cpu_profile, "--cpu-threads", "1000"],
                   cwd=args.source, capture_output=True, text=True, timeout=120, env=env, preexec_fn=limited)
lines = [l for l in p.stderr.splitlines()
         if re.search(r"usage error: 1000 threads: the system started only \d+ \(.*\); give fewer with --cpu-threads$", l)]
check(p.returncode == 2 and len(lines) == 1 and p.stdout == "", f"threads the system refuses: exit {p.returncode}: {p.stderr[-600:]}")

# MFU above 100 % of the spec peak is no prediction: a profile whose every row took 1 ns (4x the peak at the seed's
# shape) is refused, exit 3, naming it; it printed MFU 100.0 % beside tokens/s of 411 %.
seed_profile = json.load(open(os.path.join(args.source, "profiles/h200/seed-b64-s512.json")))
fast = json.loads(json.dumps(seed_profile))
for r in fast["rows"]:
    r["seconds"] = 1e-9
fast_path = os.path.join(work, "fast.json")
json.dump(fast, open(fast_path, "w"))
seed1 = ["--config", "configs/llama-seed.toml", "--nodes", "1", "--gpus-per-node", "1", "--gpu", "h200"]
p = predict(*seed1, "--ops-profile", fast_path, expect=3)
refused(p, 3, f"--ops-profile {fast_path}: the predicted step would run at", "% of the NVIDIA H200's spec peak (989 TFLOP/s",
        "faster than the device's spec peak allows")
pct = re.search(r"run at ([0-9.]+) %", p.stderr)
check(pct is not None and float(pct.group(1)) > 100, f"the percentage said: {p.stderr[-300:]}")

# Several profiles are for several shapes. Two of one shape (the same file twice, or a copy) time the same calls:
# refused, exit 2, naming both and the shape. Profiles of different shapes both used; a call kind both time is priced
# by the first given, and the report says how many.
copy = os.path.join(work, "seed-copy.json")
shutil.copy(os.path.join(args.source, "profiles/h200/seed-b64-s512.json"), copy)
refused(predict(*seed1, *profile, "--ops-profile", copy, expect=2), 2,
        f"--ops-profile profiles/h200/seed-b64-s512.json and --ops-profile {copy}: both measured layers 12, hidden 768, "
        "heads 12/3, intermediate 3072, vocab 50000; batch 64 x seq 512, bf16")
rms = "rmsnorm_backward bf16[25165824] bf16[25165824] bf16[768] f32[32768] bf16[25165824] bf16[25165824] f32[768]"
other = profile_file("other-shape.json", "cuda:0 (NVIDIA H200, 139.8 GiB)", "cuda", "bf16", rms, 1e-3, 0, 1e8,
                     {"model": {"layers": 1, "hidden": 64, "heads": 2, "kv_heads": 2, "head_dim": 32, "intermediate": 128,
                                "vocab": 100}, "batch": 1, "seq": 16})
times = {}
for name, order in [("seed", profile), ("seed first", [*profile, "--ops-profile", other]),
                    ("other first", ["--ops-profile", other, *profile])]:
    out_json = os.path.join(work, f"order-{name.replace(' ', '-')}.json")
    p = predict(*seed1, *order, "--json", out_json)
    times[name] = ({o["op"]: o for o in json.load(open(out_json)).get("compute_by_op", [])}.get("rmsnorm_backward", {})
                   .get("seconds") if p.returncode == 0 else None, p.stdout)
check(times["seed"][0] is not None and times["seed first"][0] == times["seed"][0]
      and "1 of them priced by an earlier --ops-profile, given first" in times["seed first"][1],
      f"the seed first: its RMSNorm backward, and the other's one shared call kind said: {times['seed first'][1][:700]}")
check(times["other first"][0] is not None and times["other first"][0] != times["seed"][0]
      and "1 of them priced by an earlier --ops-profile, given first" in times["other first"][1],
      f"the other first: its 1 ms RMSNorm backward: {times['other first'][0]} {times['other first'][1][:700]}")

# CPU ranks' op times that no CPU runs: a profile whose rates take 1e300 s a call gave a 300-digit step and 0 tokens/s,
# one whose rates are 1e30 FLOP/s and bytes/s 87k tokens/s a rank, far above this CPU's fp32 ceiling; exit 3 for
# both, as the GPU's spec-peak check (the ceiling: cores x FMA lanes x clock, ops::cpu_fp32_ceiling).
def cpu_rates_profile(name, seconds, rate):
    path = profile_file(name, "cpu", "cpu", "f32", "copy f32[250] f32[250]", seconds, 0, 2000)
    j = json.load(open(path))
    j["ceilings"] = {"matmul_flops_per_s": rate, "copy_bytes_per_s": rate}
    json.dump(j, open(path, "w"))
    return path


one_cpu = ["--config", "configs/tiny-cpu.toml", "--gpu", "cpu", "--gpus-per-node", "1"]
slow = cpu_rates_profile("cpu-slow.json", 1e300, 1e-290)
refused(predict(*one_cpu, "--ops-profile", slow, expect=3), 3, f"--ops-profile {slow}; --links h100-dgx: the predicted step is",
        "tokens/s a rank, below 0.001")
quick = cpu_rates_profile("cpu-quick.json", 1e-300, 1e30)
refused(predict(*one_cpu, "--ops-profile", quick, expect=3), 3, f"--ops-profile {quick}: the predicted step would run at",
        "of this CPU's fp32 ceiling for a rank", "faster than the device's ceiling allows")

# CPU offload (fsdp.offload_params) allocated the offloaded fp32 state for real: 16 bytes a parameter on this machine's
# host, so Llama 3 8B on one GPU (128 GB) was OOM-killed. The timing device's pinned buffers hold no memory now, and the
# host AdamW over them is priced, not run: the prediction finishes in seconds with a small RSS.
def predict_rusage(*extra):
    out_path, err_path = os.path.join(work, "rusage.out"), os.path.join(work, "rusage.err")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        child = subprocess.Popen([args.shardtrain, "predict", *extra], cwd=args.source, stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024, open(out_path).read(), open(err_path).read()


offload_json = os.path.join(work, "offload.json")
start = time.monotonic()
rc, rss, out, err = predict_rusage("--config", "configs/llama3-8b.toml", "--nodes", "1", "--gpus-per-node", "1", "--gpu",
                                   "h200", "--fsdp.offload_params", "true", "--data.global_batch_size", "1", "--json",
                                   offload_json)
took = time.monotonic() - start
check(rc == 0 and rss < 2 * 2**30 and took < 60,
      f"8B offloaded on one GPU (128 GB of host state): exit {rc}, max RSS {rss / 2**30:.2f} GiB, {took:.1f} s: {err[-500:]}")
if rc == 0:
    o = json.load(open(offload_json))
    # The host update priced: 28 bytes an element of the 8.03B-parameter shard at the stated 50 GB/s is 4.5 s of host
    # work, on the step's critical path (compute waits for the host).
    check(o["host_idle_s"] > 4.0 and o["step_s"] > o["host_idle_s"], f"the host AdamW priced into the step: {o['host_idle_s']} s")
    # Copies have their own figures: neither exposed figure exceeds its total.
    check(o["comm_busy_s"] == 0 and o["exposed_comm_s"] == 0, f"one GPU: no collectives: {o['comm_busy_s']} {o['exposed_comm_s']}")
    check(0 < o["exposed_copy_s"] <= o["copy_busy_s"] + 1e-12,
          f"offload's copies: exposed {o['exposed_copy_s']} within their {o['copy_busy_s']}")
    check("copies h2d/d2h" in out, f"a copies line: {out[:1500]}")

# The audit's case (tiny-cpu on one H200 with offload): "collectives 0.00 ms in all; exposed 0.42 ms" before.
tiny_json = os.path.join(work, "offload-tiny.json")
p = predict("--config", "configs/tiny-cpu.toml", "--nodes", "1", "--gpus-per-node", "1", "--gpu", "h200",
            "--fsdp.offload_params", "true", "--json", tiny_json)
t = json.load(open(tiny_json)) if p.returncode == 0 else {}
check(t.get("exposed_comm_s") == 0 and t.get("comm_busy_s") == 0 and 0 < t.get("exposed_copy_s", 0) <= t.get("copy_busy_s", 0),
      f"tiny offloaded: collectives {t.get('comm_busy_s')} exposed {t.get('exposed_comm_s')}; copies "
      f"{t.get('copy_busy_s')} exposed {t.get('exposed_copy_s')}")
m = re.search(r"collectives +([0-9.]+) ms in all; exposed ([0-9.]+) ms", p.stdout)
check(m is not None and float(m.group(2)) <= float(m.group(1)), f"the collectives line: {p.stdout[:1200]}")

if failures:
    print(f"{len(failures)} check(s) failed", file=sys.stderr)
    sys.exit(1)
print("predict: all checks passed")
