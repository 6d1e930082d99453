#!/usr/bin/env python3
"""The PyTorch / transformers side of the reference tests (tests/torch): runs inside scripts/torch-env.sh,
prints one JSON object on its last line. Verbs:

  save DIR --layers L --hidden D --intermediate F --heads H --kv-heads K --vocab V [--tied] [--dtype f32|bf16]
           [--rope-theta T] [--max-shard-size S] [--seed N]
      a randomly initialized LlamaForCausalLM written by transformers' own save_pretrained (safetensors; a
      small --max-shard-size splits it into several files with an index), as a user's model would arrive
  same-weights A B
      whether two Hugging Face directories hold the same tensors (names, shapes, values after widening both
      to float32; a tied lm_head absent from both): {"equal": bool, "tensors": n, "differences": [...]}
  tokenize DIR TEXT...
      AutoTokenizer from DIR: {"class": ..., "ids": [[...] per text], "bos"/"eos"/"pad": [text, id] or null}
  generate DIR --prompt TEXT --max-new-tokens N
      AutoTokenizer and LlamaForCausalLM from DIR, greedy decoding (no sampling) stopping at the
      tokenizer's end-of-text token: {"prompt_ids": [...], "new_ids": [...], "text": prompt + new text}
"""
import argparse
import json
import sys
from pathlib import Path

import torch


def safetensors_of(directory: Path) -> dict:
    from safetensors.torch import load_file
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"{directory}: no .safetensors file")
    tensors = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def save(a):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(a.seed)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=a.tied,
                      rope_parameters={"rope_type": "default", "rope_theta": a.rope_theta})
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # transformers' init leaves the norms at 1: make them matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model = model.to(torch.bfloat16 if a.dtype == "bf16" else torch.float32)
    model.save_pretrained(a.dir, max_shard_size=a.max_shard_size)
    files = sorted(p.name for p in Path(a.dir).iterdir())
    return {"files": files, "parameters": sum(p.numel() for p in model.parameters())}


def same_weights(a):
    x, y = safetensors_of(Path(a.a)), safetensors_of(Path(a.b))
    differences = []
    for name in sorted(set(x) | set(y)):
        if name not in x or name not in y:
            differences.append(f"{name}: only in {a.a if name in x else a.b}")
        elif x[name].shape != y[name].shape:
            differences.append(f"{name}: shape {tuple(x[name].shape)} vs {tuple(y[name].shape)}")
        elif not torch.equal(x[name].float(), y[name].float()):
            diff = (x[name].float() - y[name].float()).abs().max().item()
            differences.append(f"{name}: values differ (largest {diff:.3e})")
    return {"equal": not differences, "tensors": len(x), "differences": differences,
            "dtypes": sorted({str(t.dtype) for t in x.values()} | {str(t.dtype) for t in y.values()})}


def tokenize(a):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(a.dir)
    role = lambda text, id_: None if text is None else [text, id_]  # noqa: E731
    return {"class": type(tokenizer).__name__, "ids": [tokenizer(t, add_special_tokens=False).input_ids for t in a.texts],
            "bos": role(tokenizer.bos_token, tokenizer.bos_token_id), "eos": role(tokenizer.eos_token, tokenizer.eos_token_id),
            "pad": role(tokenizer.pad_token, tokenizer.pad_token_id),
            "decoded": [tokenizer.decode(tokenizer(t, add_special_tokens=False).input_ids) for t in a.texts]}


def generate(a):
    from transformers import AutoTokenizer, LlamaForCausalLM
    tokenizer = AutoTokenizer.from_pretrained(a.dir)
    model = LlamaForCausalLM.from_pretrained(a.dir, dtype=torch.float32)
    model.eval()
    ids = tokenizer(a.prompt, add_special_tokens=False, return_tensors="pt").input_ids
    eos = tokenizer.eos_token_id
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.max_new_tokens,
                             do_sample=False, eos_token_id=eos, pad_token_id=eos if eos is not None else 0)
    new = out[0, ids.shape[1]:].tolist()
    if eos is not None and eos in new:
        new = new[:new.index(eos)]
    return {"prompt_ids": ids[0].tolist(), "new_ids": new, "eos_id": eos,
            "text": a.prompt + tokenizer.decode(new, skip_special_tokens=False),
            "tokenizer_class": type(tokenizer).__name__}


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("save")
    s.add_argument("dir")
    for name, default in (("layers", 2), ("hidden", 64), ("intermediate", 96), ("heads", 4), ("kv-heads", 2),
                          ("vocab", 301), ("seed", 0)):
        s.add_argument(f"--{name}", type=int, default=default)
    s.add_argument("--tied", action="store_true")
    s.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    s.add_argument("--rope-theta", type=float, default=10000.0)
    s.add_argument("--max-shard-size", default="5GB")
    w = sub.add_parser("same-weights")
    w.add_argument("a")
    w.add_argument("b")
    t = sub.add_parser("tokenize")
    t.add_argument("dir")
    t.add_argument("texts", nargs="+")
    g = sub.add_parser("generate")
    g.add_argument("dir")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new-tokens", type=int, default=40)
    a = p.parse_args()
    torch.set_float32_matmul_precision("highest")
    result = {"save": save, "same-weights": same_weights, "tokenize": tokenize, "generate": generate}[a.verb](a)
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
