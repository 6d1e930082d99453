"""The host side's handle on scripts/torch-env.sh (PyTorch and transformers in a Debian root of their own):
a skip (exit 77, ctest's SKIP_RETURN_CODE) with the reason when it is not there, and the calls the tests make."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import clitest  # noqa: E402


class TorchEnv:
    def __init__(self, source):
        self.script = os.path.join(source, "scripts", "torch-env.sh")
        p = subprocess.run([self.script, "status"], capture_output=True, text=True)
        if p.returncode != 0:
            print(f"SKIP: PyTorch/transformers environment: {p.stderr.strip() or p.stdout.strip()} "
                  f"(scripts/test.sh sets it up with scripts/torch-env.sh setup)")
            sys.exit(SKIP)
        v = subprocess.run([self.script, "versions"], capture_output=True, text=True)
        print("torch-env:", " ".join(v.stdout.split()))

    def run(self, *argv, timeout=900):
        """(exit code, stdout, stderr) of ARGV inside the environment."""
        p = subprocess.run([self.script, "run", *argv], capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr

    def side(self, *argv):
        """tests/torch/torch_side.py VERB ...: its JSON result; a failure stops the test with the output."""
        rc, out, err = self.run("python3", os.path.join(HERE, "torch_side.py"), *argv)
        if rc != 0 or not out.strip():
            print(f"FAIL: torch_side.py {' '.join(argv)} exit {rc}\n{out}\n{err[-3000:]}", file=sys.stderr)
            sys.exit(1)
        return json.loads(out.strip().splitlines()[-1])


class Test:
    """What every test here starts with: its arguments, the failure list (clitest.Checks), a fresh work folder
    and the environment (or a skip); with_dataset also trains a 512-token BPE on Moby Dick and prepares its
    data set (self.tokenizer, self.dataset)."""

    def __init__(self, with_dataset=False):
        self.args = clitest.parse_args()
        self.check = clitest.Checks()
        self.work = clitest.fresh_workdir(self.args)
        self.env = TorchEnv(self.args.source)
        if with_dataset:
            moby = clitest.corpus(self.args, "moby-dick")
            self.tokenizer, self.dataset = clitest.prepare_dataset(self.args, moby, self.work, 512, "moby-bpe512", 0.05)
