#!/usr/bin/env python3
"""Compares the per-step training losses of two runs of the same config (the CPU backend and the GPU),
from their run directories' metrics.jsonl. Prints one line per step and PASS or FAIL.

  compare-losses.py [--dtype fp32|bf16] [--common] [--rollback] RUN_DIR_A RUN_DIR_B

--common compares the steps both runs have (a run resumed from a checkpoint against the uninterrupted one).
--rollback compares runs that rolled back (optim.on_divergence = rollback): each run's surviving steps (a step
number seen again drops the stretch from it on), skipped steps included, which must be the same in both.
--tolerance FIRST,LATER replaces the dtype's pair (the CUDA emulator rounds bf16 as the CPU does, so the test
suite holds its runs to 1e-3).

Tolerances (relative difference of the loss):
  fp32: 1e-5 at step 1 (the same weights and batch; only summation orders differ), 1e-3 at any later step
        (differences in the updates compound, slowly at these learning rates);
  bf16: 1e-2 at step 1 (bf16 keeps 8 bits of mantissa: one rounding of a 1e-3-relative difference in an
        activation flips the last bit), 3e-2 at any later step.
Both runs must have the same steps and (without --rollback) no skipped step."""
import argparse
import json
import sys
from pathlib import Path

TOLERANCES = {"fp32": (1e-5, 1e-3), "bf16": (1e-2, 3e-2)}


def losses(run_dir: Path, rollback: bool = False) -> tuple:
    """The run's loss per step, and the steps it skipped (only with rollback: else a skipped step is an error)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        sys.exit(f"compare-losses: {path}: no metrics (did the run start?)")
    out, skipped = {}, set()
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "train":
            step = rec["step"]
            if rollback and out and step <= max(out):  # a rollback: the stretch from this step on was abandoned
                out = {k: v for k, v in out.items() if k < step}
                skipped = {k for k in skipped if k < step}
            if rec.get("skipped"):
                if not rollback:
                    sys.exit(f"compare-losses: {path}: step {step} was skipped (non-finite)")
                skipped.add(step)
            out[step] = rec["loss"]
    return out, skipped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=sorted(TOLERANCES), default="fp32")
    ap.add_argument("--common", action="store_true", help="compare the steps both runs have")
    ap.add_argument("--tolerance", help="FIRST,LATER relative tolerances instead of the dtype's")
    ap.add_argument("--rollback", action="store_true", help="runs that rolled back: their surviving steps, skipped ones included")
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args()
    (a, skipped_a), (b, skipped_b) = losses(args.a, args.rollback), losses(args.b, args.rollback)
    if skipped_a != skipped_b:
        print(f"FAIL: the runs skipped different steps: {sorted(skipped_a)} in {args.a}, {sorted(skipped_b)} in {args.b}")
        return 1
    if args.rollback:
        rolled = [p for p in (args.a, args.b) if '"kind":"rollback"' not in (p / "metrics.jsonl").read_text()]
        if rolled:
            print(f"FAIL: no rollback in {', '.join(map(str, rolled))}")
            return 1
    if args.common:
        a = {k: v for k, v in a.items() if k in b}
        b = {k: v for k, v in b.items() if k in a}
    if sorted(a) != sorted(b) or not a:
        print(f"FAIL: the runs have different steps: {len(a)} in {args.a}, {len(b)} in {args.b}")
        return 1
    first_tol, tol = TOLERANCES[args.dtype]
    if args.tolerance:
        first_tol, tol = (float(v) for v in args.tolerance.split(","))
    worst = 0.0
    ok = True
    print(f"{'step':>5} {args.a.name:>24} {args.b.name:>24} {'rel diff':>10}")
    for step in sorted(a):
        rel = abs(a[step] - b[step]) / max(abs(a[step]), 1e-12)
        limit = first_tol if step == min(a) else tol
        flag = "" if rel <= limit else f"  > {limit:g}"
        ok = ok and rel <= limit
        worst = max(worst, rel)
        print(f"{step:>5} {a[step]:>24.10f} {b[step]:>24.10f} {rel:>10.2e}{flag}")
    print(f"{'PASS' if ok else 'FAIL'}: {args.dtype}, {len(a)} steps, largest relative loss difference {worst:.3e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
