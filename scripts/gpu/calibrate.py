#!/usr/bin/env python3
"""The one-GPU calibration of `shardtrain predict` (docs/predict.md, "Calibration"), from a GPU session's raw outputs.

Each shape the session measured (run.sh's `bench` phase: bench/<shape>/bench-vs-pytorch.json, shardtrain's row) is
predicted again for the same config, overrides, batch and device, and the two steps and peaks are set side by side.
A shape is priced with the same session's `ops` profile (bench/ops-<shape>.json) where the session wrote one, else by
the rule scripts/predictions.sh uses (profile_args below: profiles/<gpu>/ops-<shape>.json, then the other GPU's, then
the H200 seed profile without its attention rows).

  scripts/gpu/calibrate.py RUN [RUN ...] [--out DIR] [--install-profiles] [--bin PATH]
  scripts/gpu/calibrate.py --profile-args GPU SHAPE        (the rule alone, one argument a line: predictions.sh)

RUN: a folder the device tool's files were kept in, as under docs/gpu-runs/ (its logs.tar.gz is read), or such a
logs.tar.gz unpacked. A later RUN's measurement or profile of a shape replaces an earlier one's, so a session's
second call can be named after its first.
--install-profiles copies each shape's profile into profiles/<gpu>/ops-<shape>.json (the names predictions.sh looks
for) before predicting, so the calibration and the published predictions price from the same files.
--out DIR keeps each prediction's report and JSON (calib-<shape>-<gpu>.txt / .json) and the table (calibration.md).
The table goes to standard output. Exit 0 when it was made, whatever the ratios (issue 34 asks for 5 %: the table
says which shapes hold it); 2 for bad input (a RUN without measurements, a GPU `shardtrain predict` has no rates for).
"""
import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ("seed", "1b", "8b")  # scripts/gpu/run.sh's names
WITHIN = 0.05  # issue 34: the one-GPU steps within 5 %
SEED_FALLBACK = ("h200/seed-b64-s512.json", "attention_forward", "attention_backward")


def rel(path: Path) -> Path:
    """`path` as the repository names it where it lies inside (the commands run there), else absolute."""
    path = path.resolve()
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def fail(message: str) -> None:
    print(f"calibrate: {message}", file=sys.stderr)
    sys.exit(2)


def gpu_of(device: str) -> str:
    """`predict --gpu` for a device string ("cuda:0 (NVIDIA H200, 139.8 GiB)", "NVIDIA H100 80GB HBM3")."""
    if not any(form in device for form in ("PCIe", "NVL")):  # other memories and clocks than predict's rates
        if "H200" in device:
            return "h200"
        if "H100" in device:
            return "h100"  # the SXM part (HBM3)
    fail(f"device {device!r}: `shardtrain predict` has rates for the H100 SXM and the H200 SXM only")


def profile_args(gpu: str, shape: str, profiles: Path) -> list:
    """The profile a shape is priced with on `gpu`: its own shape's from this GPU, else from the other one (predict
    scales the memory-bound calls by the two bandwidths), else the H200 seed profile of 2026-11-26 without its
    attention rows (our kernels then; cuDNN's measured rates price attention instead)."""
    for kind in dict.fromkeys((gpu, "h200", "h100")):
        own = profiles / kind / f"ops-{shape}.json"
        if own.is_file():
            return ["--ops-profile", str(own)]
    path, *excluded = SEED_FALLBACK
    args = ["--ops-profile", str(profiles / path)]
    for op in excluded:
        args += ["--ops-profile-exclude", op]
    return args


def read_run(run: Path) -> dict:
    """name -> bytes of the files under bench/ a run kept (from its logs.tar.gz, or unpacked)."""
    files = {}
    archive = run / "logs.tar.gz"
    if archive.is_file():
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                name = os.path.normpath(member.name)
                if member.isfile() and name.startswith("bench/"):
                    files[name] = tar.extractfile(member).read()
    elif (run / "bench").is_dir():
        for path in (run / "bench").rglob("*"):
            if path.is_file():
                files[str(path.relative_to(run))] = path.read_bytes()
    else:
        fail(f"{run}: neither logs.tar.gz nor a bench/ folder (a run of scripts/gpu/run.sh, as docs/gpu-runs keeps it)")
    return files


def load_json(data: bytes, where: str) -> dict:
    try:
        return json.load(io.BytesIO(data))
    except ValueError as e:
        fail(f"{where}: not JSON ({e})")


