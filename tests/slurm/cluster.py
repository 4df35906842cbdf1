"""A real one-node SLURM cluster on localhost, for the profile's integration test.

Installs Debian's slurm-wlm + munge when missing, writes slurm.conf from `slurmd -C` and `hostname -s`,
starts munged, slurmctld and slurmd in the background recording their PIDs, and stops exactly those PIDs.

    python tests/slurm/cluster.py up DIR      # install if needed, start, print DIR (state, logs, pids.json)
    python tests/slurm/cluster.py down DIR    # cancel leftover jobs, stop the daemons listed in DIR/pids.json

Must run as root (the daemons and job steps run as root; no accounting database, no cgroups).
The config has to sit at the compiled-in /etc/slurm/slurm.conf: the executor plugin strips SLURM_CONF from
the environment of the srun inside each job. An existing slurm.conf that this script did not write is never
touched (start() refuses), and the one it wrote is removed again by stop().
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SLURM_CONF = Path("/etc/slurm/slurm.conf")
GRES_CONF = Path("/etc/slurm/gres.conf")
MARKER = "# written by lantern-pipeline tests/slurm/cluster.py"
PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
BINARIES = ["slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "munged", "munge"]
PARTITION = "lantern-test"
# Fake GPUs (empty files standing in for /dev/nvidia*; slurmd drops GPUs without a File and logs a harmless
# "not a valid character or block device" for these): SLURM schedules `--gpus=N` requests against them as on
# a GPU node, so the profile's real GPU requests go through sbatch unchanged. Nothing in the jobs can use them.
FAKE_GPUS = 4


@dataclass
class Cluster:
    root: Path                      # state folder: spool, controller state, logs, munge key+socket, pids.json
    pids: dict[str, int] = field(default_factory=dict)
    wrote_conf: bool = False

    def log(self, name: str) -> Path:
        return self.root / "log" / f"{name}.log"


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def install() -> None:
    """apt-get install the Debian packages when any binary is missing (seconds on a fresh Debian)."""
    if not missing_binaries():
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"SLURM is not installed and installing needs root: missing {missing_binaries()}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Keep the packages' post-install scripts from starting system-wide munged/slurmctld/slurmd: the test
    # starts its own, and stops only those.
    policy = Path("/usr/sbin/policy-rc.d")
    ours = not policy.exists()
    if ours:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES], check=True,
                       env=env)
    finally:
        if ours:
            policy.unlink()
    if missing_binaries():
        raise RuntimeError(f"apt-get install {' '.join(PACKAGES)} left these missing: {missing_binaries()}")


def node_line(host: str) -> str:
    # First line of `slurmd -C` is e.g. "NodeName=vm CPUs=2 Boards=1 ... RealMemory=24105"; the
    # second ("UpTime=...") is not a node parameter.
    hw = subprocess.run(["slurmd", "-C"], check=True, capture_output=True, text=True).stdout.splitlines()[0]
    params = [p for p in hw.split() if not p.startswith("NodeName=")]
    return f"NodeName={host} NodeAddr=127.0.0.1 {' '.join(params)} Gres=gpu:{FAKE_GPUS} State=UNKNOWN"


def write_config(c: Cluster, host: str) -> str:
    for sub in ("log", "ctld", "spool", "munge", "dev"):
        (c.root / sub).mkdir(parents=True, exist_ok=True)
    for i in range(FAKE_GPUS):
        (c.root / "dev" / f"gpu{i}").touch()
    conf = f"""{MARKER}
