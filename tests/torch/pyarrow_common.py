"""What parquet_pyarrow_test.py and arrow_pyarrow_test.py share: the texts pyarrow writes, running
pyarrow_side.py in the environment, prepare-data of a file, and comparing two datasets by h5diff."""
import json
import os
import subprocess

from torch_env import HERE


def sample_texts(source):
    """The default corpus in sentences (the short ones repeat, so dictionaries form), and text no address has."""
    texts = []
    sotu = os.path.join(source, "data", "fetched", "corpus", "sotu")
    for name in sorted(os.listdir(sotu)):
        text = open(os.path.join(sotu, name), encoding="utf-8").read()
        texts += [s + "." for s in text.replace("\n", " ").split(". ") if s.strip()]
    return texts + ["", "Ünïcödé café, 中文文本, emoji 😀👍🏽, a NUL \x00 inside", "x" * 200_000]


def pyarrow_side(env, mode, texts, work, *extra):
    """pyarrow_side.py MODE on TEXTS into WORK (EXTRA: its further arguments): its report, or None after printing
    why it failed."""
    with open(os.path.join(work, "texts.json"), "w", encoding="utf-8") as f:
        json.dump(texts, f, ensure_ascii=False)
    rc, out, err = env.run("python3", os.path.join(HERE, "pyarrow_side.py"), mode, os.path.join(work, "texts.json"), work,
                           *extra)
    if rc != 0:
        print(f"FAIL: pyarrow_side.py {mode} exit {rc}\n{out}\n{err[-3000:]}")
        return None
    return json.loads(out.strip().splitlines()[-1])


def prepare(args, work, inp, name, tokenizer=None, extra=()):
    """prepare-data of INP (r50k_base, or TOKENIZER) into WORK/NAME.h5 in 1 MB batches, EXTRA arguments added:
    (exit code, dataset, stderr)."""
    tokenizer = tokenizer or os.path.join(args.source, "data", "fetched", "tokenizers", "r50k_base.tiktoken")
    ds = os.path.join(work, f"{name}.h5")
    p = subprocess.run([args.shardtrain, "prepare-data", "-t", tokenizer, "-i", inp, "-o", ds, "--batch-mb", "1",
                        "--validation-fraction", "0.01", "--log-level", "warn", *extra],
                       capture_output=True, text=True, timeout=300)
    return p.returncode, ds, p.stderr


def same_tokens(a, b):
    """The two datasets hold the same tokens, documents and splits."""
    return all(subprocess.run(["h5diff", a, b, obj, obj], capture_output=True).returncode == 0
               for obj in ("/tokens", "/doc_offsets", "/split/train", "/split/validation"))
