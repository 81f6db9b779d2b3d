"""A real two-node SLURM cluster on this machine, for the cluster test tier.

Debian's munge, slurmctld and slurmd (installed with apt-get when missing) are started by hand, as
root, without systemd: one munged with its own key and socket, one slurmctld, and one `slurmd -N`
per node on its own port of 127.0.0.1, all state under a private directory. The configuration is
also placed at /etc/slurm/slurm.conf (only if no file is there), because Snakemake's SLURM job step
drops SLURM_CONF before its own srun. `stop()` kills exactly the daemons it started (by PID) and
removes what it created, whatever happened in between.

    python tests/cluster/localslurm.py up DIR     # start, print the env to use, leave running
    python tests/cluster/localslurm.py down DIR   # stop what `up` started
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client")
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
OWNER_MARK = "# written by videogrpo's test harness"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo", "scancel")


class ClusterUnavailable(Exception):
    """This machine cannot run the cluster tier (not root, or the packages cannot be installed)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ensure_packages() -> None:
    missing = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if not missing:
        return
    if os.geteuid() != 0:
        raise ClusterUnavailable(f"SLURM binaries {missing} are missing and installing them needs root")
    if shutil.which("apt-get") is None:
        raise ClusterUnavailable(f"SLURM binaries {missing} are missing and there is no apt-get to install them")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for args in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        out = subprocess.run(args, env=env, capture_output=True, text=True)
        if out.returncode:
            raise ClusterUnavailable(f"{' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


SLURM_CONF = """\
ClusterName=videogrpo-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=256
SlurmdParameters=config_overrides
MailProg=/bin/true
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=3600
KillWait=5
InactiveLimit=0
SlurmdTimeout=60
{nodes}
PartitionName={partition} Nodes={node_list} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""


class LocalSlurm:
    def __init__(self, root: Path, nodes: int = 2, cpus_per_node: int = 2, partition: str = "debug"):
        self.root = Path(root)
        self.node_names = [f"node{i + 1}" for i in range(nodes)]
        self.cpus = cpus_per_node
        self.partition = partition
        self.pids: list[int] = []

    @property
    def conf(self) -> Path:
        return self.root / "etc/slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, srun, snakemake's plugin) needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def _spawn(self, args: list[str], env: dict[str, str] | None = None) -> int:
        log = open(self.root / "log" / f"{Path(args[0]).name}-{len(self.pids)}.out", "wb")
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})), start_new_session=True
        )
        self.pids.append(proc.pid)
        (self.root / "pids.json").write_text(json.dumps(self.pids))
        return proc.pid

    def start(self, timeout: float = 60) -> None:
        if os.geteuid() != 0:
            raise ClusterUnavailable("the local cluster runs its daemons as root; this test tier needs root")
        ensure_packages()
        for sub in ("etc", "state", "spool", "run", "log", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        munge_key = self.root / "munge/munge.key"
        munge_key.write_bytes(os.urandom(1024))
        munge_key.chmod(0o400)
        os.chmod(self.root / "munge", 0o700)
        socket_path = self.root / "munge/munge.socket"
        self._spawn(
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={munge_key}",
                f"--socket={socket_path}",
                f"--pid-file={self.root}/munge/munged.pid",
                f"--log-file={self.root}/log/munged.log",
                f"--seed-file={self.root}/munge/munged.seed",
            ]
        )
        self._wait(lambda: socket_path.exists(), timeout, "munged socket")
        node_ports = [free_port() for _ in self.node_names]
        nodes = "\n".join(
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs={self.cpus} "
            f"RealMemory=4000 State=UNKNOWN"
            for name, port in zip(self.node_names, node_ports)
        )
        text = SLURM_CONF.format(
            ctld_port=free_port(),
            munge_socket=socket_path,
            root=self.root,
            nodes=nodes,
            partition=self.partition,
            node_list=",".join(self.node_names),
        )
        self.conf.write_text(f"{OWNER_MARK} ({self.root})\n{text}")
        if SYSTEM_CONF.exists() and not SYSTEM_CONF.read_text().startswith(OWNER_MARK):
            raise ClusterUnavailable(
                f"{SYSTEM_CONF} exists and is not the harness's; refusing to replace a real cluster's configuration"
            )
        SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.conf, SYSTEM_CONF)

        env = {"SLURM_CONF": str(self.conf)}
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], env)
        for name in self.node_names:
            self._spawn(["slurmd", "-D", "-N", name, "-f", str(self.conf)], env)
        self._wait(self._all_idle, timeout, "both nodes idle")

    def _all_idle(self) -> bool:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], env=dict(os.environ, **self.env), capture_output=True, text=True
        )
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return all(states.get(n, "").startswith("idle") for n in self.node_names)

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            for pid in self.pids:
                if not _alive(pid):
                    raise RuntimeError(f"a daemon of the local cluster died while waiting for {what}:\n{self.logs()}")
            time.sleep(0.3)
        raise TimeoutError(f"local cluster: {what} not reached in {timeout} s:\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Kill the daemons this object started (and their sessions), then remove the directory."""
        pids_file = self.root / "pids.json"
        pids = self.pids or (json.loads(pids_file.read_text()) if pids_file.exists() else [])
        for pid in reversed(pids):
            _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in pids:
            _kill(pid, signal.SIGKILL)
        self.pids = []
        ours = f"{OWNER_MARK} ({self.root})"
        if SYSTEM_CONF.exists() and SYSTEM_CONF.read_text().startswith(ours):
            SYSTEM_CONF.unlink()
        shutil.rmtree(self.root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the daemon and anything it left in its session
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    action, directory = sys.argv[1], Path(sys.argv[2])
    cluster = LocalSlurm(directory)
    if action == "up":
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}")
    elif action == "down":
        cluster.stop()
