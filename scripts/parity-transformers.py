#!/usr/bin/env python3
"""Parity of shardtrain's loss and gradients with Hugging Face transformers' LlamaForCausalLM holding the
same weights (docs/model.md, "Parity with Hugging Face transformers").

    build/bin/shardtrain parity dump --config configs/tiny-cpu.toml --out /tmp/parity [--dtype bf16]
    scripts/parity-transformers.py /tmp/parity [--device cuda|cpu] [--dtype f32|bf16] [--attention eager|sdpa]
    scripts/parity-transformers.py /tmp/parity --against /tmp/parity-other     # two dumps, no torch needed
    scripts/parity-transformers.py /tmp/parity --model HF_DIR   # a dump made with --init-from HF_DIR: transformers
                                                                # loads HF_DIR itself, not the dump's re-export

The dump holds hf/ (the weights as a Hugging Face directory), grads.safetensors (every parameter's gradient,
fp32, under the Hugging Face names), batch.json (input_ids, targets, attention_mask) and result.json (the
loss). This script loads LlamaForCausalLM.from_pretrained(DIR/hf) in the dtype asked for (default: the
dump's), with eager attention unless --attention sdpa (eager is the strictest reference: a plain softmax in
fp32), checks that every weight it loaded equals the file's, runs the batch with the attention_mask, and
computes the mean cross-entropy against the dump's targets itself: the targets are already shifted, so no
labels= is passed (transformers would shift them again). Then backward, and a table: the loss (absolute and
relative difference) and, per gradient tensor, the largest absolute difference, that difference over the
tensor's largest reference magnitude ("scaled"), and the cosine similarity. PASS (exit 0) or FAIL (exit 1).
It needs only the dump: no shardtrain import.

Tolerances (either side in bf16 takes the bf16 row):
  f32:  loss relative 1e-5; per tensor cosine > 0.99999 and scaled max difference < 1e-4. Both sides are
        fp32 math (no TF32: torch.set_float32_matmul_precision("highest")) and differ only in the order of
        their roundings (unit roundoff 6e-8). shardtrain's own error, against a float64 reference
        (tests/cli/parity_dump_test.py): loss 1e-8 relative, gradients 3e-7 of a tensor's largest. So 1e-4
        leaves a factor of 100 for the two sides' errors together, and any wrong term fails it by far.
  bf16: loss relative 5e-3; cosine > 0.999 and scaled max difference < 0.1. bf16 keeps 8 significant bits
        (up to 2^-9 = 2e-3 relative per rounding) and the two sides round at different places: transformers
        rounds every module output (projections, attention probabilities before P V, each residual add,
        the logits, the gradients), shardtrain stores activations in bf16 but does each op's arithmetic in
        fp32 (bf16 logits and dlogits as transformers', an fp32 softmax and loss, fp32 gradient
        accumulation). Measured for shardtrain's bf16 run against its f32 run on the same bf16 weights
        (`parity dump --config configs/tiny-cpu.toml --layers 2 --hidden 64 --heads 4 --kv-heads 2 --dtype
        bf16 --out A`, `parity dump --init-from A/hf --out B`, this script `A --against B`): loss 1.6e-5
        relative, gradient cosine >= 0.99997 (a relative error of about 8e-3), scaled max difference
        <= 1.1e-2. transformers' error is of the same kind and, rounding more often, perhaps 3x larger;
        the limits leave a further factor of about 3 (cosine 0.999 allows a 4.5e-2 relative error), while
        a wrong formula (a RoPE or GQA layout, a missing term) moves a gradient's cosine far below 0.99.
"""
import argparse
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np

TOLERANCES = {
    "f32": {"loss_rel": 1e-5, "cosine_min": 0.99999, "scaled_max": 1e-4},
    "bf16": {"loss_rel": 5e-3, "cosine_min": 0.999, "scaled_max": 0.1},
}