def predict_args(measured: dict, where: str) -> list:
    """The measured run's config and overrides as `shardtrain predict` options (data.path left out: predict reads
    no data, and the path is the GPU machine's)."""
    config = measured.get("config")
    if not config:
        fail(f"{where}: no \"config\"")
    args = ["--config", str(Path("configs") / Path(config).name)]
    for override in measured.get("overrides", []):
        key, _, value = override.partition("=")
        if key != "data.path":
            args += [f"--{key}", value]
    return args


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, help="GPU session outputs (docs/gpu-runs/...), oldest first")
    ap.add_argument("--out", type=Path, help="keep each prediction and the table here")
    ap.add_argument("--install-profiles", action="store_true", help="copy the runs' ops-<shape>.json into profiles/")
    ap.add_argument("--profiles", type=Path, default=ROOT / "profiles", help="the profile folder (default profiles/)")
    ap.add_argument("--bin", default=str(ROOT / "build/bin/shardtrain"), help="the shardtrain binary")
    ap.add_argument("--profile-args", nargs=2, metavar=("GPU", "SHAPE"), help="print the profile rule's arguments")
    a = ap.parse_args()
    a.runs = [rel(run) for run in a.runs]
    a.profiles = rel(a.profiles)
    a.out = a.out and rel(a.out)
    os.chdir(ROOT)  # configs/ and profiles/ as the repository names them
    if a.profile_args:
        print("\n".join(profile_args(a.profile_args[0], a.profile_args[1], a.profiles)))
        return 0
    if not a.runs:
        fail("name at least one run folder (docs/gpu-runs/<date>-<gpu>/<bundle>)")

    measured, profiles = {}, {}  # shape -> (run, row of bench-vs-pytorch.json's "shardtrain"), (run, bytes)
    for run in a.runs:
        files = read_run(run)
        for shape in SHAPES:
            name = f"bench/{shape}/bench-vs-pytorch.json"
            if name in files:
                table = load_json(files[name], f"{run}/{name}")
                row = table.get("results", {}).get("shardtrain")
                if row and row.get("step_time_median_s"):
                    measured[shape] = (run, table, row)
            if f"bench/ops-{shape}.json" in files:
                profiles[shape] = (run, files[f"bench/ops-{shape}.json"])
    if not measured:
        fail(f"no shardtrain step measured in {', '.join(map(str, a.runs))} (run.sh's bench phase writes them)")

    if a.install_profiles:
        for shape, (run, data) in profiles.items():
            gpu = gpu_of(load_json(data, f"{run}/bench/ops-{shape}.json").get("device", ""))
            target = a.profiles / gpu / f"ops-{shape}.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            replaced = target.is_file() and target.read_bytes() != data
            target.write_bytes(data)
            print(f"profile: {run}/bench/ops-{shape}.json -> {target}{' (replaced)' if replaced else ''}")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.TemporaryDirectory(prefix="calibrate-")
    work = a.out or Path(scratch.name)

    rows = []
    for shape in SHAPES:
        if shape not in measured:
            continue
        run, table, row = measured[shape]
        gpu = gpu_of(row.get("device", ""))
        args = predict_args(table, f"{run}/bench/{shape}/bench-vs-pytorch.json")
        if shape in profiles and not a.install_profiles:  # the session's own profile, read where it lies
            staged = work / f"ops-{shape}-{gpu}.json"
            staged.write_bytes(profiles[shape][1])
            source = ["--ops-profile", str(staged)]
        else:
            source = profile_args(gpu, shape, a.profiles)
        stem = f"calib-{shape}-{gpu}"
        out_json = work / f"{stem}.json"
        cmd = [a.bin, "predict", *args, "--nodes", "1", "--gpus-per-node", "1", "--gpu", gpu, *source,
               "--json", str(out_json)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout + p.stderr, file=sys.stderr)
            fail(f"{shape}: `{' '.join(cmd)}` exited {p.returncode}")
        (work / f"{stem}.txt").write_text(p.stdout)
        pred = json.loads(out_json.read_text())
        step, predicted = row["step_time_median_s"], pred["step_s"]
        rows.append({
            "shape": shape, "gpu": gpu, "run": str(run), "measured_step_s": step, "predicted_step_s": predicted,
            "ratio": predicted / step, "within": abs(predicted / step - 1) <= WITHIN,
            "measured_peak_bytes": row.get("peak_memory_bytes"), "predicted_peak_bytes": pred["peak_device_bytes"],
            "calls_from_profile": pred["op_calls_from_profile"],
            "calls": pred["op_calls_from_profile"] + pred["op_calls_from_rates"],  # the rates' include the nearest GEMM's
            "profile": source[1]})

    gib = 1 << 30
    lines = ["| shape | GPU | measured step | predicted | ratio | within 5 % | measured peak | predicted peak | "
             "calls priced from the profile | profile |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        peak = f"{r['measured_peak_bytes'] / gib:.2f} GiB" if r["measured_peak_bytes"] else "-"
        lines.append(
            f"| {r['shape']} | {r['gpu']} | {1e3 * r['measured_step_s']:.1f} ms | {1e3 * r['predicted_step_s']:.1f} ms "
            f"| {r['ratio']:.3f} | {'yes' if r['within'] else 'no'} | {peak} | {r['predicted_peak_bytes'] / gib:.2f} GiB "
            f"| {r['calls_from_profile']} of {r['calls']} | {r['profile']} |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if a.out:
        (a.out / "calibration.md").write_text(text)
        (a.out / "calibration.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
