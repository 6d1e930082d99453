#!/usr/bin/env python3
"""`shardtrain parity dump` (offline, CPU backend) held to an independent reference: the numpy
LlamaForCausalLM of tests/checkpoint/hf_llama_reference.py, run in float64 on the dump's own files
(hf/ + batch.json), never on anything shardtrain computed.
- the dump's files: every parameter's gradient under the Hugging Face names and shapes of hf/, a batch
  right-padded on its last rows (targets -100 and attention_mask 0 exactly on the pad tokens);
- the loss equals the reference's within 1e-5 relative (f32), tied and untied;
- gradients: central differences of the float64 reference, for 23 entries covering every kind of tensor
  (embedding rows that occur in the batch, q/k/v/o, gate/up/down, both norms, the final norm, lm_head)
  and, tied, the embedding that also serves as lm_head; embedding rows that no real token uses (the pad
  token's among them) have exactly zero gradient;
- bf16 activations: the loss within 1e-3 relative of the reference on the same (bf16) weights;
- bad input: a missing config (exit 3), --dtype fp16 (exit 2), an --out that is not empty (exit 2), each
  with one line naming what is wrong.

Tolerance of the gradient check: |dump - finite difference| <= 1e-5 x the tensor's largest |gradient|.
The reference is float64: central differences with eps = 1e-5 leave a truncation error of about
(eps / |w|)^2, at most 3e-7 relative for the smallest weights (~0.02 here), and a rounding error of about
1e-16 x loss / eps ~ 1e-10 absolute, far below the gradients tested (each at least 1e-3 of its tensor's
largest). The dump is fp32 math (unit roundoff 6e-8): each gradient sums products over up to 41 tokens,
301 vocabulary entries and 96 MLP units through two layers, so a few 1e-7 of the tensor's scale is
expected, and measured: at most 3e-7 over these entries. 1e-5 leaves a factor of 30 over that, and a
wrong formula (a sign, a missing 1/N, a dropped contribution of the tied weight) moves a gradient by
1e-2 of its tensor's scale or more."""
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "checkpoint"))
import clitest  # noqa: E402
from hf_llama_reference import forward_loss, load_safetensors  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
GRAD_TOL = 1e-5  # |dump - finite difference| over the tensor's largest |gradient|: see the docstring
TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--intermediate", "96", "--vocab", "301"]


