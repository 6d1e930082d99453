#!/usr/bin/env python3
"""scripts/gpu/calibrate.py, offline, on the GPU session outputs kept in docs/gpu-runs (2026-11-27, H200):
- the two calls of that session, oldest first: the seed's step from the first, the 1B's and 8B's from the second
  (a later run's measurement replaces an earlier one's), each as its bench-vs-pytorch.json says, on the H200, each
  predicted within 15 % (issue 34's bound for the CPU; a drift past it is a regression of the model or the engine),
  the report and JSON of each prediction and the table kept in --out;
- the first call alone gives its own (deterministic-backward) 1B and 8B steps;
- a session's own profile is installed under profiles/<gpu>/ops-<shape>.json and prices that shape (a folder laid out
  as logs.tar.gz unpacks, with the H200 seed profile standing in for a session's ops-seed.json);
- the profile rule predictions.sh uses: this GPU's shape profile, else the other GPU's, else the seed profile without
  its attention rows;
- bad input: a folder with no run in it, a GPU predict has no rates for: exit 2 with a message naming it."""
import json
import os
import shutil
import subprocess
import sys
import tarfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
script = os.path.join(args.source, "scripts/gpu/calibrate.py")
runs = os.path.join(args.source, "docs/gpu-runs/2026-11-27-h200")
first, second = os.path.join(runs, "1aeba62"), os.path.join(runs, "1aeba62-fast")


def calibrate(*extra, expect=0):
    p = subprocess.run([sys.executable, script, "--bin", args.shardtrain, *extra], cwd=work, capture_output=True,
                       text=True, timeout=300)
    check(p.returncode == expect, f"{' '.join(extra)}: exit {p.returncode}, expected {expect}\n{p.stdout}{p.stderr}")
    return p


def same(reported, path):
    """The script names paths inside the repository relative to it (this test's workdir may lie there)."""
    return os.path.realpath(os.path.join(args.source, reported)) == os.path.realpath(path)


def measured_step(run, shape):
    """The shardtrain step of a run's bench-vs-pytorch.json, read here independently of the script."""
    with tarfile.open(os.path.join(run, "logs.tar.gz")) as tar:
        table = json.load(tar.extractfile(f"./bench/{shape}/bench-vs-pytorch.json"))
    return table["results"]["shardtrain"]["step_time_median_s"]


# Both calls of the session, oldest first.
out = os.path.join(work, "both")
p = calibrate(first, second, "--out", out)
rows = json.load(open(os.path.join(out, "calibration.json")))
check([r["shape"] for r in rows] == ["seed", "1b", "8b"], f"shapes {[r['shape'] for r in rows]}")
expected_from = {"seed": first, "1b": second, "8b": second}
for r in rows:
    run = expected_from[r["shape"]]
    check(r["gpu"] == "h200", f"{r['shape']}: gpu {r['gpu']}")
    check(r["measured_step_s"] == measured_step(run, r["shape"]), f"{r['shape']}: step from {run}")
    check(0.85 <= r["ratio"] <= 1.15, f"{r['shape']}: predicted / measured {r['ratio']:.3f} outside 0.85-1.15")
    check(abs(r["ratio"] - r["predicted_step_s"] / r["measured_step_s"]) < 1e-12, f"{r['shape']}: ratio")
    check(r["within"] == (abs(r["ratio"] - 1) <= 0.05), f"{r['shape']}: within 5 %")
    pred = json.load(open(os.path.join(out, f"calib-{r['shape']}-h200.json")))
    check(pred["prediction"] is True and pred["nodes"] == 1 and pred["mesh"] == "1 (replicate) x 1 (shard)",
          f"{r['shape']}: one GPU predicted")
    check(pred["step_s"] == r["predicted_step_s"], f"{r['shape']}: the table's prediction is the JSON's")
    report = open(os.path.join(out, f"calib-{r['shape']}-h200.txt")).read()
    check("PREDICTION, not a measurement" in report and "1 H200 GPUs" in report, f"{r['shape']}: report kept")
    check(r["profile"] == "profiles/h200/seed-b64-s512.json", f"{r['shape']}: priced with {r['profile']}")
check(rows[1]["measured_peak_bytes"] > 0 and rows[1]["predicted_peak_bytes"] > 0, "peaks")
table = open(os.path.join(out, "calibration.md")).read()
check(table == p.stdout and table.count("\n| ") == 3 and "| 1b | h200 | 238.8 ms |" in table, f"table:\n{table}")

