#!/usr/bin/env python3
"""A trained model's Hugging Face export, used the way a user uses it: transformers' own AutoTokenizer and
LlamaForCausalLM.from_pretrained on the directory `shardtrain consolidate --format safetensors` wrote.
- A tokenizer trained by `shardtrain tokenizer train` on Moby Dick, a model trained on 2 ranks (FULL_SHARD)
  for 60 steps, its sharded checkpoint consolidated to f32 and to bf16 safetensors.
- The exported tokenizer: AutoTokenizer gives the same ids as `shardtrain tokenizer encode` on prompts with
  punctuation, digits, runs of spaces, newlines and non-ASCII text, decodes them back to the text, and
  names the same beginning, end-of-text and padding tokens; so also for the two other tokenizer forms the
  export ships (`--tokenizer`): Llama 3's tokenizer.json and GPT-2's encoder.json + vocab.bpe (as
  vocab.json + merges.txt, GPT2Tokenizer).
- Greedy decoding: transformers' generate (no sampling, stopping at that token) writes the same text as
  `shardtrain generate --temperature 0` from the export, and from the sharded checkpoint itself; for the
  bf16 export too (both sides compute in f32 on the same rounded weights).
- The dataset's tokenizer.json saved again by transformers (other bytes, the same ids) is taken by evaluate and
  generate as the dataset's and the checkpoint's tokenizer; with two ids swapped it is refused (exit 4)."""
import json
import os
import subprocess

from torch_env import Test

t = Test(with_dataset=True)
args, check, work, env, tok, ds = t.args, t.check, t.work, t.env, t.tokenizer, t.dataset
st = args.shardtrain


def run(*cmd, timeout=600):
    p = subprocess.run(list(cmd), cwd=args.source, capture_output=True, text=True, timeout=timeout)
    check(p.returncode == 0, f"{' '.join(cmd[:3])} ... exit {p.returncode}: {p.stderr[-2000:]}")
    return p


ckpts = os.path.join(work, "ckpt")
run(args.mpiexec, "--oversubscribe", "-np", "2", st, "train", "--config", "configs/tiny-cpu.toml", "--data.path", ds,
    "--logging.run_dir", os.path.join(work, "run"), "--checkpoint.dir", ckpts,
    "--model.vocab_size", "512", "--model.hidden_size", "96", "--model.intermediate_size", "256",
    "--model.num_hidden_layers", "2", "--model.num_attention_heads", "4", "--model.num_key_value_heads", "2",
    "--data.seq_len", "64", "--data.global_batch_size", "16", "--schedule.max_steps", "60",
    "--schedule.warmup_steps", "5", "--schedule.eval_every", "0", "--checkpoint.every_n_steps", "60",
    "--logging.progress", "lines", "--logging.peak_flops", "1e10")
losses = [json.loads(l)["loss"] for l in open(os.path.join(work, "run", "metrics.jsonl")) if '"kind":"train"' in l]
print(f"trained: loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps")
check(len(losses) == 60 and losses[-1] < losses[0] - 0.5, f"training did not learn: {losses[:1]} -> {losses[-1:]}")

# A model as wide as Llama 3's vocabulary (its rows past the dataset's 512 ids never trained), for the exports that
# ship another tokenizer's files below: --tokenizer-unchecked skips the hash, never the count of ids (a tokenizer of
# more ids than the model's rows wrote an eos_token_id past the vocabulary into config.json).
wide = os.path.join(work, "wide-ckpt")
run(st, "train", "--config", "configs/tiny-cpu.toml", "--data.path", ds, "--logging.run_dir", os.path.join(work, "wide"),
    "--checkpoint.dir", wide, "--model.vocab_size", "128256", "--model.hidden_size", "16", "--model.intermediate_size", "32",
    "--model.num_hidden_layers", "1", "--model.num_attention_heads", "2", "--model.num_key_value_heads", "1",
    "--data.seq_len", "16", "--data.global_batch_size", "2", "--schedule.max_steps", "1", "--schedule.warmup_steps", "0",
    "--schedule.eval_every", "0", "--checkpoint.every_n_steps", "1", "--logging.progress", "off")