def shardtrain(*cli):
    p = subprocess.run([args.shardtrain, *cli, "--log-level", "warn"], cwd=args.source, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr


def dump(name, *cli):
    """Runs parity dump into WORK/NAME; returns (dir, result, batch, weights, config, grads) or None."""
    out = os.path.join(work, name)
    rc, stdout, stderr = shardtrain("parity", "dump", "--device", "cpu", "--out", out, *cli)
    check(rc == 0, f"{name}: parity dump exit {rc}: {stderr}")
    if rc != 0:
        return None
    print(stdout.strip())
    with open(os.path.join(out, "result.json")) as f:
        result = json.load(f)
    with open(os.path.join(out, "batch.json")) as f:
        batch = {k: np.array(v) for k, v in json.load(f).items()}
    with open(os.path.join(out, "hf", "config.json")) as f:
        cfg = json.load(f)
    weights = load_safetensors(Path(out) / "hf")
    with open(os.path.join(out, "grads.safetensors"), "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    grads = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        check(info["dtype"] == "F32", f"{name}: grads.safetensors holds {key} as {info['dtype']}, expected F32")
        b, e = info["data_offsets"]
        grads[key] = np.frombuffer(raw[8 + n + b:8 + n + e], dtype="<f4").reshape(info["shape"]).astype(np.float64)
    return out, result, batch, weights, cfg, grads


def check_files(name, result, batch, weights, cfg, grads, pad_rows_expected):
    ids, targets, mask = batch["input_ids"], batch["targets"], batch["attention_mask"]
    V, pad = cfg["vocab_size"], result["pad_token_id"]
    check(set(grads) == set(weights), f"{name}: gradient names {sorted(set(grads) ^ set(weights))} differ from hf/'s")
    check(all(grads[k].shape == weights[k].shape for k in grads if k in weights), f"{name}: gradient shapes differ from hf/'s")
    check({p["name"] for p in result["params"]} == set(grads) and len(result["params"]) == len(grads)
          and all(list(grads[p["name"]].shape) == p["shape"] for p in result["params"] if p["name"] in grads),
          f"{name}: result.json's params differ from the gradients")
    check(ids.shape == (result["batch"], result["seq"]) and targets.shape == ids.shape and mask.shape == ids.shape,
          f"{name}: batch shapes {ids.shape} {targets.shape} {mask.shape}")
    check(result["backend"] == "cpu" and result["finite"], f"{name}: backend {result['backend']}, finite {result['finite']}")
    check(int(mask.sum()) == result["counted_tokens"] == int((targets != -100).sum()),
          f"{name}: counted {result['counted_tokens']}, mask {mask.sum()}, targets {(targets != -100).sum()}")
    check(bool(np.all((targets == -100) == (mask == 0))) and bool(np.all(ids[mask == 0] == pad)),
          f"{name}: padding is not exactly the positions with target -100 and the pad id")
    check(bool(np.all(ids[mask == 1] != pad)) and int(ids.min()) >= 0 and int(ids.max()) < V and int(targets.max()) < V,
          f"{name}: ids out of [0, V) or a real token equal to the pad id")
    padded = [r for r in range(ids.shape[0]) if mask[r].min() == 0]
    check(padded == pad_rows_expected and all(mask[r, 0] == 1 and np.all(np.diff(mask[r]) <= 0) for r in padded),
          f"{name}: padded rows {padded} (expected right padding on {pad_rows_expected}): {mask.tolist()}")
    check(result["row_lengths"] == [int(m.sum()) for m in mask], f"{name}: row_lengths {result['row_lengths']}")


def check_loss(name, result, batch, weights, cfg, rel_tol):
    ref = forward_loss(weights, cfg, batch["input_ids"], batch["targets"], batch["attention_mask"])
    rel = abs(result["loss"] - ref) / abs(ref)
    print(f"{name}: loss {result['loss']:.9f}, reference {ref:.9f}, relative difference {rel:.2e} (allowed {rel_tol:g})")
    check(rel <= rel_tol, f"{name}: loss {result['loss']} vs reference {ref}: relative {rel:.2e} > {rel_tol:g}")


def check_gradients(name, batch, weights, cfg, grads, entries, eps=1e-5):
    """Central differences of the float64 reference at (tensor, index) entries against the dump."""
    ids, targets, mask = batch["input_ids"], batch["targets"], batch["attention_mask"]
    worst = 0.0
    for tensor, index in entries:
        w = weights[tensor]
        keep = w[index]
        w[index] = keep + eps
        up = forward_loss(weights, cfg, ids, targets, mask)
        w[index] = keep - eps
        down = forward_loss(weights, cfg, ids, targets, mask)
        w[index] = keep
        fd = (up - down) / (2 * eps)
        ours = grads[tensor][index]
        scale = float(np.abs(grads[tensor]).max())
        err = abs(ours - fd)
        worst = max(worst, err / scale)
        print(f"  {tensor}{list(index)}: dump {ours:+.9e} finite difference {fd:+.9e} |diff| {err:.1e} "
              f"= {err / scale:.1e} of the tensor's largest gradient (allowed {GRAD_TOL:g})")
        check(abs(fd) > 1e-3 * scale, f"{name}: {tensor}{list(index)} has too small a gradient to test anything")
        check(err <= GRAD_TOL * scale, f"{name}: gradient of {tensor}{list(index)}: dump {ours} vs finite difference {fd}")
    print(f"{name}: {len(entries)} gradient entries, worst |diff| {worst:.1e} of the tensor's largest gradient")


def argmax_entry(g):
    return tuple(int(i) for i in np.unravel_index(int(np.abs(g).argmax()), g.shape))


def embedding_entry(grads, row):
    """The largest gradient entry of one embedding row."""
    return "model.embed_tokens.weight", (int(row), int(np.abs(grads["model.embed_tokens.weight"][row]).argmax()))


# ---- untied, f32: configs/tiny-cpu.toml's [model] (scaled init) made tiny by the overrides; 2 rows, the
# second ends with 4 pad tokens.
d = dump("f32", "--config", "configs/tiny-cpu.toml", *TINY, "--batch", "2", "--seq", "16", "--seed", "7")
if d:
    out, result, batch, weights, cfg, grads = d
    check(result["dtype"] == "f32" and cfg["num_hidden_layers"] == 2 and cfg["hidden_size"] == 64 and cfg["vocab_size"] == 301
          and cfg["num_key_value_heads"] == 2 and cfg["intermediate_size"] == 96 and not cfg["tie_word_embeddings"],
          f"f32: the overrides over tiny-cpu.toml: {cfg}")
    check(result["row_lengths"] == [16, 12] and result["pad_token_id"] == 300, f"f32: rows {result['row_lengths']}")
    check_files("f32", result, batch, weights, cfg, grads, [1])
    check_loss("f32", result, batch, weights, cfg, 1e-5)
    rng = np.random.default_rng(0)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    first, last = int(ids[0, 0]), int(ids[1, 11])  # [1, 11]: the padded row's last real token
    entries = [embedding_entry(grads, first), embedding_entry(grads, last if last != first else ids[1, 10])]
    for kind in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"):
        entries.append((f"model.layers.0.{kind}.weight", argmax_entry(grads[f"model.layers.0.{kind}.weight"])))
        shape = grads[f"model.layers.1.{kind}.weight"].shape
        entries.append((f"model.layers.1.{kind}.weight", tuple(int(rng.integers(0, s)) for s in shape)))
    entries.append(("model.norm.weight", argmax_entry(grads["model.norm.weight"])))
    entries.append(("lm_head.weight", argmax_entry(grads["lm_head.weight"])))
    entries.append(("lm_head.weight", (int(rng.integers(0, 301)), int(rng.integers(0, 64)))))
    check_gradients("f32", batch, weights, cfg, grads, entries)
    used = set(int(i) for i in ids[mask == 1])
    unused = [r for r in range(301) if r not in used]
    check(300 in unused and bool(np.all(grads["model.embed_tokens.weight"][unused] == 0)),
          "f32: an embedding row no real token uses (the pad token's among them) has a nonzero gradient")
    check(all(np.abs(grads["model.embed_tokens.weight"][r]).max() > 0 for r in used), "f32: a used embedding row has no gradient")

# ---- tied embeddings, reset_parameters init (N(0, 1) embedding), a small RoPE base, 3 rows of which 2 padded.
tied_toml = os.path.join(work, "tied.toml")
with open(tied_toml, "w") as f:
    f.write("[model]\nvocab_size = 301\nmax_position_embeddings = 64\nhidden_size = 64\nintermediate_size = 96\n"
            "num_hidden_layers = 2\nnum_attention_heads = 4\nnum_key_value_heads = 2\nrope_theta = 500.0\n"
            "tie_word_embeddings = true\ninit_seed = 3\ninit_scheme = \"scaled\"\ninit_std = 0.1\n")
d = dump("tied", "--config", tied_toml, "--batch", "3", "--seq", "16", "--padded-rows", "2", "--pad-len", "3", "--pad-id", "0", "--seed", "11")
if d:
    out, result, batch, weights, cfg, grads = d
    check(cfg["tie_word_embeddings"] and "lm_head.weight" not in grads and cfg["rope_theta"] == 500.0, f"tied: {cfg}")
    check(result["row_lengths"] == [16, 13, 12] and result["pad_token_id"] == 0, f"tied: rows {result['row_lengths']}")
    check_files("tied", result, batch, weights, cfg, grads, [1, 2])
    check_loss("tied", result, batch, weights, cfg, 1e-5)
    ids = batch["input_ids"]
    # A row used as input (both the embedding's and lm_head's gradient), a row only lm_head reaches, q and down.
    unused = [r for r in range(301) if r not in set(int(i) for i in ids[batch["attention_mask"] == 1])]
    entries = [embedding_entry(grads, ids[0, 2]), embedding_entry(grads, ids[2, 5]), embedding_entry(grads, unused[1]),
               ("model.layers.1.self_attn.q_proj.weight", argmax_entry(grads["model.layers.1.self_attn.q_proj.weight"])),
               ("model.layers.0.mlp.down_proj.weight", argmax_entry(grads["model.layers.0.mlp.down_proj.weight"]))]
    check_gradients("tied", batch, weights, cfg, grads, entries)

# ---- bf16 activations (the weights rounded to bf16, as hf/ holds them): the loss against the reference on
# those same weights. bf16 keeps 8 significant bits (rounding error up to 2^-9 = 2e-3 per store), which over a
# mean of 28 token losses gives at most a few 1e-4; measured: 3e-6 relative.
d = dump("bf16", "--config", "configs/tiny-cpu.toml", *TINY, "--batch", "2", "--seq", "16", "--seed", "7", "--dtype", "bf16")
if d:
    out, result, batch, weights, cfg, grads = d
    check(result["dtype"] == "bf16" and cfg["torch_dtype"] == "bfloat16", f"bf16: dtype {result['dtype']}, {cfg['torch_dtype']}")
    check_files("bf16", result, batch, weights, cfg, grads, [1])
    check_loss("bf16", result, batch, weights, cfg, 1e-3)

# ---- bad input: one line naming what is wrong, and the documented exit code.
for what, cli, code, needle in (
        ("a missing config", ["--config", "configs/no-such.toml"], 3, "configs/no-such.toml: cannot read the config file"),
        ("a bad --dtype", ["--config", "configs/tiny-cpu.toml", "--dtype", "fp16"], 2, "--dtype 'fp16': expected f32 or bf16"),
        ("an --out that is not empty", ["--config", "configs/tiny-cpu.toml", *TINY], 2, "already exists and is not an empty directory")):
    out = os.path.join(work, "f32") if "not empty" in what else os.path.join(work, "refused")
    rc, stdout, stderr = shardtrain("parity", "dump", "--device", "cpu", "--out", out, *cli)
    lines = [line for line in stderr.splitlines() if line.strip()]
    check(rc == code and len(lines) == 1 and needle in lines[0],
          f"{what}: exit {rc} (expected {code}), stderr {stderr!r} (expected one line with {needle!r})")
    check(not os.path.exists(os.path.join(work, "refused")), f"{what}: the refused dump left a directory")

rc, stdout, stderr = shardtrain("parity", "dump", "--device", "cpu", "--out", "", "--config", "configs/tiny-cpu.toml", *TINY)
check(rc == 2 and "--out: expected a folder's name (new or empty)" in stderr,
      f"an empty --out: exit {rc} (it was 8, 'cannot create directories: Invalid argument []'): {stderr!r}")

check.finish("parity dump: files, loss and gradients match the float64 reference; bad input refused")
