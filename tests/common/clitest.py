"""Shared pieces of the end-to-end tests that drive the shardtrain binary from Python: their arguments,
the failure list every check adds to, the fetched corpus, and a small dataset made with a trained BPE."""
import argparse
import os
import shutil
import subprocess
import sys


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shardtrain", required=True)
    parser.add_argument("--mpiexec", default="mpirun")
    parser.add_argument("--source", required=True)
    parser.add_argument("--workdir", required=True)
    return parser.parse_args()


class Checks:
    """check(cond, what) records a failure and goes on; finish() prints the closing line and exits."""

    def __init__(self):
        self.failures = []

    def __call__(self, cond, what):
        if not cond:
            self.failures.append(what)
            print("FAIL:", what, file=sys.stderr)

    def finish(self, passed_line):
        print(f"{len(self.failures)} failed" if self.failures else passed_line)
        sys.exit(1 if self.failures else 0)


def corpus(args, name):
    """data/fetched/corpus/NAME, or a clear failure when scripts/fetch-data.sh has not run."""
    path = os.path.join(args.source, "data/fetched/corpus", name)
    if not os.path.isdir(path):
        print(f"FAIL: {path} missing: run ./scripts/fetch-data.sh first", file=sys.stderr)
        sys.exit(1)
    return path


# The small Llama shape most script tests train (2 layers, hidden 64, 4 heads, 2 KV heads; seq 64, batch 8), as
# command-line overrides of configs/tiny-cpu.toml; the vocabulary is the test's own.
TINY_MODEL = ["--model.hidden_size", "64", "--model.intermediate_size", "128", "--model.num_hidden_layers", "2",
              "--model.num_attention_heads", "4", "--model.num_key_value_heads", "2", "--data.seq_len", "64",
              "--data.global_batch_size", "8"]


def fresh_workdir(args):
    work = os.path.abspath(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    return work


def prepare_dataset(args, corpus_path, work, vocab_size, stem, validation_fraction):
    """Trains a BPE of vocab_size on the corpus and prepares WORK/STEM.h5 with it; returns (tokenizer, dataset)."""
    tok, ds = os.path.join(work, f"{stem}.json"), os.path.join(work, f"{stem}.h5")
    for cmd in (["tokenizer", "train", "--input", corpus_path, "--vocab-size", str(vocab_size), "--output", tok],
                ["prepare-data", "-t", tok, "-i", corpus_path, "-o", ds, "--validation-fraction", str(validation_fraction)]):
        subprocess.run([args.shardtrain, *cmd, "--log-level", "warn"], check=True)
    return tok, ds


def shardtrain_runner(args, cwd):
    """run(cmd, np=None, timeout=300) -> (returncode, stdout, stderr): the binary alone, or under mpirun -np NP, in
    `cwd`, without the caller's SHARDTRAIN_RANKS_PER_NODE."""
    st = os.path.abspath(args.shardtrain)

    def run(cmd, np=None, timeout=300):
        env = dict(os.environ)
        env.pop("SHARDTRAIN_RANKS_PER_NODE", None)
        full = [args.mpiexec, "--oversubscribe", "-np", str(np), st, *cmd] if np else [st, *cmd]
        p = subprocess.run(full, capture_output=True, text=True, errors="replace", timeout=timeout, env=env, cwd=cwd)
        return p.returncode, p.stdout, p.stderr

    return run