# state folder: {c.root}
ClusterName=lantern-test
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={c.root}/munge/munge.socket
StateSaveLocation={c.root}/ctld
SlurmdSpoolDir={c.root}/spool
SlurmctldPidFile={c.root}/ctld/slurmctld.pid
SlurmdPidFile={c.root}/spool/slurmd.pid
SlurmctldLogFile={c.log('slurmctld')}
SlurmdLogFile={c.log('slurmd')}
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups and no accounting database on a test machine.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
GresTypes=gpu
ReturnToService=2
# Finished jobs stay visible to squeue/scontrol for the cluster's whole life (a day; it lives for one test
# session): the plugin's squeue status check and the test's scontrol checks of every job need them, and on a busy
# machine the smoke DAG's first jobs finish more than 10 min before the run ends.
MinJobAge=86400
{node_line(host)}
# Two jobs per core: a test job spends much of its life starting Python and waiting for the status poll, so
# sharing cores hides that latency (a real cluster gives each job its own cores).
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:2
"""
    SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
    SLURM_CONF.write_text(conf)
    GRES_CONF.write_text(f"{MARKER}\nNodeName={host} Name=gpu File={c.root}/dev/gpu[0-{FAKE_GPUS - 1}]\n")
    c.wrote_conf = True
    return conf


# Daemons start in seconds when idle. A daemon that fails exits, and the wait stops at once; this bound only
# catches one that hangs without ever coming up, and no busy machine comes near it.
DAEMON_START_S = 3600


def _wait(what: str, ok, timeout: float, logs: list[Path], pid: int | None = None) -> None:
    deadline = time.monotonic() + timeout
    problem = f"not ready after {timeout:.0f} s"
    while time.monotonic() < deadline:
        if ok():
            return
        if pid is not None and not _alive(pid):
            problem = "exited before it was ready"
            break
        time.sleep(0.5)
    tails = "\n".join(f"--- {p}\n" + "\n".join(p.read_text().splitlines()[-20:]) for p in logs if p.exists())
    raise RuntimeError(f"{what} {problem}\n{tails}")


def _quiet_ok(cmd: list[str]) -> bool:
    return subprocess.run(cmd, capture_output=True, text=True).returncode == 0


def _node_state() -> str:
    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def _spawn(c: Cluster, name: str, cmd: list[str]) -> None:
    with open(c.log(f"{name}.stdout"), "ab") as out:
        # Own session: a Ctrl-C at the test's terminal reaches the test (which then stops them), not the daemons.
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    c.pids[name] = p.pid
    (c.root / "pids.json").write_text(json.dumps(c.pids))


def conf_is_foreign() -> bool:
    return SLURM_CONF.exists() and MARKER not in SLURM_CONF.read_text()


def start(root: Path) -> Cluster:
    """Install if needed, write the config, start munged, slurmctld, slurmd; wait for an idle node.

    On any failure the daemons started so far are stopped before the error propagates.
    """
    if os.geteuid() != 0:
        raise RuntimeError("the local SLURM test cluster must run as root")
    install()
    if conf_is_foreign():
        raise RuntimeError(f"{SLURM_CONF} exists and was not written by this script; not touching it")
    if SLURM_CONF.exists() and _quiet_ok(["scontrol", "ping"]):
        state = re.search(r"^# state folder: (.+)$", SLURM_CONF.read_text(), re.M)
        raise RuntimeError("a test cluster left by an earlier run still answers; stop it with "
                           f"`python tests/slurm/cluster.py down {state[1] if state else 'DIR'}`")
    root = Path(root).resolve()
    if len(str(root / "munge" / "munge.socket")) > 100:
        raise RuntimeError(f"state folder path too long for a unix socket address: {root}")
    root.mkdir(parents=True, exist_ok=True)
    c = Cluster(root=root)
    try:
        host = socket.gethostname().split(".")[0]
        write_config(c, host)
        munge_dir = root / "munge"
        # munged checks permissions: its key private to the owner, its socket folder readable by all.
        for d in (root, munge_dir):
            d.chmod(0o755)
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        sock = munge_dir / "munge.socket"
        _spawn(c, "munged", ["munged", "-F", "--force", f"--socket={sock}", f"--key-file={key}",
                             f"--pid-file={munge_dir}/munged.pid", f"--seed-file={munge_dir}/munged.seed",
                             f"--log-file={c.log('munged')}"])
        _wait("munged", lambda: _quiet_ok(["sh", "-c", f"munge -n -S {sock} | unmunge -S {sock}"]), DAEMON_START_S,
              [c.log("munged"), c.log("munged.stdout")], c.pids["munged"])
        _spawn(c, "slurmctld", ["slurmctld", "-D", "-i"])
        _wait("slurmctld", lambda: _quiet_ok(["scontrol", "ping"]), DAEMON_START_S,
              [c.log("slurmctld"), c.log("slurmctld.stdout")], c.pids["slurmctld"])
        _spawn(c, "slurmd", ["slurmd", "-D"])
        _wait("slurmd (node idle)", lambda: _node_state() == "idle", DAEMON_START_S,
              [c.log("slurmd"), c.log("slurmd.stdout"), c.log("slurmctld")], c.pids["slurmd"])
    except BaseException:
        stop(c)
        raise
    return c


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        # A reaped child of ours that the OS has not yet reused reads as a zombie.
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _is_ours(pid: int, name: str) -> bool:
    # Guard against PID reuse between start and stop.
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(name.encode())
    except FileNotFoundError:
        return False


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)  # a child of this process: collect it so it leaves no zombie
    except ChildProcessError:
        pass


def _stop_pid(pid: int, name: str, timeout: float = 15) -> None:
    if not (_alive(pid) and _is_ours(pid, name)):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not _alive(pid):
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    _reap(pid)


def stop(c: Cluster) -> None:
    """Cancel this cluster's leftover jobs, then stop slurmd, slurmctld, munged by their recorded PIDs."""
    if "slurmctld" in c.pids and _alive(c.pids["slurmctld"]):
        # Running jobs' slurmstepd processes outlive slurmd; cancel them while the controller still listens.
        subprocess.run(["scancel", "--full", f"--partition={PARTITION}"], capture_output=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            r = subprocess.run(["squeue", "-h", "-t", "PD,R,CG,S", "-o", "%i"], capture_output=True, text=True)
            if r.returncode != 0 or not r.stdout.strip():
                break
            time.sleep(0.5)
    for name in ("slurmd", "slurmctld", "munged"):
        if name in c.pids:
            _stop_pid(c.pids[name], name)
    if c.wrote_conf:
        for p in (SLURM_CONF, GRES_CONF):
            if p.exists() and MARKER in p.read_text():
                p.unlink()


def load(root: Path) -> Cluster:
    return Cluster(root=root, pids=json.loads((root / "pids.json").read_text()), wrote_conf=True)


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[0] not in ("up", "down"):
        sys.exit("usage: cluster.py up|down DIR")
    if argv[0] == "up":
        c = start(Path(argv[1]))
        print(f"cluster up: pids {c.pids}, state in {c.root}")
    else:
        stop(load(Path(argv[1])))
        print("cluster down")


if __name__ == "__main__":
    main(sys.argv[1:])
