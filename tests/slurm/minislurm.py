#!/usr/bin/env python3
"""A real Slurm on this one machine, for the tests: Debian's munged, slurmctld and one slurmd per
simulated node, all configured in a private directory, on free ports, as root. Two slurmd's on one
host are two Slurm nodes (node1, node2) with their own spool and tmp directories, so a job with
--nodes=2 gets SLURM_JOB_NUM_NODES=2 and one job step per node, exactly as on a cluster.

    with MiniSlurm("/tmp/x", nodes=2, cpus=4, gpus=2) as slurm:
        job = slurm.sbatch(["jobs/slurm/train-multi-node.sbatch"], env)
        info = slurm.wait(job, timeout=300)

Stopping cancels every job, shuts the controller and every slurmd down and kills whatever is left
(daemons, job steps, the munge daemon): it runs on leaving the `with`, at interpreter exit and on
SIGTERM/SIGINT, and start() first kills what a killed earlier run left behind in the same directory.

Also a command line, to try the job scripts by hand:
    tests/slurm/minislurm.py start DIR [--nodes 2] ;  SLURM_CONF=DIR/slurm.conf sbatch ... ;  tests/slurm/minislurm.py stop DIR
"""
import argparse
import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

DAEMONS = ("slurmctld", "slurmd", "munged")
# What a job's mpirun needs on this one machine, for every test that runs one (job environments add it):
# - ranks of two simulated nodes talk over TCP on the loopback (Open MPI would otherwise try shared memory between
#   "nodes", whose segment names collide, or skip the loopback interface);
# - node1 and node2 are not this host's name, so mpirun starts a daemon on each allocated node through srun, even
#   for a one-node job. Open MPI sends that srun's output to /dev/null unless the session stays attached: attached,
#   a failed launch prints srun's own reason into the job's output ("An ORTE daemon has unexpectedly failed" alone
#   says nothing), at the cost of one line per job from srun ("cluster configuration lacks support for cpu binding":
#   TaskPlugin=task/none).
OPEN_MPI_ENV = {
    "OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo",
    "OMPI_MCA_orte_leave_session_attached": "1",
}
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class SlurmError(RuntimeError):
    pass


