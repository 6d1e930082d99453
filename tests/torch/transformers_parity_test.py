#!/usr/bin/env python3
"""shardtrain's Llama against Hugging Face transformers' LlamaForCausalLM itself (PyTorch's CPU build, in
scripts/torch-env.sh), through the same scripts/parity-transformers.py the GPU session runs:
- `shardtrain parity dump` (CPU backend) on configs/tiny-cpu.toml's model (4 layers, 6 query heads over 2
  key/value heads, untied, padded rows): loss and every gradient within the f32 limits of
  parity-transformers.py (loss 1e-5 relative; per tensor cosine > 0.99999 and largest difference < 1e-4 of
  the tensor's scale), with transformers' eager attention and with its SDPA;
- tied embeddings and a RoPE base of 500 (what config.json must carry for transformers to agree);
- bf16 activations against transformers in bf16, within the bf16 limits (5e-3; 0.999 and 0.1);
- Llama 3.1's RoPE scaling (rope_type llama3) from a transformers-written config, against transformers; the
  same weights with plain RoPE differ far beyond the limits at these positions;
- weights transformers wrote itself (save_pretrained, bf16 and f32, sharded into several files with an
  index, tied and untied, a RoPE base of 500 in transformers 5's rope_parameters): `parity dump --init-from`
  reads them, its hf/ holds the same values, and the loss and gradients agree with transformers' run on
  the directory transformers wrote (its own config.json: a RoPE base read wrong fails here);
- the check fails where it should: one gradient tensor off by 0.1 % (FAIL names it), and the q/k rows of
  every head in the interleaved RoPE order instead of transformers' rotate-half order (the classic
  conversion error: the loss moves far outside the limit)."""
import json
import os
import re
import shutil
import struct
import subprocess

import numpy as np

from torch_env import Test

t = Test()
args, check, work, env = t.args, t.check, t.work, t.env
PARITY = os.path.join(args.source, "scripts", "parity-transformers.py")


def dump(name, *cli):
    out = os.path.join(work, name)
    p = subprocess.run([args.shardtrain, "parity", "dump", "--device", "cpu", "--out", out, *cli, "--log-level", "warn"],
                       cwd=args.source, capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"{name}: parity dump exit {p.returncode}: {p.stderr}")
    return out if p.returncode == 0 else None


def parity(name, directory, *flags):
    """Runs parity-transformers.py; returns (exit code, loss relative difference, worst scaled, lowest cosine)."""
    rc, out, err = env.run("python3", PARITY, directory, *flags)
    lines = [l for l in out.splitlines() if l.startswith(("loss:", "gradients:", "PASS", "FAIL", "reference:"))]
    print(f"--- {name}: parity-transformers.py {' '.join(flags)} (exit {rc})\n" + "\n".join(lines))
    loss = re.search(r"rel diff ([0-9.e+-]+)", out)
    grads = re.search(r"worst scaled difference ([0-9.e+-]+) .*lowest cosine ([0-9.]+)", out)
    if not loss or not grads:
        check(False, f"{name}: no loss/gradient summary in the output (exit {rc}):\n{out}\n{err[-2000:]}")
        return rc, None, None, None
    return rc, float(loss.group(1)), float(grads.group(1)), float(grads.group(2))


def expect_pass(name, directory, loss_limit, scaled_limit, cosine_limit, *flags):
    rc, loss, scaled, cosine = parity(name, directory, *flags)
    check(rc == 0, f"{name}: parity-transformers.py exit {rc}, expected PASS")
    if loss is not None:
        check(loss <= loss_limit and scaled <= scaled_limit and cosine >= cosine_limit,
              f"{name}: loss {loss:.2e} (<= {loss_limit:g}), scaled {scaled:.2e} (<= {scaled_limit:g}), "
              f"cosine {cosine:.9f} (>= {cosine_limit})")