def read_safetensors(path: Path) -> dict:
    """name -> float64 array, from a safetensors file (F32 or BF16), parsed by its specification."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        data = raw[8 + n + b:8 + n + e]
        if info["dtype"] == "F32":
            arr = np.frombuffer(data, dtype="<f4")
        elif info["dtype"] == "BF16":
            arr = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: {name} has dtype {info['dtype']}; expected F32 or BF16")
        out[name] = arr.reshape(info["shape"]).astype(np.float64)
    return out


def read_hf_weights(hf: Path) -> dict:
    files = sorted(hf.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"{hf}: no .safetensors file")
    weights = {}
    for f in files:
        weights.update(read_safetensors(f))
    return weights


class Dump:
    def __init__(self, directory: Path):
        self.dir = directory
        for name in ("result.json", "batch.json", "grads.safetensors", "hf/config.json"):
            if not (directory / name).is_file():
                raise SystemExit(f"{directory / name}: missing (expected the output of `shardtrain parity dump --out {directory}`)")
        self.result = json.loads((directory / "result.json").read_text())
        batch = json.loads((directory / "batch.json").read_text())
        self.input_ids = np.array(batch["input_ids"], dtype=np.int64)
        self.targets = np.array(batch["targets"], dtype=np.int64)
        self.attention_mask = np.array(batch["attention_mask"], dtype=np.int64)
        self.grads = read_safetensors(directory / "grads.safetensors")
        self.loss = float(self.result["loss"])
        self.counted = int((self.targets != -100).sum())
        if self.counted != int(self.result["counted_tokens"]):
            raise SystemExit(f"{directory}: batch.json counts {self.counted} targets, result.json {self.result['counted_tokens']}")


def run_transformers(dump: Dump, device: str, dtype: str, attention: str, model_dir=None):
    """(loss, gradients by name, notes) from transformers on the dump's weights (or model_dir's) and batch."""
    try:
        import torch
        import transformers
        from transformers import LlamaForCausalLM
    except ImportError as e:
        raise SystemExit(f"the transformers comparison needs torch and transformers ({e}); "
                         "--against DIR compares two dumps without them")

    torch.set_float32_matmul_precision("highest")  # full fp32 GEMMs: no TF32 in the reference
    torch_dtype = torch.float32 if dtype == "f32" else torch.bfloat16
    hf = model_dir or dump.dir / "hf"
    model = LlamaForCausalLM.from_pretrained(str(hf), dtype=torch_dtype, attn_implementation=attention)
    model = model.to(device=device, dtype=torch_dtype)
    model.eval()  # no dropout (attention_dropout is 0 anyway); gradients are still computed
    notes = [f"transformers {transformers.__version__}, torch {torch.__version__}, device {device}, "
             f"dtype {torch_dtype}, attention {getattr(model.config, '_attn_implementation', attention)}"]

    # The architecture transformers read from config.json must be ours (a field it ignored would differ here).
    cfg, ours = model.config, dump.result["model"]
    rope = getattr(cfg, "rope_parameters", None)
    theta = rope.get("rope_theta") if isinstance(rope, dict) and "rope_theta" in rope else getattr(cfg, "rope_theta", None)
    seen = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
            "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": theta, "tie_word_embeddings": cfg.tie_word_embeddings}
    if theta is None:
        notes.append("rope theta: not found on transformers' config object, not checked")
        del seen["rope_theta"]
    # RoPE scaling: transformers 5's rope_parameters, or 4.x's rope_scaling (None when plain).
    scaling = rope if isinstance(rope, dict) else (getattr(cfg, "rope_scaling", None) or {})
    seen["rope_scaling"] = scaling.get("rope_type", scaling.get("type", "default"))
    if seen["rope_scaling"] != "default":
        seen["rope_factor"] = scaling.get("factor")
    if seen["rope_scaling"] == "llama3":
        for ours_name, theirs_name in (("rope_low_freq_factor", "low_freq_factor"), ("rope_high_freq_factor", "high_freq_factor"),
                                       ("rope_original_max_position_embeddings", "original_max_position_embeddings")):
            seen[ours_name] = scaling.get(theirs_name)
    wrong = {k: (v, ours[k]) for k, v in seen.items() if k in ours and v != ours[k]}
    if wrong:
        raise SystemExit(f"{hf}/config.json as transformers read it differs from the dump's model: "
                         + ", ".join(f"{k} {v[0]} (ours {v[1]})" for k, v in wrong.items()))

    # Every weight transformers holds must be the file's (a name it did not recognize would be initialized afresh).
    files = read_hf_weights(hf)
    params = dict(model.named_parameters())
    missing = sorted(set(files) - set(params))
    if missing:
        raise SystemExit(f"{hf}: tensors transformers did not load as parameters: {missing}")
    for name, p in params.items():
        if name not in files:
            raise SystemExit(f"{hf}: transformers has parameter {name}, which the files do not hold")
        held = p.detach().to(torch.float64).cpu().numpy()
        expected = torch.tensor(files[name]).to(torch_dtype).to(torch.float64).numpy()
        if held.shape != expected.shape or not np.array_equal(held, expected):
            raise SystemExit(f"{hf}: transformers' {name} {tuple(held.shape)} differs from the file's {tuple(expected.shape)}")
    notes.append(f"weights: all {len(params)} parameters equal the files'")

    ids = torch.tensor(dump.input_ids, device=device)
    mask = torch.tensor(dump.attention_mask, device=device)
    targets = torch.tensor(dump.targets, device=device)
    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # (B, S, V)
        # Our targets are already shifted: position i predicts targets[i]. The mean over counted targets, in fp32.
        loss_sum = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                     ignore_index=-100, reduction="sum")
        loss = loss_sum / dump.counted
        loss.backward()
    grads = {}
    for name, p in params.items():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        grads[name] = g.detach().to(torch.float64).cpu().numpy()
    return float(loss.detach().to(torch.float64).cpu()), grads, notes


def compare_tensor(ours: np.ndarray, ref: np.ndarray):
    """(largest |difference|, that over the reference's largest magnitude, cosine similarity)."""
    a, b = ours.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    max_abs = float(np.abs(a - b).max()) if a.size else 0.0
    scale = float(np.abs(b).max()) if b.size else 0.0
    scaled = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 and nb == 0:
        cosine = 1.0
    elif na == 0 or nb == 0:
        cosine = 0.0
    else:
        cosine = float(np.dot(a, b) / (na * nb))
    return max_abs, scaled, cosine


def compare(dump: Dump, ref_loss: float, ref_grads: dict, tol: dict):
    """Prints the table; returns the number of failed checks."""
    failures = 0
    abs_diff = abs(dump.loss - ref_loss)
    rel = abs_diff / abs(ref_loss) if ref_loss != 0 else math.inf
    ok = rel <= tol["loss_rel"]
    failures += 0 if ok else 1
    print(f"loss: shardtrain {dump.loss:.9f}  reference {ref_loss:.9f}  abs diff {abs_diff:.3e}  "
          f"rel diff {rel:.3e} (limit {tol['loss_rel']:g})  {'ok' if ok else 'FAIL'}")
    missing, extra = sorted(set(ref_grads) - set(dump.grads)), sorted(set(dump.grads) - set(ref_grads))
    if missing or extra:
        failures += 1
        print(f"FAIL: gradient names differ: only in the reference {missing}, only in the dump {extra}")
    width = max([len(n) for n in dump.grads] + [6])
    print(f"{'tensor':<{width}}  {'shape':<14} {'max|ref|':>10} {'max|diff|':>10} {'scaled':>10} {'cosine':>12}")
    worst_scaled, worst_cosine = 0.0, 1.0
    for name, ours in dump.grads.items():
        if name not in ref_grads:
            continue
        ref = ref_grads[name]
        if ours.shape != ref.shape:
            failures += 1
            print(f"{name:<{width}}  shape {ours.shape} vs the reference's {ref.shape}  FAIL")
            continue
        max_abs, scaled, cosine = compare_tensor(ours, ref)
        ok = cosine > tol["cosine_min"] and scaled < tol["scaled_max"]
        failures += 0 if ok else 1
        worst_scaled, worst_cosine = max(worst_scaled, scaled), min(worst_cosine, cosine)
        shape = "(" + ", ".join(str(d) for d in ours.shape) + ")"
        print(f"{name:<{width}}  {shape:<14} {float(np.abs(ref).max()):>10.3e} {max_abs:>10.3e} {scaled:>10.3e} "
              f"{cosine:>12.9f}  {'ok' if ok else 'FAIL'}")
    print(f"gradients: {len(dump.grads)} tensors, worst scaled difference {worst_scaled:.3e} (limit {tol['scaled_max']:g}), "
          f"lowest cosine {worst_cosine:.9f} (limit {tol['cosine_min']:g})")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dump", type=Path, help="the directory `shardtrain parity dump --out` wrote")
    parser.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when torch sees one")
    parser.add_argument("--dtype", choices=["f32", "bf16"], help="transformers' dtype (default: the dump's)")
    parser.add_argument("--attention", choices=["eager", "sdpa"], default="eager", help="transformers' attention")
    parser.add_argument("--against", type=Path, help="compare with another dump instead of transformers")
    parser.add_argument("--model", type=Path, help="transformers loads this Hugging Face directory (the one the dump "
                        "was made --init-from) instead of the dump's hf/: its config.json and files as they are")
    a = parser.parse_args()
    dump = Dump(a.dump)
    r = dump.result
    print(f"dump {a.dump}: {r['backend']} backend, {r['dtype']} activations, {r['weights_dtype']} weights, "
          f"batch {r['batch']} x {r['seq']} (rows of {r['row_lengths']} real tokens), {dump.counted} targets, {r['weights']}")
    if a.against:
        other = Dump(a.against)
        if not (np.array_equal(other.input_ids, dump.input_ids) and np.array_equal(other.targets, dump.targets)):
            raise SystemExit(f"{a.against}: a different batch from {a.dump}'s")
        dtype = "bf16" if "bf16" in (r["dtype"], other.result["dtype"]) else "f32"
        print(f"reference: dump {a.against} ({other.result['backend']} backend, {other.result['dtype']} activations)")
        ref_loss, ref_grads = other.loss, other.grads
    else:
        dtype = a.dtype or r["dtype"]
        device = a.device
        if device is None:
            try:
                import torch
                device = "cuda" if torch.cuda.is_available() else "cpu"
            except ImportError:
                device = "cpu"  # run_transformers says what is missing
        ref_loss, ref_grads, notes = run_transformers(dump, device, dtype, a.attention, a.model)
        for n in notes:
            print(f"reference: {n}")
        dtype = "bf16" if "bf16" in (dtype, r["dtype"]) else "f32"
    tol = TOLERANCES[dtype]
    print(f"tolerances ({dtype}): loss rel {tol['loss_rel']:g}; per tensor cosine > {tol['cosine_min']:g} "
          f"and scaled max difference < {tol['scaled_max']:g}")
    failures = compare(dump, ref_loss, ref_grads, tol)
    print("PASS" if failures == 0 else f"FAIL: {failures} check(s) outside the tolerances")
    sys.exit(0 if failures == 0 else 1)


if __name__ == "__main__":
    main()
