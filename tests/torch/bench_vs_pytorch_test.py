#!/usr/bin/env python3
"""scripts/bench-vs-pytorch.py whole, its PyTorch side included, before a GPU session depends on it: all four
parts on the CPU (`--torch-device cpu`: PyTorch FSDP2 over gloo, fully_shard per decoder layer and at the
root, a bf16 MixedPrecisionPolicy, torch.compile per layer; shardtrain's `bench step` under mpirun), on a small
Llama and a dataset made here, in one table. Asserted:
- every part ran (no error), and each row of the markdown table is filled, with the CPU note;
- the same model and batch on both sides: the same tokens per step, the same FLOPs per token (from each
  side's own parameter count), PyTorch's parameter count equal to the Llama formula's, its batches read
  from the dataset file (not the random fallback), its attention SDPA and its MixedPrecisionPolicy bf16;
- the compiled part compiles the loss too, the attention backend and graph breaks are recorded, and every MFU
  says its denominator (on a CPU: each side's own measured peak);
- eager and torch.compile start from the same weights and batches, so their last losses agree (bf16
  compute, compiled kernels round differently: 2e-2 relative) and are finite and below ln(V) + 1;
- the ratios are the quotients of the rows' figures, and the memory ratio compares peak RSS with peak RSS.
This checks the script; it is not a benchmark (each side on its own CPU BLAS)."""
import importlib.util
import json
import math
import os
import subprocess
import sys

from torch_env import Test

t = Test(with_dataset=True)
args, check, work, env, tok, ds = t.args, t.check, t.work, t.env, t.tokenizer, t.dataset

V, D, F, L, H, K, S, B = 512, 128, 320, 2, 4, 2, 64, 8
config = os.path.join(work, "bench.toml")
with open(config, "w") as f:
    f.write(f"[model]\nvocab_size = {V}\nhidden_size = {D}\nintermediate_size = {F}\nnum_hidden_layers = {L}\n"
            f"num_attention_heads = {H}\nnum_key_value_heads = {K}\nmax_position_embeddings = 128\n\n"
            "[fsdp]\nstrategy = \"FULL_SHARD\"\nparam_dtype = \"bf16\"\nreduce_dtype = \"fp32\"\n\n"
            "[optim]\nlr = 1e-3\nmax_grad_norm = 1.0\n\n"
            f"[data]\npath = \"{ds}\"\nlayout = \"packed\"\nseq_len = {S}\nglobal_batch_size = {B}\n")
out = os.path.join(work, "out")
cmd = [sys.executable, os.path.join(args.source, "scripts", "bench-vs-pytorch.py"), "--config", config,
       "--shardtrain", args.shardtrain, "--launcher", f"{args.mpiexec} --oversubscribe -np 1",
       "--torch-device", "cpu", "--torch-python", f"{env.script} run python3", "--steps", "2", "--warmup", "1",
       "--timeout", "400", "--out", out]
p = subprocess.run(cmd, cwd=args.source, capture_output=True, text=True, timeout=1200)
print(p.stdout[-6000:])
check(p.returncode == 0, f"bench-vs-pytorch.py exit {p.returncode}: {p.stderr[-3000:]}")
report = json.load(open(os.path.join(out, "bench-vs-pytorch.json")))
table = open(os.path.join(out, "bench-vs-pytorch.md")).read()
results, errors, ratios = report["results"], report["errors"], report["ratios"]
parts = ["shardtrain", "shardtrain+offload", "PyTorch eager", "PyTorch compile"]
check(not errors and sorted(results) == sorted(parts), f"parts: ran {sorted(results)}, errors {errors}")

