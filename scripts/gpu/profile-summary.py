#!/usr/bin/env python3
"""Where one training step's GPU time goes, kernel by kernel, from two Nsight Compute runs of `shardtrain bench step`
(scripts/gpu/run.sh profile): the same run with 1 and with 2 steps (no warm-up), so that what the second run adds
is exactly one steady-state step, set-up kernels excluded.

  profile-summary.py ONE_STEP.csv TWO_STEPS.csv [--step-ms MS] > profile.md

Each CSV is `ncu --csv --page raw --print-units base --metrics gpu__time_duration.sum --log-file FILE` output: a
header row naming "Kernel Name" and the metric, maybe a row of units, one row per kernel launch; other lines (ncu's
==PROF== messages) are skipped. Kernels are grouped by name (template arguments and parameters dropped); cuBLAS's
GEMM kernels, whatever their names, are one group. --step-ms (the step's wall time from `bench step`, without the
profiler) adds the share of the step that no kernel covers (host gaps, copies, collectives)."""
import argparse
import collections
import csv
import re
import sys

METRIC = "gpu__time_duration.sum"
UNIT_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}


def group(name):
    """A short group name for a kernel: GEMMs together, else the function name without namespaces or arguments."""
    low = name.lower()
    if any(k in low for k in ("gemm", "cutlass", "xmma", "cublas", "sm90_", "sm80_", "nvjet")):
        return "cuBLASLt GEMMs"
    base = name.replace("(anonymous namespace)::", "").split("(", 1)[0]  # the parameters
    base = re.sub(r"<.*", "", base).replace("void ", "").strip()  # template arguments, return type
    return base.split("::")[-1] or name  # shardtrain's kernel names say their op (swiglu_forward_kernel, ...)


def read(path):
    """Per group: (launches, total ns)."""
    lines = [l for l in open(path, encoding="utf-8", errors="replace") if l.startswith('"')]
    rows = list(csv.reader(lines))
    header = next((i for i, r in enumerate(rows) if "Kernel Name" in r and any(METRIC in c for c in r)), None)
    if header is None:
        sys.exit(f"{path}: no CSV header with 'Kernel Name' and {METRIC} (is it ncu --csv --page raw output?)")
    names = rows[header]
    k_col = names.index("Kernel Name")
    t_col = next(i for i, c in enumerate(names) if METRIC in c)
    scale = 1.0
    body = rows[header + 1:]
    if body and body[0][t_col].strip() in UNIT_NS:  # the units row
        scale = UNIT_NS[body[0][t_col].strip()]
        body = body[1:]
    out = collections.defaultdict(lambda: [0, 0.0])
    for r in body:
        if len(r) <= max(k_col, t_col):
            continue
        try:
            t = float(r[t_col].replace(",", "")) * scale
        except ValueError:
            continue
        g = out[group(r[k_col])]
        g[0] += 1
        g[1] += t
    if not out:
        sys.exit(f"{path}: no kernel rows")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("one")
    p.add_argument("two")
    p.add_argument("--step-ms", type=float, default=None, help="the step's wall time without the profiler")
    a = p.parse_args()
    one, two = read(a.one), read(a.two)
    step = {}
    for g in set(one) | set(two):
        n = two[g][0] - one[g][0] if g in one else two[g][0]
        t = two[g][1] - one[g][1] if g in one else two[g][1]
        if n > 0 or t > 0:
            step[g] = (n, max(t, 0.0))
    total = sum(t for _, t in step.values())
    print(f"| kernel (group) | launches per step | ms per step | share of kernel time | mean us |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for g, (n, t) in sorted(step.items(), key=lambda kv: -kv[1][1]):
        print(f"| {g} | {n} | {t / 1e6:.3f} | {100 * t / total:.1f} % | {t / 1e3 / max(n, 1):.1f} |")
    launches = sum(n for n, _ in step.values())
    print(f"| all kernels | {launches} | {total / 1e6:.3f} | 100 % | |")
    if a.step_ms:
        gap = a.step_ms - total / 1e6
        print(f"\nstep wall time {a.step_ms:.3f} ms (bench step, no profiler); kernels cover {total / 1e6:.3f} ms "
              f"({100 * total / 1e6 / a.step_ms:.1f} %), the rest ({gap:.3f} ms) is copies, collectives and host gaps")


if __name__ == "__main__":
    main()