# The first call alone: its own 1B step (the deterministic backward, 247.8 ms).
p = calibrate(first, "--out", os.path.join(work, "first"))
rows = json.load(open(os.path.join(work, "first", "calibration.json")))
check(rows[1]["measured_step_s"] == measured_step(first, "1b") and abs(rows[1]["measured_step_s"] - 0.2478) < 5e-4,
      f"first call's 1B step {rows[1]['measured_step_s']}")

# A session's own profile, installed (an unpacked run: bench/ as logs.tar.gz holds it).
run = os.path.join(work, "session")
os.makedirs(os.path.join(run, "bench", "seed"))
with tarfile.open(os.path.join(first, "logs.tar.gz")) as tar:
    data = tar.extractfile("./bench/seed/bench-vs-pytorch.json").read()
open(os.path.join(run, "bench", "seed", "bench-vs-pytorch.json"), "wb").write(data)
seed_profile = os.path.join(args.source, "profiles/h200/seed-b64-s512.json")
shutil.copy(seed_profile, os.path.join(run, "bench", "ops-seed.json"))
profiles = os.path.join(work, "profiles")
# Not installed, the session's profile still prices its shape, read where the run keeps it.
calibrate(run, "--profiles", profiles, "--out", os.path.join(work, "own"))
rows = json.load(open(os.path.join(work, "own", "calibration.json")))
check(same(rows[0]["profile"], os.path.join(work, "own", "ops-seed-h200.json")) and rows[0]["calls_from_profile"] > 560
      and not os.path.exists(profiles), f"the session's own profile, not installed: {rows}")
p = calibrate(run, "--install-profiles", "--profiles", profiles, "--out", os.path.join(work, "installed"))
installed = os.path.join(profiles, "h200", "ops-seed.json")
check(os.path.isfile(installed) and open(installed, "rb").read() == open(seed_profile, "rb").read(),
      "ops-seed.json installed under profiles/h200")
check(same(p.stdout.split("\n")[0].split(" -> ")[-1], installed), f"the install is reported:\n{p.stdout}")
rows = json.load(open(os.path.join(work, "installed", "calibration.json")))
check(len(rows) == 1 and same(rows[0]["profile"], installed), f"priced with the installed profile: {rows}")
# Its attention rows (our kernels) now price attention too, so fewer calls come from the rates than without them.
check(rows[0]["calls_from_profile"] > 560, f"{rows[0]['calls_from_profile']} calls from the profile")

# The rule predictions.sh reads.
def rule(gpu, shape):
    """The arguments, with the profile's path made absolute."""
    out = calibrate("--profiles", profiles, "--profile-args", gpu, shape).stdout.split("\n")[:-1]
    return out[:1] + [os.path.realpath(os.path.join(args.source, out[1]))] + out[2:] if len(out) > 1 else out
check(rule("h200", "seed") == ["--ops-profile", os.path.realpath(installed)], "h200 seed: its own")
check(rule("h100", "seed") == ["--ops-profile", os.path.realpath(installed)], "h100 seed: the H200's, scaled by predict")
os.makedirs(os.path.join(profiles, "h100"))
shutil.copy(seed_profile, os.path.join(profiles, "h100", "ops-seed.json"))
check(rule("h100", "seed") == ["--ops-profile", os.path.realpath(os.path.join(profiles, "h100", "ops-seed.json"))],
      "h100 seed: its own")
check(rule("h100", "8b") == ["--ops-profile", os.path.realpath(os.path.join(profiles, "h200", "seed-b64-s512.json")),
                             "--ops-profile-exclude", "attention_forward", "--ops-profile-exclude",
                             "attention_backward"], "8b: the seed fallback")

# Bad input.
empty = os.path.join(work, "empty")
os.makedirs(empty)
p = calibrate(empty, expect=2)
check(p.stderr.count("\n") == 1 and (os.path.relpath(empty, args.source) in p.stderr or empty in p.stderr),
      f"empty folder named: {p.stderr}")
check("logs.tar.gz" in p.stderr, f"empty folder: what was expected: {p.stderr}")
pcie = os.path.join(work, "pcie")
os.makedirs(os.path.join(pcie, "bench", "seed"))
table = json.loads(data)
table["results"]["shardtrain"]["device"] = "cuda:0 (NVIDIA H100 PCIe, 79.1 GiB)"
open(os.path.join(pcie, "bench", "seed", "bench-vs-pytorch.json"), "w").write(json.dumps(table))
p = calibrate(pcie, expect=2)
check(p.stderr.count("\n") == 1 and "H100 PCIe" in p.stderr and "H200" in p.stderr, f"H100 PCIe: {p.stderr}")

check.finish("PASS: the one-GPU calibration from a GPU session's outputs")
