"""The host side's handle on scripts/torch-env.sh (PyTorch and transformers in a Debian root of their own):
a skip (exit 77, ctest's SKIP_RETURN_CODE) with the reason when it is not there, and the calls the tests make."""
import atexit
import json
import os
import select
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import clitest  # noqa: E402


class TorchEnv:
    """Calls into the environment. Python ones (a verb of torch_side.py, a script, -c CODE) go to one
    `torch_side.py serve` process, started here beside the test's own first steps: importing torch and
    transformers costs seconds of CPU, once per test instead of once per call."""

    def __init__(self, source):
        self.script = os.path.join(source, "scripts", "torch-env.sh")
        p = subprocess.run([self.script, "status"], capture_output=True, text=True)
        if p.returncode != 0:
            print(f"SKIP: PyTorch/transformers environment: {p.stderr.strip() or p.stdout.strip()} "
                  f"(scripts/test.sh sets it up with scripts/torch-env.sh setup)")
            sys.exit(SKIP)
        self.server = None
        self.start()
        atexit.register(self.close)

    def start(self):
        self.server = subprocess.Popen([self.script, "run", "python3", os.path.join(HERE, "torch_side.py"), "serve"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self.pending = b""
        self.greeted = False

    def close(self):
        if self.server is not None:
            self.server.stdin.close()
            try:
                self.server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.server.kill()
            self.server = None

    def read_line(self, timeout):
        """The server's next line (parsed), or None when it ended or timeout seconds passed (then it is stopped)."""
        deadline = time.monotonic() + timeout
        fd = self.server.stdout.fileno()
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.server.kill()
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def request(self, argv, timeout):
        if self.server is None or self.server.poll() is not None:
            self.start()
        if not self.greeted:
            hello = self.read_line(timeout)
            if hello is None:
                self.server.wait()
                return 1, "", f"torch_side.py serve did not start (exit {self.server.returncode})"
            print("torch-env:", " ".join(f"{k} {v}" for k, v in hello["versions"].items() if v))
            self.greeted = True
        self.server.stdin.write((json.dumps({"argv": list(argv)}) + "\n").encode())
        answer = self.read_line(timeout)
        if answer is None:
            self.server.wait()
            return 1, "", f"torch_side.py serve ended or passed {timeout} s on {' '.join(argv)[:200]} (exit {self.server.returncode})"
        return answer["rc"], answer["out"], answer["err"]

    def run(self, *argv, timeout=900):
        """(exit code, stdout, stderr) of ARGV inside the environment."""
        if len(argv) > 1 and argv[0] == "python3" and (argv[1] == "-c" or argv[1].endswith(".py")):
            if argv[1] == os.path.join(HERE, "torch_side.py"):
                return self.request(argv[2:], timeout)
            return self.request(argv[1:], timeout)
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
