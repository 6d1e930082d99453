#!/usr/bin/env python3
"""st_sbatch_shape (jobs/slurm/lib.sh): the nodes and tasks per node that jobs/slurm/submit.sh reads from a job
script's #SBATCH lines and the sbatch options before queueing, so that `shardtrain check` tests the mesh then.
No Slurm needed: the function only reads text. Each case asserts the shape found, or that none was found and why;
and the other options the scripts depend on: --chdir (where every job runs), --time and --signal (the warning
must fit in the time limit), with st_seconds reading each of Slurm's time formats.
Also st_gpu_memory, the GPU memory the job's preflight checks against (GPU_MEMORY, or nvidia-smi's, here a stub)."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
LIB = os.path.join(SOURCE, "jobs", "slurm", "lib.sh")
failures = []


def shape_fields(script_text, fields, *opts):
    """The ST_SHAPE_* variables `fields` that st_sbatch_shape sets for a job script of `script_text` and the sbatch
    options `opts`, or ("exit", code, stderr) when it fails."""
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch", delete=False) as f:
        f.write(script_text)
    try:
        # set -euo pipefail as submit.sh runs it: the function must not trip it.
        printed = "|".join(f"${{ST_SHAPE_{name}}}" for name in fields)
        p = subprocess.run(["bash", "-c", f'set -euo pipefail; source "$0"; st_sbatch_shape "$@"; printf "%s\\n" "{printed}"',
                            LIB, f.name, *opts], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if p.returncode != 0:
        return ("exit", p.returncode, p.stderr)
    return tuple(p.stdout.rstrip("\n").split("|", len(fields) - 1))


def shape(script_text, *opts):
    return shape_fields(script_text, ("NODES", "PER_NODE", "WHY"), *opts)


def expect(name, got, nodes, per_node, why_part=""):
    ok = got[0] == nodes and got[1] == per_node and why_part in got[2]
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {got}")
    if not ok:
        failures.append(name)


MULTI = """#!/bin/bash
# A comment, then the directives; a comment after an option is not part of it.
#SBATCH --job-name=shardtrain
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=8   # one per GPU
#SBATCH --gpus-per-node=8

CONFIG=${CONFIG:-}
#SBATCH --nodes=99
"""
expect("the script's lines (and none after its first command)", shape(MULTI), "4", "8")
expect("options override the script: --nodes=2", shape(MULTI, "--nodes=2"), "2", "8")
expect("--nodes N and --ntasks-per-node G as two words", shape(MULTI, "--nodes", "3", "--ntasks-per-node", "2"), "3", "2")
expect("-N N", shape(MULTI, "-N", "5", "--time=10"), "5", "8")
expect("-NN", shape(MULTI, "-N6"), "6", "8")
expect("--ntasks-per-node=G", shape(MULTI, "--ntasks-per-node=4", "--job-name=x"), "4", "4")
expect("the last of several wins", shape(MULTI, "--nodes=2", "--nodes=7"), "7", "8")
expect("a node range is left to the job", shape(MULTI, "--nodes=2-4"), "", "", "is a range")
expect("no --ntasks-per-node", shape("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks=8\nsrun true\n"), "", "",
       "no --ntasks-per-node")
expect("no --nodes means one node", shape("#!/bin/bash\n#SBATCH --ntasks-per-node=4\n"), "1", "4")
expect("a count that is not a number", shape(MULTI, "--ntasks-per-node=eight"), "", "", "not a positive task count")
expect("nodes zero", shape(MULTI, "--nodes=0"), "", "", "not a positive node count")
expect("the repository's multi-node script", shape(open(os.path.join(SOURCE, "jobs/slurm/train-multi-node.sbatch")).read()), "4", "8")
expect("the repository's single-node script", shape(open(os.path.join(SOURCE, "jobs/slurm/train-single-node.sbatch")).read()), "1", "8")


# --chdir, --time and --signal, as given (the script's lines, then the options).
def options(script_text, *opts):
    return shape_fields(script_text, ("CHDIR", "TIME", "SIGNAL"), *opts)


SCRIPT = open(os.path.join(SOURCE, "jobs/slurm/train-single-node.sbatch")).read()
for name, opts, want in (("the script's own", (), ("", "24:00:00", "B:USR1@300")),
                         ("--chdir=D --time=T", ("--chdir=/x", "--time=10"), ("/x", "10", "B:USR1@300")),
                         ("-D D -t T --signal S", ("-D", "rel/dir", "-t", "1-00", "--signal", "USR1@90"), ("rel/dir", "1-00", "USR1@90")),
                         ("-DD -tT", ("-Dd", "-t5:00"), ("d", "5:00", "B:USR1@300")),
                         ("--time-min is not --time", ("--time-min=5",), ("", "24:00:00", "B:USR1@300"))):
    got = options(SCRIPT, *opts)
    ok = got == want
    print(f"{'ok  ' if ok else 'FAIL'} options, {name}: {got}")
    if not ok:
        failures.append(name)

# st_seconds: each form Slurm takes; nothing for no limit or a form it does not know.
for t, want in (("5", "300"), ("5:30", "330"), ("01:05:00", "3900"), ("00:05:00", "300"), ("2-0", "172800"), ("1-02", "93600"),
                ("1-02:03", "93780"), ("1-02:03:04", "93784"), ("08", "480"), ("UNLIMITED", ""), ("INFINITE", ""), ("", ""), ("1:2:3:4", "")):
    p = subprocess.run(["bash", "-c", 'set -euo pipefail; source "$0"; st_seconds "$1"', LIB, t], capture_output=True, text=True)
    ok = p.returncode == 0 and p.stdout.strip() == want
    print(f"{'ok  ' if ok else 'FAIL'} st_seconds {t!r}: {p.stdout.strip()!r} {p.stderr.strip()}")
    if not ok:
        failures.append(f"st_seconds {t}")

# st_gpu_memory: GPU_MEMORY as given, or (auto, the default) the smallest GPU nvidia-smi lists, in GiB.
def gpu_memory(smi_output, value=None):
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, PATH=f"{d}:/usr/bin:/bin")
        if smi_output is not None:
            with open(os.path.join(d, "nvidia-smi"), "w") as f:
                f.write(f"#!/bin/sh\nprintf '{smi_output}'\n")
            os.chmod(os.path.join(d, "nvidia-smi"), 0o755)
        if value is not None:
            env["GPU_MEMORY"] = value
        else:
            env.pop("GPU_MEMORY", None)
        p = subprocess.run(["bash", "-c", 'set -euo pipefail; source "$0"; st_gpu_memory; printf "%s" "$ST_GPU_MEMORY"', LIB],
                           capture_output=True, text=True, env=env)
        return p.stdout if p.returncode == 0 else f"exit {p.returncode}: {p.stderr}"


for name, got, want in (("auto: the smallest of the node's GPUs", gpu_memory("81559\\n40960\\n"), "40.000GiB"),
                        ("auto without nvidia-smi: not checked", gpu_memory(None), ""),
                        ("auto, nvidia-smi says no number", gpu_memory("No devices were found\\n"), ""),
                        ("given", gpu_memory("81559\\n", "80GB"), "80GB"),
                        ("0: not checked", gpu_memory("81559\\n", "0"), "")):
    ok = got == want
    print(f"{'ok  ' if ok else 'FAIL'} st_gpu_memory, {name}: {got!r}")
    if not ok:
        failures.append(name)

if failures:
    print(f"FAILED: {len(failures)} case(s): {', '.join(failures)}")
    sys.exit(1)
print("all cases passed")