class MiniSlurm:
    def __init__(self, root, nodes=2, cpus=4, gpus=2, memory_mb=4000):
        self.root = os.path.abspath(root)
        self.nodes = [f"node{i + 1}" for i in range(nodes)]
        self.cpus, self.gpus, self.memory_mb = cpus, gpus, memory_mb
        self.conf = os.path.join(self.root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.started = False

    # ---- lifecycle -------------------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def _path(self, *parts):
        return os.path.join(self.root, *parts)

    def start(self, timeout=60):
        for tool in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol"):
            if not shutil.which(tool):
                raise SlurmError(f"{tool} not found: scripts/setup.sh installs slurmctld, slurmd, slurm-client and munge")
        self.kill_leftovers()
        shutil.rmtree(self.root, ignore_errors=True)
        for d in ("munge", "state", "log", *(f"spool/{n}" for n in self.nodes), *(f"tmp/{n}" for n in self.nodes)):
            os.makedirs(self._path(d), exist_ok=True)
        os.chmod(self.root, 0o755)  # munged wants every directory above its socket searchable
        os.chmod(self._path("munge"), 0o755)
        key = self._path("munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.started = True
        atexit.register(self.stop)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self._run(["munged", "--force", f"--socket={self._path('munge', 'munge.socket')}", f"--key-file={key}",
                   f"--log-file={self._path('log', 'munged.log')}", f"--pid-file={self._path('munge', 'munged.pid')}",
                   f"--seed-file={self._path('munge', 'munged.seed')}"])
        self._write_config()
        self._run(["slurmctld", "-i"])
        for n in self.nodes:
            self._run(["slurmd", "-N", n])
        deadline = time.time() + timeout
        while time.time() < deadline:
            p = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True)
            states = dict(line.split() for line in p.stdout.splitlines() if line.strip())
            if p.returncode == 0 and len(states) == len(self.nodes) and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.5)
        raise SlurmError(f"the nodes did not become idle in {timeout} s: {self.logs_tail()}")

    def _write_config(self):
        host = socket.gethostname()
        ctld_port, *node_ports = free_ports(1 + len(self.nodes))
        lines = [
            "ClusterName=shardtrain-test",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={self._path('munge', 'munge.socket')}",
            f"StateSaveLocation={self._path('state')}",
            f"SlurmdSpoolDir={self._path('spool', '%n')}",
            f"TmpFS={self._path('tmp', '%n')}",  # per node: PMIx puts its client directories here
            f"SlurmctldPidFile={self._path('slurmctld.pid')}",
            f"SlurmdPidFile={self._path('slurmd-%n.pid')}",
            f"SlurmctldLogFile={self._path('log', 'slurmctld.log')}",
            f"SlurmdLogFile={self._path('log', 'slurmd-%n.log')}",
            # No cgroups in a container: track processes through /proc, bind nothing.
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",  # the simulated nodes declare more CPUs than the machine has
            "GresTypes=gpu",
            "MpiDefault=none", "ReturnToService=2",
            "MinJobAge=3600",  # keep finished jobs visible to scontrol (there is no accounting database)
            # KillWait: from SIGTERM to SIGKILL, also what srun waits for the rest of a step after a task died with
            # --kill-on-bad-exit (the ranks blocked in a collective with the dead one never exit on SIGTERM): 15 s
            # twice per such job was most of its time. 5 s still covers what the job scripts do after a requeue's
            # SIGTERM (they ignore it for a scontrol update and a line of restarts.log, well under a second).
            "KillWait=5", "JobRequeue=1",
        ]
        for n, port in zip(self.nodes, node_ports):
            lines.append(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={self.cpus} Boards=1 "
                         f"SocketsPerBoard=1 CoresPerSocket={self.cpus} ThreadsPerCore=1 RealMemory={self.memory_mb} "
                         f"Gres=gpu:{self.gpus} State=UNKNOWN")
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        # The machine has no GPU: Slurm's gpu GRES needs device files, so stand-ins (character devices
        # every Linux has) give each node its count; Slurm allocates them and sets CUDA_VISIBLE_DEVICES,
        # and shardtrain, finding no CUDA device, runs on the CPU backend, as on any machine without one.
        stand_ins = ["/dev/null", "/dev/zero", "/dev/full", "/dev/urandom"]
        if self.gpus > len(stand_ins):
            raise SlurmError(f"at most {len(stand_ins)} simulated GPUs per node")
        with open(self._path("gres.conf"), "w") as f:
            f.writelines(f"Name=gpu File={dev}\n" for dev in stand_ins[:self.gpus])

    def _run(self, cmd):
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True)
        if p.returncode != 0:
            raise SlurmError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()} {self.logs_tail()}")

    def _on_signal(self, sig, frame):
        self.stop()
        sys.exit(128 + sig)

    def _pids(self):
        pids = []
        for name in ["slurmctld.pid", *(f"slurmd-{n}.pid" for n in self.nodes), "munge/munged.pid"]:
            try:
                with open(self._path(name)) as f:
                    pids.append(int(f.read().strip()))
            except (OSError, ValueError):
                pass
        return pids

    @staticmethod
    def _processes():
        """(pid, argv bytes, environment bytes) of every process this user may read."""
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read()
            except OSError:
                continue
            yield int(pid), cmd, env

    def _job_processes(self):
        """This Slurm's daemons, step daemons and everything they started: they all carry SLURM_CONF=<our conf>."""
        conf = f"SLURM_CONF={self.conf}".encode()
        return [pid for pid, _, env in self._processes() if conf in env and pid != os.getpid()]

    def kill_leftovers(self):
        if not os.path.isdir(self.root):
            return
        for pid in self._pids() + self._job_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def stop(self):
        if not self.started:
            return
        self.started = False
        for cmd in (["scancel", "--full", "--quiet", "--state=RUNNING"], ["scancel", "--quiet", "--state=PENDING"],
                    ["scontrol", "shutdown"]):
            try:
                subprocess.run(cmd, env=self.env, capture_output=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass  # whatever is left is killed below
        deadline = time.time() + 10
        while time.time() < deadline and any(os.path.exists(f"/proc/{p}") for p in self._pids()):
            time.sleep(0.2)
        self.kill_leftovers()

    # ---- jobs ------------------------------------------------------------------------------------
    def sbatch(self, argv, env=None, cwd=None):
        """Submits; returns the job id. Raises with sbatch's message when the submission is refused."""
        p = subprocess.run(["sbatch", "--parsable", *argv], env=dict(env or os.environ, SLURM_CONF=self.conf), cwd=cwd,
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise SlurmError(f"sbatch {' '.join(argv)}: {p.stderr.strip()}")
        return int(p.stdout.strip().split(";")[0])

    def job(self, job_id):
        """scontrol show job as a dict (JobState, ExitCode, Restarts, StdOut, ...)."""
        p = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], env=self.env, capture_output=True, text=True)
        if p.returncode != 0:
            raise SlurmError(f"scontrol show job {job_id}: {p.stderr.strip()}")
        return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", p.stdout))

    def events(self, job_id):
        """What slurmctld and the slurmds logged about a job (its allocations, requeues, launch failures), in order."""
        mark = re.compile(rf"(JobId={job_id}|job {job_id}|\[{job_id}\.[a-z0-9]+\])(\D|$)")
        lines = []
        for name in sorted(os.listdir(self._path("log"))) if os.path.isdir(self._path("log")) else []:
            if name.startswith("slurm"):
                with open(self._path("log", name), errors="replace") as f:
                    lines += [f"{l.split(']', 1)[0]}] {name[:-4]}:{l.split(']', 1)[-1].rstrip()}" for l in f if mark.search(l)]
        return "\n".join(sorted(lines))

    def wait(self, job_id, timeout, until=None):
        """Polls until the job reaches a final state (or `until(info)` holds); returns the job's fields."""
        deadline = time.time() + timeout
        held_since = None  # when this wait first saw the job held for its requeue delay
        while True:
            info = self.job(job_id)
            if until and until(info):
                return info
            if not until and info.get("JobState") in FINAL_STATES:
                self._wait_processes_gone(job_id)
                return info
            if time.time() > deadline:
                raise SlurmError(f"job {job_id} still {info.get('JobState')} after {timeout} s")
            held = info.get("JobState") == "PENDING" and info.get("Reason") == "BeginTime"
            if not held:
                held_since = None
            elif held_since is None:
                held_since = time.time()
            if held and time.time() - held_since >= 1.1 and not self._steps_alive(job_id):
                # A requeued job waits two minutes before it may start again; a test starts it once the previous
                # run's step daemons have exited (as they have long done on a cluster after two minutes), and not in
                # the second of the requeue: slurmd counts a credential made in the second its job's credentials were
                # revoked as revoked too ("Job credential revoked"), and the batch job would fail to start. Held for
                # more than a second since this wait first saw it held, the revocation (before that) was in an
                # earlier second than now.
                subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=self.env, capture_output=True)
            time.sleep(0.5)

    def _processes_of(self, job_id):
        """The processes of a job: its step daemons and everything that carries its SLURM_JOB_ID."""
        prefix, mark = f"slurmstepd: [{job_id}.".encode(), f"SLURM_JOB_ID={job_id}\0".encode()
        return [pid for pid, cmd, env in self._processes()
                if (cmd.startswith(prefix) or env.startswith(mark) or b"\0" + mark in env) and pid != os.getpid()]

    def _wait_processes_gone(self, job_id, timeout=30):
        """Waits until a finished job's processes have exited; SIGKILLs what is left after `timeout`, as a cluster's
        cgroup would. A job reads as final (FAILED, COMPLETED) while its ranks are still being killed: a rank of one
        job that outlived it kept reconnecting to its dead peers' loopback ports, which the next job's ranks could
        have taken, and Open MPI's TCP transport took the stranger's connection (a warning, once a crash)."""
        deadline, start, seen = time.time() + timeout, time.time(), 0
        while time.time() < deadline:
            left = self._processes_of(job_id)
            if not left:
                break
            seen = max(seen, len(left))
            time.sleep(0.2)
        else:
            for pid in self._processes_of(job_id):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if seen:
            print(f"minislurm: job {job_id}: {seen} process(es) outlived its end by {time.time() - start:.1f} s",
                  file=sys.stderr)

    def _steps_alive(self, job_id):
        prefix = f"slurmstepd: [{job_id}.".encode()
        return any(cmd.startswith(prefix) for _, cmd, _ in self._processes())

    def signal_batch(self, job_id, sig="USR1"):
        """What --signal=B:USR1@N does before a time limit: the signal to the batch shell only."""
        subprocess.run(["scancel", "--batch", f"--signal={sig}", str(job_id)], env=self.env, check=True)

    def logs_tail(self, lines=15):
        out = []
        for name in sorted(os.listdir(self._path("log"))) if os.path.isdir(self._path("log")) else []:
            with open(self._path("log", name), errors="replace") as f:
                tail = f.read().splitlines()[-lines:]
            out.append(f"--- {name}\n" + "\n".join(tail))
        return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description="a single-machine Slurm for trying the job scripts")
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("dir")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=2)
    a = parser.parse_args()
    slurm = MiniSlurm(a.dir, a.nodes, a.cpus, a.gpus)
    if a.action == "start":
        slurm.start()
        atexit.unregister(slurm.stop)
        print(f"Slurm is up: export SLURM_CONF={slurm.conf}; stop it with {sys.argv[0]} stop {a.dir}")
    else:
        slurm.started = os.path.exists(slurm.conf)
        slurm.stop()
        print("stopped")


if __name__ == "__main__":
    main()