class Safetensors:
    """One safetensors file, edited in place (same dtype and shape, so the header stays as it is)."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self.raw = bytearray(f.read())
        (n,) = struct.unpack("<Q", self.raw[:8])
        self.base = 8 + n
        self.header = json.loads(self.raw[8:self.base])

    def get(self, name):
        info = self.header[name]
        check(info["dtype"] == "F32", f"{self.path}: {name} is {info['dtype']}, the edit expects F32")
        b, e = info["data_offsets"]
        return np.frombuffer(bytes(self.raw[self.base + b:self.base + e]), dtype="<f4").reshape(info["shape"]).copy()

    def put(self, name, value):
        b, e = self.header[name]["data_offsets"]
        self.raw[self.base + b:self.base + e] = np.ascontiguousarray(value, dtype="<f4").tobytes()

    def save(self):
        with open(self.path, "wb") as f:
            f.write(self.raw)


# ---- f32, configs/tiny-cpu.toml's model as it is: 4 layers, hidden 192, 6 heads over 2 key/value heads, vocab 4096.
# Measured here: loss 9e-8 relative, gradients 2e-6 of a tensor's scale, cosine 1.0 to 9 digits.
f32 = dump("f32", "--config", "configs/tiny-cpu.toml", "--batch", "4", "--seq", "64", "--seed", "7")
if f32:
    expect_pass("f32 eager", f32, 1e-6, 1e-5, 0.9999999)
    expect_pass("f32 sdpa", f32, 1e-6, 1e-5, 0.9999999, "--attention", "sdpa")

# ---- tied embeddings, RoPE base 500, 3 of 4 rows padded, pad id 0.
tied_toml = os.path.join(work, "tied.toml")
with open(tied_toml, "w") as f:
    f.write("[model]\nvocab_size = 301\nmax_position_embeddings = 64\nhidden_size = 64\nintermediate_size = 96\n"
            "num_hidden_layers = 2\nnum_attention_heads = 4\nnum_key_value_heads = 2\nrope_theta = 500.0\n"
            "tie_word_embeddings = true\ninit_seed = 3\ninit_scheme = \"scaled\"\ninit_std = 0.1\n")
tied = dump("tied", "--config", tied_toml, "--batch", "4", "--seq", "32", "--padded-rows", "3", "--pad-id", "0", "--seed", "11")
if tied:
    expect_pass("tied", tied, 1e-6, 1e-5, 0.9999999)

# ---- bf16 activations and weights against transformers in bf16 (each side rounds in its own places).
# Measured here: loss 8e-6 relative, gradients within 1.6e-2 of a tensor's scale, cosine >= 0.99988.
bf16 = dump("bf16", "--config", "configs/tiny-cpu.toml", "--batch", "4", "--seq", "64", "--seed", "7", "--dtype", "bf16")
if bf16:
    expect_pass("bf16", bf16, 5e-3, 0.1, 0.999)

# ---- weights written by transformers itself.
for name, flags in (("import-bf16-sharded", ["--dtype", "bf16", "--max-shard-size", "100KB", "--seed", "1"]),
                    ("import-f32-tied", ["--tied", "--rope-theta", "500", "--heads", "4", "--kv-heads", "1", "--seed", "2"])):
    hf = os.path.join(work, name + "-hf")
    saved = env.side("save", hf, *flags)
    shards = [f for f in saved["files"] if f.endswith(".safetensors")]
    print(f"{name}: transformers wrote {saved['files']} ({saved['parameters']} parameters)")
    if "sharded" in name:
        check(len(shards) > 1 and "model.safetensors.index.json" in saved["files"], f"{name}: not sharded: {saved['files']}")
    d = dump(name, "--init-from", hf, "--batch", "3", "--seq", "32", "--seed", "5")
    if d:
        same = env.side("same-weights", hf, os.path.join(d, "hf"))
        check(same["equal"], f"{name}: parity dump's hf/ holds other weights than transformers wrote: {same['differences']}")
        expect_pass(name, d, 1e-6, 1e-5, 0.9999999, "--model", hf)  # transformers on its own files and config.json

# ---- Llama 3.1's RoPE scaling (rope_type llama3) with an original context of 16 positions, so that over 48
# positions the head's 8 pairs fall in all three bands (kept, blended, divided by the factor).
llama3_hf = os.path.join(work, "llama3-hf")
env.side("save", llama3_hf, "--rope-theta", "500000", "--rope-type", "llama3", "--rope-factor", "8", "--rope-original-max-position",
         "16", "--seed", "6")
llama3 = dump("llama3", "--init-from", llama3_hf, "--batch", "3", "--seq", "48", "--seed", "9")
if llama3:
    with open(os.path.join(llama3, "result.json")) as f:
        model = json.load(f)["model"]
    check(model["rope_scaling"] == "llama3" and model["rope_factor"] == 8 and model["rope_original_max_position_embeddings"] == 16,
          f"llama3: the dump's model {model}")
    expect_pass("llama3", llama3, 1e-6, 1e-5, 0.9999999, "--model", llama3_hf)
    # The scaling matters at these positions: the same weights and batch with plain RoPE differ far beyond the limits.
    plain_hf = os.path.join(work, "llama3-as-plain-hf")
    shutil.copytree(llama3_hf, plain_hf)
    with open(os.path.join(plain_hf, "config.json")) as f:
        plain_cfg = json.load(f)
    plain_cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    with open(os.path.join(plain_hf, "config.json"), "w") as f:
        json.dump(plain_cfg, f)
    plain = dump("llama3-as-plain", "--init-from", plain_hf, "--batch", "3", "--seq", "48", "--seed", "9")
    if plain:
        rc, loss, scaled, _ = parity("llama3 against plain RoPE (must differ)", llama3, "--against", plain)
        check(rc == 1 and scaled is not None and scaled > 1e-3,
              f"llama3 and plain RoPE on the same weights: exit {rc}, scaled gradient difference {scaled} (expected a FAIL)")

# ---- the check must fail where it should.
if f32:
    bad = os.path.join(work, "bad-gradient")
    shutil.copytree(f32, bad)
    g = Safetensors(os.path.join(bad, "grads.safetensors"))
    g.put("model.layers.2.mlp.up_proj.weight", g.get("model.layers.2.mlp.up_proj.weight") * 1.001)
    g.save()
    rc, out, _ = env.run("python3", PARITY, bad)
    failed = [l.split()[0] for l in out.splitlines() if l.rstrip().endswith("FAIL") and l.startswith("model.")]
    print(f"--- a gradient 0.1 % off: exit {rc}, failing tensors {failed}")
    check(rc == 1 and failed == ["model.layers.2.mlp.up_proj.weight"],
          f"a gradient scaled by 1.001: exit {rc} (expected 1), failing tensors {failed} (expected only that one)")

    bad = os.path.join(work, "interleaved-rope")
    shutil.copytree(f32, bad)
    w = Safetensors(os.path.join(bad, "hf", "model.safetensors"))
    dh = 192 // 6
    order = np.array([i // 2 + (i % 2) * (dh // 2) for i in range(dh)])  # rows 0, dh/2, 1, dh/2+1, ... of each head
    for layer in range(4):
        for proj in ("q_proj", "k_proj"):
            name = f"model.layers.{layer}.self_attn.{proj}.weight"
            t = w.get(name)
            heads = t.shape[0] // dh
            w.put(name, t.reshape(heads, dh, -1)[:, order, :].reshape(t.shape))
    w.save()
    rc, loss, _, _ = parity("interleaved RoPE rows", bad)
    check(rc == 1 and loss is not None and loss > 1e-5,
          f"q/k rows in interleaved order: exit {rc}, loss difference {loss} (expected a FAIL beyond 1e-5)")

check.finish("transformers parity: f32 (eager, sdpa), tied, bf16, transformers-written weights, and the two planted errors caught")
