#!/usr/bin/env python3
"""`shardtrain plan --config` end to end (offline, no MPI):
- the plan of configs/tiny-cpu.toml on 2 nodes x 2 GPUs equals the plan from the same model, FSDP options,
  sequence length and micro-batch given as options (taken from the TOML file itself here);
- an option given explicitly overrides the config (--strategy, --layers, --micro-batch), the rest still
  comes from the config;
- --gpu-memory: 80GiB and 80 are 80 x 2^30 bytes, 80GB is 80 x 10^9, and the fits column follows;
- the strategy table's hybrid rows on the configured shard size (the 70B config's 32), agreeing with `check`;
- an Accelerate YAML over the config gives the cluster (num_processes / num_machines) and its FSDP keys;
- the config's --section.key overrides apply as train applies them (a job's TRAIN_ARGS);
- the step-time estimate is a whole step's: compute x accumulation steps, communication per fsdp.grad_accumulation
  (reduce_each, no_sync, all_reduce_last), against the formula over the JSON's traffic; its rate said as a fraction
  of the GEMM peak and as MFU of the spec peak, and marked an estimate (text and JSON);
- bad input: one clear error and the documented exit code (2: a bad --gpu-memory; 3: a missing or bad
  config file, or a global batch the planned world cannot split)."""
import json
import os
import subprocess
import sys
import tomllib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
GIB = 1 << 30


