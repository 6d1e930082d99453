#!/usr/bin/env python3
"""An independent Hugging Face LlamaForCausalLM forward in numpy, written from the transformers model's
documented semantics (not from shardtrain's code): safetensors parsed by its specification, config.json
read for the architecture, RMSNorm, rotate-half RoPE, repeat_kv for grouped-query attention, causal
softmax, SwiGLU MLP, tied or separate lm_head, mean cross-entropy over targets != -100.

Usage: hf_llama_reference.py CASE.json   (written by hf_export_test.cpp; it holds the exported directory,
batches, and the losses shardtrain computed). Exits non-zero when any loss differs.
tests/cli/parity_dump_test.py imports it for forward_loss (with an attention_mask) and load_safetensors."""
import json
import struct
import sys
from pathlib import Path

import numpy as np


def load_safetensors(directory: Path) -> dict:
    files = sorted(directory.glob("*.safetensors"))
    tensors = {}
    for f in files:
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        data = raw[8 + n:]
        for name, info in header.items():
            if name == "__metadata__":
                continue
            b, e = info["data_offsets"]
            if info["dtype"] == "F32":
                arr = np.frombuffer(data[b:e], dtype="<f4")
            elif info["dtype"] == "BF16":
                arr = (np.frombuffer(data[b:e], dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                raise SystemExit(f"{f}: unexpected dtype {info['dtype']} for {name}")
            tensors[name] = arr.reshape(info["shape"]).astype(np.float64)
    return tensors


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def forward_loss(t, cfg, ids, targets, attention_mask=None):
    """Mean cross-entropy over targets != -100; targets are already shifted (position i predicts targets[i]).
    attention_mask (B, S), as transformers takes it: 0 marks a padding key, which no query attends to.
    A query that sees no key at all gets a zero attention output (its target should be -100)."""
    B, S = ids.shape
    D, H, Hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    Dh = cfg.get("head_dim", D // H)
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    inv_freq = 1.0 / (theta ** (np.arange(0, Dh, 2, dtype=np.float64) / Dh))
    freqs = np.outer(np.arange(S, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[None, None], np.sin(emb)[None, None]  # (1, 1, S, Dh)
    mask = np.triu(np.full((S, S), -np.inf), k=1)  # (S, S) causal
    if attention_mask is not None:  # (B, 1, S, S): padding keys masked as well
        mask = mask[None, None] + np.where(np.asarray(attention_mask)[:, None, None, :] == 0, -np.inf, 0.0)
    x = t["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, t[p + "input_layernorm.weight"], eps)
        q = (h @ t[p + "self_attn.q_proj.weight"].T).reshape(B, S, H, Dh).transpose(0, 2, 1, 3)
        k = (h @ t[p + "self_attn.k_proj.weight"].T).reshape(B, S, Hkv, Dh).transpose(0, 2, 1, 3)
        v = (h @ t[p + "self_attn.v_proj.weight"].T).reshape(B, S, Hkv, Dh).transpose(0, 2, 1, 3)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, H // Hkv, axis=1)  # repeat_kv: query head j reads key/value head j // (H/Hkv)
        v = np.repeat(v, H // Hkv, axis=1)
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(Dh) + mask
        top = scores.max(axis=-1, keepdims=True)
        scores -= np.where(np.isfinite(top), top, 0.0)  # a fully masked row stays -inf: zero probabilities
        probs = np.exp(scores)
        total = probs.sum(axis=-1, keepdims=True)
        probs /= np.where(total > 0, total, 1.0)
        attn = (probs @ v).transpose(0, 2, 1, 3).reshape(B, S, H * Dh)
        x = x + attn @ t[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, t[p + "post_attention_layernorm.weight"], eps)
        gate = h @ t[p + "mlp.gate_proj.weight"].T
        up = h @ t[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ t[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, t["model.norm.weight"], eps)
    head = t["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else t["lm_head.weight"]
    logits = x @ head.T
    logits -= logits.max(axis=-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    keep = targets != -100
    picked = np.take_along_axis(logp, np.where(keep, targets, 0)[..., None], axis=-1)[..., 0]
    return float(-(picked * keep).sum() / keep.sum())


def main():
    case = json.loads(Path(sys.argv[1]).read_text())
    failures = 0
    for export in case["exports"]:
        directory = Path(export["dir"])
        cfg = json.loads((directory / "config.json").read_text())
        assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
        t = load_safetensors(directory)
        expected_names = {"model.embed_tokens.weight", "model.norm.weight"} | (set() if cfg["tie_word_embeddings"] else {"lm_head.weight"})
        for i in range(cfg["num_hidden_layers"]):
            for n in ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                      "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
                expected_names.add(f"model.layers.{i}.{n}.weight")
        if set(t) != expected_names:
            print(f"{directory}: tensor names differ from LlamaForCausalLM's: {sorted(set(t) ^ expected_names)}")
            failures += 1
            continue
        tol = export["tolerance"]
        for batch in export["batches"]:
            ids, targets = np.array(batch["ids"]), np.array(batch["targets"])
            ref = forward_loss(t, cfg, ids, targets)
            ours = batch["loss"]
            ok = abs(ref - ours) <= tol * abs(ref)
            print(f"{directory.name}: reference {ref:.9f} shardtrain {ours:.9f} {'ok' if ok else 'DIFFERENT'}")
            failures += 0 if ok else 1
    print(f"{failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