exports = {}
for dtype in ("f32", "bf16"):
    out = os.path.join(work, f"hf-{dtype}")
    run(st, "consolidate", ckpts, "--output", out, "--format", "safetensors", "--dtype", dtype)
    files = sorted(os.listdir(out)) if os.path.isdir(out) else []
    print(f"export {dtype}: {files}")
    check({"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(files),
          f"export {dtype}: files {files}")
    exports[dtype] = out

prompts = ["Call me Ishmael.", "  Some years ago--never mind how long precisely--having little or no money\n\nin my purse,",
           "The whale, 1851: 'Thar she blows!' Café naïve — 42 ships, 7 harpoons.",
           "It was the Pequod.\tShe was"]
tokenizers = {"trained": tok, "llama3": os.path.join(args.source, "data/fetched/tokenizers/llama3/tokenizer.json"),
              "gpt2": os.path.join(args.source, "data/fetched/tokenizers/gpt2")}
info = {}
for name, path in tokenizers.items():
    info[name] = json.loads(run(st, "tokenizer", "info", "-t", path).stdout)
    hf = exports["f32"] if name == "trained" else os.path.join(work, f"hf-{name}")
    if name != "trained":
        # Another tokenizer's file forms on purpose (their ids, names and special tokens are what is compared): not
        # the model's own, so shipped unchecked.
        run(st, "consolidate", wide, "--output", hf, "--format", "safetensors", "--tokenizer", path,
            "--tokenizer-unchecked")
    theirs = env.side("tokenize", hf, *prompts)
    ours = [json.loads(run(st, "tokenizer", "encode", "--json", "-t", path, "--text", p).stdout)["ids"] for p in prompts]
    print(f"tokenizer {name} ({theirs['class']}): {[len(i) for i in ours]} ids; bos {theirs['bos']} eos {theirs['eos']} pad {theirs['pad']}")
    for i, prompt in enumerate(prompts):
        check(theirs["ids"][i] == ours[i], f"tokenizer {name}, prompt {i}: AutoTokenizer {theirs['ids'][i]} vs shardtrain {ours[i]}")
        check(theirs["decoded"][i] == prompt, f"tokenizer {name}, prompt {i}: AutoTokenizer decodes {theirs['decoded'][i]!r}")
    for role, key in (("bos", "bot_id"), ("eos", "eot_id"), ("pad", "pad_id")):
        expected = info[name].get(key)
        if name == "gpt2" and role == "bos":  # GPT2Tokenizer's default, as in GPT-2's own files: bos = eos
            expected = info[name]["eot_id"]
        got = theirs[role][1] if theirs[role] else None
        check(got == expected, f"tokenizer {name}: AutoTokenizer's {role} token {theirs[role]}, shardtrain's {key} {expected}")
    check(theirs["class"] != "GPT2Tokenizer" or name == "gpt2", f"tokenizer {name}: AutoTokenizer built {theirs['class']}")
for dtype, hf in exports.items():
    for i, prompt in enumerate(prompts):
        ours = json.loads(run(st, "tokenizer", "encode", "--json", "-t", os.path.join(hf, "tokenizer.json"), "--text", prompt).stdout)
        theirs = env.side("generate", hf, "--prompt", prompt, "--max-new-tokens", "40")
        check(theirs["prompt_ids"] == ours["ids"],
              f"{dtype} prompt {i}: AutoTokenizer ids {theirs['prompt_ids']} vs shardtrain's {ours['ids']}")
        check(theirs["eos_id"] == info["trained"]["eot_id"], f"{dtype}: eos {theirs['eos_id']}, eot {info['trained']['eot_id']}")
        sources = [hf] + ([ckpts] if dtype == "f32" else [])
        for source in sources:
            text = run(st, "generate", "--checkpoint", source, "--prompt", prompt, "--max-tokens", "40", "--temperature", "0",
                       "--log-level", "warn").stdout
            text = text[:-1] if text.endswith("\n") else text
            where = "export" if source == hf else "sharded checkpoint"
            print(f"{dtype} prompt {i} ({len(ours['ids'])} ids, {theirs['tokenizer_class']}), {len(theirs['new_ids'])} new: "
                  f"{'same' if text == theirs['text'] else 'DIFFERENT'} text from shardtrain ({where}) and transformers")
            check(text == theirs["text"], f"{dtype} prompt {i}: shardtrain generate from the {where}:\n{text!r}\n"
                                          f"transformers:\n{theirs['text']!r}")
        check(len(theirs["new_ids"]) > 0, f"{dtype} prompt {i}: transformers generated nothing")

# `shardtrain evaluate` on the export (2 ranks, the padded layout, the held-out split in batches of 2: its
# 7 documents give 3) against LlamaForCausalLM's own loss over the same samples, read from the data set by
# an independent reader.
for dtype, hf in exports.items():
    out = os.path.join(work, f"eval-{dtype}.json")
    run(args.mpiexec, "--oversubscribe", "-np", "2", st, "evaluate", "--weights", hf, "--config", "configs/tiny-cpu.toml",
        "--data.path", ds, "--data.layout", "padded", "--data.seq_len", "64", "--data.global_batch_size", "2",
        "--json", out, "--log-level", "warn")
    ours = json.load(open(out)) if os.path.exists(out) else {"loss": float("nan"), "tokens": -1}
    theirs = env.side("evaluate", hf, "--data", ds, "--seq", "64", "--samples", str(ours.get("sources", [{}])[0].get("sequences", 1)))
    diff = abs(ours["loss"] - theirs["loss"]) / theirs["loss"]
    print(f"evaluate {dtype}: shardtrain loss {ours['loss']:.7f} over {ours['tokens']} tokens, transformers {theirs['loss']:.7f} over "
          f"{theirs['tokens']}: {diff:.1e} relative")
    check(ours["tokens"] == theirs["tokens"] and diff < 1e-5,
          f"evaluate {dtype}: shardtrain {ours['loss']!r} ({ours['tokens']} tokens) vs transformers {theirs['loss']!r} ({theirs['tokens']})")

# The dataset's tokenizer.json as transformers saves it again (other indentation and key order, merges as pairs): the
# same tokenizer, so evaluate and generate take it for the dataset's and the checkpoint's (its file hash differs, its
# encoding hash does not); the same file with two ids swapped is refused by both.
resaved = os.path.join(work, "resaved")
size = env.side("resave-tokenizer", tok, resaved)["bytes"]
resaved_json = os.path.join(resaved, "tokenizer.json")
mine, theirs = (json.loads(run(st, "tokenizer", "info", "-t", p).stdout) for p in (tok, resaved_json))
print(f"re-saved by transformers: {os.path.getsize(tok)} -> {size} bytes; hash {mine['hash']} -> {theirs['hash']}, "
      f"encoding hash {mine['encoding_hash']} -> {theirs['encoding_hash']}")
check(open(tok, "rb").read() != open(resaved_json, "rb").read() and mine["hash"] != theirs["hash"],
      "transformers wrote the tokenizer back byte for byte: this check proves nothing")
check(mine["encoding_hash"] == theirs["encoding_hash"], f"encoding hashes differ: {mine} vs {theirs}")
swapped_json = os.path.join(work, "swapped", "tokenizer.json")
os.makedirs(os.path.dirname(swapped_json), exist_ok=True)
doc = json.load(open(resaved_json))
vocab = doc["model"]["vocab"]
a, b = sorted(vocab, key=vocab.get)[300:302]  # two merged tokens (ids 300 and 301), their ids swapped
vocab[a], vocab[b] = vocab[b], vocab[a]
json.dump(doc, open(swapped_json, "w"))
check(json.loads(run(st, "tokenizer", "info", "-t", swapped_json).stdout)["encoding_hash"] != mine["encoding_hash"],
      "two ids swapped keep the encoding hash")
for name, path, ok in (("re-saved", resaved_json, True), ("ids swapped", swapped_json, False)):
    out = os.path.join(work, f"eval-{name.replace(' ', '-')}.json")
    p = subprocess.run([st, "evaluate", "--weights", ckpts, "--tokenizer", path, "--data.path", ds, "--data.seq_len", "64",
                        "--data.global_batch_size", "2", "--json", out, "--log-level", "warn"], cwd=args.source,
                       capture_output=True, text=True, timeout=300)
    g = subprocess.run([st, "generate", "--checkpoint", ckpts, "--tokenizer", path, "--prompt", prompts[0], "--max-tokens", "5",
                        "--temperature", "0", "--log-level", "warn"], cwd=args.source, capture_output=True, text=True, timeout=300)
    print(f"{name} tokenizer: evaluate exit {p.returncode}, generate exit {g.returncode}")
    if ok:
        check(p.returncode == 0 and os.path.exists(out), f"evaluate with the {name} tokenizer: exit {p.returncode}: {p.stderr[-800:]}")
        check(g.returncode == 0, f"generate with the {name} tokenizer: exit {g.returncode}: {g.stderr[-800:]}")
    else:
        check(p.returncode == 4 and "is not the tokenizer of" in p.stderr,
              f"evaluate with the {name} tokenizer: exit {p.returncode}: {p.stderr[-800:]}")
        check(g.returncode == 4 and "is not the one" in g.stderr, f"generate with the {name} tokenizer: exit {g.returncode}: {g.stderr[-800:]}")

check.finish("Hugging Face export: AutoTokenizer and LlamaForCausalLM load it; same ids and the same greedy text (f32, bf16); "
             "shardtrain evaluate's loss is transformers' on the same held-out samples")