def plan(*cli):
    p = subprocess.run([args.shardtrain, "plan", *cli], cwd=args.source, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def plan_json(*cli):
    rc, out, err = plan(*cli, "--json")
    check(rc == 0, f"plan {' '.join(cli)}: exit {rc}: {err}")
    return json.loads(out) if rc == 0 else {}


def by_strategy(j):
    return {e["strategy"]: e for e in j.get("strategies", [])}


# The config, and the same plan from options: the model shape, [fsdp] and data.seq_len from the file itself,
# the micro-batch as the trainer derives it (global_batch_size / world, no data.micro_batch_size there).
with open(os.path.join(args.source, "configs/tiny-cpu.toml"), "rb") as f:
    toml = tomllib.load(f)
m, fs, data = toml["model"], toml["fsdp"], toml["data"]
world = 2 * 2
check("micro_batch_size" not in data and data["global_batch_size"] % world == 0, "tiny-cpu.toml: global batch split over 4 ranks")
explicit = ["--nodes", "2", "--gpus-per-node", "2", "--vocab", str(m["vocab_size"]), "--hidden", str(m["hidden_size"]),
            "--intermediate", str(m["intermediate_size"]), "--layers", str(m["num_hidden_layers"]),
            "--heads", str(m["num_attention_heads"]), "--kv-heads", str(m["num_key_value_heads"]),
            "--strategy", fs["strategy"], "--wrap", fs["auto_wrap_policy"], "--wrap-cls", *fs["transformer_layer_cls_to_wrap"],
            "--param-dtype", fs["param_dtype"], "--reduce-dtype", fs["reduce_dtype"],
            "--forward-prefetch", "1", "--backward-prefetch", "1",  # [fsdp]'s defaults, the file leaves them out
            "--seq", str(data["seq_len"]), "--micro-batch", str(data["global_batch_size"] // world)]
from_config = plan_json("--config", "configs/tiny-cpu.toml", "--nodes", "2", "--gpus-per-node", "2")
from_options = plan_json(*explicit)
check(from_config.get("config") == {"source": "configs/tiny-cpu.toml", "global_batch_size": 16, "accumulation_steps": 1},
      f"the config block: {from_config.get('config')}")
inputs = from_config.get("inputs", {})
check(inputs.get("model", {}).get("hidden_size") == 192 and inputs.get("model", {}).get("num_hidden_layers") == 4,
      f"model shape from the config: {inputs.get('model')}")
check(inputs.get("seq") == 128 and inputs.get("micro_batch") == 4, f"seq 128 and micro-batch 16 / 4 = 4: {inputs}")
check(inputs.get("fsdp", {}).get("param_dtype") == "f32", f"param_dtype fp32 from the config (the option's default is bf16): {inputs}")
check(from_config.get("mesh") == {"replicate": 1, "shard": 4, "strategy": "FULL_SHARD"}, f"mesh {from_config.get('mesh')}")
check(from_config.get("params") == 3147456, f"tiny-cpu has 3147456 parameters: {from_config.get('params')}")
without_config = {k: v for k, v in from_config.items() if k != "config"}
check(without_config == from_options, "plan --config equals the plan from the same values as options: " +
      str([k for k in from_options if from_options.get(k) != without_config.get(k)]))
rc, text, err = plan("--config", "configs/tiny-cpu.toml", "--nodes", "2", "--gpus-per-node", "2")
check(rc == 0 and "config: configs/tiny-cpu.toml" in text and "micro-batch 4 per rank = global batch 16 / 4 ranks" in text,
      f"the text output names the config and the micro-batch: {text[:400]} {err}")

# Explicit options win over the config; what they leave out still comes from it.
j = plan_json("--config", "configs/tiny-cpu.toml", "--nodes", "2", "--gpus-per-node", "2", "--strategy", "NO_SHARD",
              "--layers", "2", "--micro-batch", "2")
check(j.get("mesh") == {"replicate": 4, "shard": 1, "strategy": "NO_SHARD"}, f"--strategy NO_SHARD wins: {j.get('mesh')}")
check(j.get("inputs", {}).get("model", {}).get("num_hidden_layers") == 2, "--layers 2 wins")
check(j.get("inputs", {}).get("model", {}).get("hidden_size") == 192, "hidden_size still from the config")
check(j.get("inputs", {}).get("micro_batch") == 2 and j.get("config", {}).get("accumulation_steps") == 2,
      f"--micro-batch 2 wins: 16 / (2 x 4) = 2 accumulation steps: {j.get('inputs')} {j.get('config')}")
check(0 < j.get("params", 0) < from_config.get("params", 0), "two layers hold fewer parameters than four")
check(j.get("memory_per_rank_bytes", {}).get("grads_in_activation_memory") == 0,
      "two accumulation steps: no gradient shard in activation memory (the next forward would overwrite it)")

# Gradient shards in activation memory (docs/fsdp.md, "Gradient memory"): Llama 3 8B's layer shape on one GPU puts
# every unit's shard there but the lm_head's (written while every activation is alive) and the last layer's
# (written before any layer's backward is done); the device figure drops by as much.
j8 = plan_json("--config", "configs/llama-8b-layers.toml")
shards = {("root" if u["root"] else u["name"]): u["shard_numel"] for u in j8.get("units", [])}
expected = 4 * sum(n for name, n in shards.items() if name not in ("root", "model.layers.7"))
placed = j8.get("memory_per_rank_bytes", {}).get("grads_in_activation_memory")
check(len(shards) == 10 and placed == expected, f"8B layers: {placed} bytes of gradient shards in activation memory, expected {expected}")
with open(os.path.join(args.source, "configs/llama-8b-layers.toml")) as f:
    own_text = f.read().replace("[fsdp]\n", "[fsdp]\ngrads_in_activation_memory = false\n", 1)
own_config = os.path.join(work, "8b-layers-own-grads.toml")
with open(own_config, "w") as f:
    f.write(own_text)
own = plan_json("--config", own_config)
device = by_strategy(j8).get("FULL_SHARD", {}).get("device_bytes", 0)
device_own = by_strategy(own).get("FULL_SHARD", {}).get("device_bytes", 0)
# Less the stage that holds the final norm's gradient until the embedding's backward: room for every RMSNorm weight
# (2 per layer and the final one, 4096 floats each).
stage = (2 * 8 + 1) * 4096 * 4
check(own.get("memory_per_rank_bytes", {}).get("grads_in_activation_memory") == 0 and device_own - device == expected - stage,
      f"fsdp.grads_in_activation_memory = false: the device figure {device_own} is {expected} - {stage} above {device}")
rc, text8, err8 = plan("--config", "configs/llama-8b-layers.toml")
check(rc == 0 and "gradient shards: 7.645 GiB of the 10.414 GiB in activation memory" in text8,
      f"the text output says how much: {text8[-1500:]} {err8}")

# The strategy table's hybrid rows use the configured shard size (fsdp.shard_size 32 in the 70B config: 2 replicas of
# 32 on 8 x 8), so that the configured strategy's row is the plan's own and agrees with `check` and `predict`; they
# were priced with a node a shard group (8), 154.56 GiB against the 57.32 both of those say. --shard-size overrides it.
seventy = ["--config", "configs/llama3-70b-hybrid.toml", "--nodes", "8", "--gpus-per-node", "8"]
j70 = plan_json(*seventy)
rows70 = by_strategy(j70)
hybrid = rows70.get("HYBRID_SHARD", {})
check(j70.get("mesh") == {"replicate": 2, "shard": 32, "strategy": "HYBRID_SHARD"}, f"70B mesh {j70.get('mesh')}")
check(hybrid.get("mesh") == {"replicate": 2, "shard": 32} and rows70.get("HYBRID_SHARD_ZERO2", {}).get("mesh") == hybrid.get("mesh"),
      f"the hybrid rows on the configured mesh 2 x 32: {hybrid.get('mesh')}")
check(round(hybrid.get("device_bytes", 0) / GIB, 2) == 57.32 and hybrid.get("fits") is True,
      f"HYBRID_SHARD row 57.32 GiB, fits 80 GiB: {hybrid.get('device_bytes', 0) / GIB:.2f} {hybrid.get('fits')}")
check(round(rows70.get("FULL_SHARD", {}).get("device_bytes", 0) / GIB, 2) == 44.71
      and rows70.get("FULL_SHARD", {}).get("mesh") == {"replicate": 1, "shard": 64}, f"FULL_SHARD row as it was: {rows70.get('FULL_SHARD')}")
chk = subprocess.run([args.shardtrain, "check", *seventy, "--gpu-memory", "80GiB"], cwd=args.source, capture_output=True,
                     text=True, timeout=60)
memory_line = [l for l in chk.stdout.splitlines() if l.strip().startswith("memory")]
check(len(memory_line) == 1 and f"about {hybrid.get('device_bytes', 0) / GIB:.2f} of 80 GiB" in memory_line[0],
      f"check says the HYBRID_SHARD row's figure: {memory_line} {chk.stderr[-400:]}")
rc, text70, err70 = plan(*seventy)
check(rc == 0 and "hybrid rows: mesh 2 (replicate) x 32 (shard), shard groups of fsdp.shard_size" in text70,
      f"the text names the hybrid rows' mesh: {text70[-900:]} {err70}")
j8 = plan_json(*seventy, "--shard-size", "8")
h8 = by_strategy(j8).get("HYBRID_SHARD", {})
check(j8.get("mesh", {}).get("shard") == 8 and h8.get("mesh") == {"replicate": 8, "shard": 8}
      and round(h8.get("device_bytes", 0) / GIB, 2) == 154.56 and h8.get("fits") is False,
      f"--shard-size 8: the row on 8 x 8, 154.56 GiB, does not fit: {h8}")
# Without a shard size, a hybrid row has a node a shard group.
jt = plan_json("--config", "configs/tiny-cpu.toml", "--nodes", "2", "--gpus-per-node", "2")
check(by_strategy(jt).get("HYBRID_SHARD", {}).get("mesh") == {"replicate": 2, "shard": 2}, f"tiny-cpu's hybrid row: {by_strategy(jt).get('HYBRID_SHARD')}")

# --gpu-memory: the parsed size, and the fits column on a size between NO_SHARD's need in GB and in GiB.
for text, expected in [("80GiB", 80 * GIB), ("80", 80 * GIB), ("80GB", 80 * 10**9), ("80gb", 80 * 10**9), ("0.5GiB", GIB // 2)]:
    j = plan_json("--config", "configs/tiny-cpu.toml", "--nodes", "2", "--gpus-per-node", "2", "--gpu-memory", text)
    check(j.get("inputs", {}).get("gpu_memory_bytes") == expected, f"--gpu-memory {text}: {j.get('inputs', {}).get('gpu_memory_bytes')}, expected {expected}")
need = by_strategy(from_config)["NO_SHARD"]["device_bytes"]
size = f"{need * 1.03 / GIB:.9f}"  # 1.03 x the need in GiB; the same number in GB is 0.96 x the need
fits = {}
for unit in ("GiB", "", "GB"):
    j = plan_json("--config", "configs/tiny-cpu.toml", "--nodes", "2", "--gpus-per-node", "2", "--gpu-memory", size + unit)
    fits[unit] = by_strategy(j).get("NO_SHARD", {}).get("fits")
check(fits == {"GiB": True, "": True, "GB": False}, f"NO_SHARD needs {need:.0f} bytes; fits with {size} GiB/(none)/GB: {fits}")
j = plan_json("--config", "configs/tiny-cpu.toml", "--nodes", "2", "--gpus-per-node", "2", "--gpu-memory", "0.001GB")
check(j.get("recommended") is None and not any(e["fits"] for e in j.get("strategies", [])), "nothing fits in 1 MB")

# An Accelerate YAML over the config: 2 processes on 1 machine, FULL_SHARD with CPU offload (its keys).
j = plan_json("--config", "configs/tiny-cpu.toml", "--accelerate-config", "configs/examples/accelerate_fsdp.yaml")
check(j.get("inputs", {}).get("nodes") == 1 and j.get("inputs", {}).get("gpus_per_node") == 2,
      f"the cluster from num_processes 2 / num_machines 1: {j.get('inputs')}")
check(j.get("inputs", {}).get("fsdp", {}).get("offload") is True and j.get("inputs", {}).get("micro_batch") == 8,
      f"fsdp_offload_params true, micro-batch 16 / 2: {j.get('inputs')}")

# Bad input: one clear error each, with its exit code.
bad_toml = os.path.join(work, "bad.toml")
with open(bad_toml, "w") as f:
    f.write("[model]\nhidden_sise = 64\n")
missing = os.path.join(work, "missing.toml")
bad = [
    (["--gpu-memory", "80G"], 2, "--gpu-memory: '80G' is not a memory size"),
    (["--gpu-memory", "eighty"], 2, "--gpu-memory: 'eighty' is not a memory size"),
    (["--gpu-memory", "-5GiB"], 2, "--gpu-memory: '-5GiB' is not a memory size"),
    (["--gpu-memory", "80 GiB"], 2, "expected a positive number of GiB (80), or one with a unit: 80GiB (2^30 bytes each) or 80GB"),
    (["--config", missing], 3, f"{missing}: cannot read the config file"),
    (["--config", bad_toml], 3, "hidden_sise"),
    (["--config", "configs/tiny-cpu.toml", "--nodes", "3", "--gpus-per-node", "2"], 3,
     "data.global_batch_size: 16 sequences cannot be split evenly over 6 ranks"),
    (["--accelerate-config", "configs/examples/accelerate_fsdp.yaml"], 2, "give it with --config FILE"),
    (["--data.global_batch_size", "64"], 2, "--section.key options adjust a training config: give it with --config FILE"),
    (["--config", "configs/tiny-cpu.toml", "--model.hidden_size", "abc"], 3, "model.hidden_size: expected an integer, got 'abc'"),
]
for cli, code, message in bad:
    rc, out, err = plan(*cli)
    check(rc == code, f"plan {' '.join(cli)}: exit code {rc}, expected {code}: {err}")
    lines = [l for l in err.splitlines() if message in l]
    check(len(lines) == 1, f"plan {' '.join(cli)}: '{message}' once in: {err[-500:]}")
    check(out == "", f"plan {' '.join(cli)}: nothing on stdout: {out[:200]}")
rc, out, err = plan("--config", bad_toml)
check(bad_toml in err, f"the bad config's error names the file: {err}")
# With --micro-batch, a world that cannot split the global batch still plans.
rc, out, err = plan("--config", "configs/tiny-cpu.toml", "--nodes", "3", "--gpus-per-node", "2", "--micro-batch", "1", "--json")
check(rc == 0 and json.loads(out)["inputs"]["micro_batch"] == 1, f"--micro-batch 1 on 6 ranks: exit {rc}: {err}")
# The config's --section.key overrides, as train takes them (a job's TRAIN_ARGS): a global batch they make fit plans,
# and a model key they change is the plan's.
j = plan_json("--config", "configs/tiny-cpu.toml", "--nodes", "4", "--gpus-per-node", "8", "--data.global_batch_size", "64",
              "--model.num_hidden_layers", "2")
check(j.get("config", {}).get("global_batch_size") == 64 and j["inputs"]["micro_batch"] == 2
      and "1 override(s)" not in j["config"]["source"] and "2 override(s)" in j["config"]["source"], f"overrides: {j.get('config')} {j.get('inputs')}")
check(j.get("inputs", {}).get("model", {}).get("num_hidden_layers") == 2, f"--model.num_hidden_layers 2: {j.get('inputs')}")

# The step-time estimate is a step's, not one micro-batch's (it was: llama3-8b's global batch of 32 on 8 GPUs took
# 1201 / 2402 / 4804 ms at micro-batches of 1 / 2 / 4). Compute is the step's FLOPs, the same however the batch is cut;
# communication follows fsdp.grad_accumulation: every micro-batch gathers its units again; reduce_each reduces every
# micro-batch, no_sync once, all_reduce_last reduce-scatters every micro-batch and all-reduces over replicas once.
def estimate_of(strategy, *cli, global_batch=32):
    j = plan_json("--config", "configs/llama3-8b.toml", "--gpu-memory", "1000GiB", "--data.global_batch_size",
                  str(global_batch), *cli)
    return j, by_strategy(j).get(strategy, {})


eight = ["--nodes", "1", "--gpus-per-node", "8"]
rows = {mb: estimate_of("FULL_SHARD", *eight, "--data.micro_batch_size", str(mb)) for mb in (1, 2, 4)}
compute = {mb: r[1].get("compute_s", 0) for mb, r in rows.items()}
check(compute[1] > 0 and abs(compute[2] / compute[1] - 1) < 1e-12 and abs(compute[4] / compute[1] - 1) < 1e-12,
      f"a step's compute whatever the micro-batch: {compute}")
# 4 micro-batches of 1 = the FLOPs of a global batch of 8 (one micro-batch a step) four times over.
_, single = estimate_of("FULL_SHARD", *eight, "--data.micro_batch_size", "1", global_batch=8)
check(abs(compute[1] / single.get("compute_s", 1) - 4) < 1e-9, f"4 accumulation steps: 4x one's compute: {compute[1]} {single}")
for mb, (j, row) in rows.items():
    A = 32 // (8 * mb)
    t = j["traffic_per_micro_batch_bytes"]
    want = 7 / 8 * A * (t["all_gather_shard"] + t["reduce_scatter_shard"]) / 360e9  # reduce_each, NVLink's 360 GB/s
    check(j["step_estimate"]["accumulation_steps"] == A and abs(row.get("comm_s", 0) / want - 1) < 1e-9,
          f"micro-batch {mb}: {A} accumulation steps, comm {row.get('comm_s')} s, expected {want}")
    check(row.get("step_s") == max(row.get("compute_s"), row.get("comm_s")), f"micro-batch {mb}: step = max: {row}")
# no_sync: gathers every micro-batch, one reduce-scatter a step.
j, row = estimate_of("FULL_SHARD", *eight, "--data.micro_batch_size", "1", "--fsdp.grad_accumulation", "no_sync")
t = j["traffic_per_micro_batch_bytes"]
want = 7 / 8 * (4 * t["all_gather_shard"] + t["reduce_scatter_shard"]) / 360e9
check(abs(row.get("comm_s", 0) / want - 1) < 1e-9, f"no_sync: comm {row.get('comm_s')} s, expected {want}")
# all_reduce_last on 2 nodes x 4 GPUs of HYBRID_SHARD: the replicas' all-reduce once a step, over the 50 GB/s network.
hybrid = ["--nodes", "2", "--gpus-per-node", "4", "--data.micro_batch_size", "1", "--fsdp.strategy", "HYBRID_SHARD"]
for mode, all_reduces in (("reduce_each", 4), ("all_reduce_last", 1), ("no_sync", 1)):
    j, row = estimate_of("HYBRID_SHARD", *hybrid, "--fsdp.grad_accumulation", mode)
    t = j["traffic_per_micro_batch_bytes"]
    scatters = 1 if mode == "no_sync" else 4
    want = (3 / 4 * (4 * t["all_gather_shard"] + scatters * t["reduce_scatter_shard"]) / 360e9
            + 2 * 1 / 2 * all_reduces * t["all_reduce_replicate"] / 50e9)
    check(t["all_reduce_replicate"] > 0 and abs(row.get("comm_s", 0) / want - 1) < 1e-9,
          f"HYBRID_SHARD {mode}: comm {row.get('comm_s')} s, expected {want}")

# "50% MFU" was 50 % of a measured 790 TFLOP/s GEMM peak: 39.9 % MFU of the 989 TFLOP/s spec peak the project's MFU
# divides by. The table says both, and that its times are an estimate; the JSON too.
rc, out, err = plan("--config", "configs/llama3-8b.toml", *eight)
check(rc == 0 and "395 TFLOP/s a GPU (50% of a 790 TFLOP/s GEMM peak = 39.9% MFU of the H100/H200's 989 TFLOP/s dense "
      "bf16 spec peak)" in out and "ESTIMATE" in out and "at 50% MFU" not in out, f"the estimate's rate said: {out[-1500:]}")
j = plan_json("--config", "configs/llama3-8b.toml", *eight)
e = j.get("step_estimate", {})
check(j.get("estimate") is True and abs(e.get("mfu_of_spec_peak", 0) - 0.5 * 790 / 989) < 1e-12
      and e.get("spec_peak_flops") == 989e12 and e.get("fraction_of_gpu_tflops") == 0.5, f"the JSON's estimate: {e}")
rc, out, err = plan("--help")
check("39.9 % MFU of the 989 spec peak" in out, f"--mfu's help says what it is a fraction of: {out[-1500:]}")
# --wrap-cls as train's --fsdp.transformer_layer_cls_to_wrap takes it: a comma-separated list (it was one unknown class
# "LlamaAttention,LlamaMLP", exit 3), the same plan as the names given one by one.
comma, spaced = (plan_json("--layers", "2", "--wrap-cls", *names) for names in (["LlamaAttention,LlamaMLP"],
                                                                               ["LlamaAttention", "LlamaMLP"]))
check(comma == spaced and len(comma.get("units", [])) == 6, f"--wrap-cls with commas: {comma.get('units')} vs {spaced.get('units')}")

check.finish("all plan CLI checks passed")