if not errors and sorted(results) == sorted(parts):
    st, eager, comp = results["shardtrain"], results["PyTorch eager"], results["PyTorch compile"]
    params = V * D * 2 + L * (D * D * 2 + 2 * D * (D // H) * K + 3 * D * F + 2 * D) + D  # untied: embedding + lm_head
    fpt = 6.0 * (params - V * D) + 12.0 * L * D * S
    for name in parts:
        r = results[name]
        check(r["tokens_per_step"] == B * S, f"{name}: {r['tokens_per_step']} tokens per step, expected {B * S}")
        check(abs(r["flops_per_token"] - fpt) <= 1e-9 * fpt, f"{name}: {r['flops_per_token']} FLOPs per token, expected {fpt}")
        check(r["tokens_per_s"] > 0 and r["step_time_median_s"] > 0 and 0 < r["mfu"] <= 1,  # never above 100 %
              f"{name}: tokens/s {r['tokens_per_s']}, step {r['step_time_median_s']}, MFU {r['mfu']}")
        check(f"| {name} | " in table, f"the table has no row for {name}")
        last = r.get("last_loss")
        check(last is not None and math.isfinite(last) and last < math.log(V) + 1,
              f"{name}: last loss {last} (ln V = {math.log(V):.3f})")
    for r in (eager, comp):
        check(r["params"] == params, f"{r['name']}: {r['params']} parameters, the Llama formula says {params}")
        check(r["device"] == "cpu" and r["attn_implementation"] == "sdpa" and ds in r["data"],
              f"{r['name']}: device {r['device']}, attention {r['attn_implementation']}, data {r['data']}")
        check(r["peak_memory_source"] == "peak RSS of the process" and r["peak_memory_bytes"] > 0, f"{r['name']}: memory {r}")
    check(comp["compile"] == "torch.compile per decoder layer and of the loss" and eager["compile"] == "eager",
          f"the two PyTorch parts' modes: {comp['compile']!r}, {eager['compile']!r}")
    check(eager["sdpa_backend"] == "default (CPU)" and isinstance(comp["graph_breaks"], dict),
          f"attention backend and graph breaks recorded: {eager.get('sdpa_backend')}, {comp.get('graph_breaks')}")
    # No datasheet figure for a CPU: every MFU is of its side's own measured peak, and the table says so.
    check("of each side's own measured peak" in table and st.get("peak_kind") == "measured",
          f"the MFU's denominator: peak_kind {st.get('peak_kind')}")
    for r in (eager, comp):
        check(abs(r["mfu"] - r["mfu_measured_peak"]) < 1e-12, f"{r['name']}: MFU {r['mfu']} is not of its measured peak")
    rel = abs(eager["last_loss"] - comp["last_loss"]) / abs(eager["last_loss"])
    print(f"losses: shardtrain {st['last_loss']:.4f}, PyTorch eager {eager['last_loss']:.4f}, compile {comp['last_loss']:.4f} "
          f"(eager vs compile {rel:.1e} relative)")
    check(rel < 2e-2, f"eager and compiled PyTorch from the same weights and batches: losses {eager['last_loss']} and {comp['last_loss']}")
    check(abs(ratios["vs_eager"] - st["tokens_per_s"] / eager["tokens_per_s"]) < 1e-9 * ratios["vs_eager"]
          and abs(ratios["offload"] - results["shardtrain+offload"]["tokens_per_s"] / st["tokens_per_s"]) < 1e-9,
          f"ratios {ratios}")
    check(abs(ratios["memory_vs_eager"] - st["rss_peak_bytes"] / eager["peak_memory_bytes"]) < 1e-9,
          f"memory ratio {ratios['memory_vs_eager']}: not shardtrain's peak RSS over PyTorch's")
    # Each ratio row shows its value on the side of the target its verdict says (49.99 % is not "50.0 %").
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) != 4 or cells[3] not in ("meets", "misses"):
            continue
        value = float(cells[1].rstrip("x%").strip())
        op, target = cells[2].split()[0], float(cells[2].split()[1].rstrip("x%"))
        shown_meets = value >= target if op == ">=" else value <= target
        check(shown_meets == (cells[3] == "meets"), f"ratio row shows {cells[1]} against {cells[2]} but says {cells[3]}")
    check("NOTE: PyTorch ran on the CPU" in table, "the table does not say the PyTorch side ran on the CPU")
    check("WARNING" not in table, "the table warns: " + table[table.find("WARNING"):][:300])

# The decimals of a figure next to its target: as many as keep it on its side of the target.
spec = importlib.util.spec_from_file_location("bench_vs_pytorch", os.path.join(args.source, "scripts", "bench-vs-pytorch.py"))
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
for value, target, higher, want in ((0.4999173551, 0.5, True, "0.4999x"), (0.526, 0.5, True, "0.53x"), (0.4996, 0.5, True, "0.4996x"),
                                    (1.004, 1.0, False, "1.004x"), (0.37, 1.0, False, "0.37x"), (1.3, 1.3, True, "1.30x")):
    got = bench.fmt_ratio(value, target, higher)
    check(got == want, f"fmt_ratio({value}, {target}, {higher}) = {got}, expected {want}")
check(bench.decimals_for(49.991735, 50.0, True, 1) == 2 and bench.decimals_for(52.6, 50.0, True, 1) == 1,
      "decimals_for: 49.991735 % against 50 % needs 2 decimals, 52.6 % needs 1")

check.finish("bench-vs-pytorch.py: four parts on the CPU, the same model and batch, consistent rows and ratios")
