"""The dev cluster's configuration files, rendered from its geometry (pure), and writing them
with the fake GPU devices they point at. Every line is the configuration measured to work on
Slurm 22.05.8 (``docs/slurm-22.05-notes.md`` §2)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from hpcsched.slurm.devcluster.base import (
    CLUSTER_NAME,
    DB_NAME,
    DB_PASSWORD,
    DB_USER,
    DEFAULT_PORTS,
    GPU_DEVICE_MAJOR,
    MAX_NODES,
    NODE_REAL_MEMORY_MB,
    PARTITION,
    DevClusterError,
    Layout,
    Ports,
    node_addr,
    write_file,
)
from hpcsched.slurm.devcluster.plugins import plugin_lines, write_plugin_hooks

logger = logging.getLogger("hpcsched.slurm.devcluster")  # the package's logger (see base)


def _span(lo: int, hi: int) -> str:
    """Slurm hostlist bracket for a numeric range: ``1,4 -> [1-4]``, ``3,3 -> 3``."""
    return str(lo) if lo == hi else f"[{lo}-{hi}]"


def node_names(nodes: int) -> list[str]:
    """Names of the emulated nodes: ``n1 .. nN``."""
    return [f"n{k}" for k in range(1, nodes + 1)]


def check_geometry(nodes: int, gpus: int, cpus: int) -> None:
    """:raises DevClusterError: nodes outside 1..1024, GPUs per node outside 0..64 or CPUs outside 1..1024."""
    if not 1 <= nodes <= MAX_NODES:
        raise DevClusterError(f"--nodes must be between 1 and {MAX_NODES}, got {nodes}")
    if not 0 <= gpus <= 64:
        raise DevClusterError(f"--gpus must be between 0 and 64 per node, got {gpus}")
    if not 1 <= cpus <= 1024:
        raise DevClusterError(f"--cpus must be between 1 and 1024 per node, got {cpus}")


def render_configs(state_dir: str | os.PathLike[str] | None, nodes: int = 4, gpus: int = 4,
                   cpus: int = 8, ports: Ports | None = None) -> dict[str, str]:
    """Render the cluster's configuration files; pure (touches nothing).

    :param state_dir: the state directory every path in the files points into.
    :param nodes: emulated nodes ``n1..nN`` (1..1024; past 254, ``base.node_addr`` and ``Ports.node``).
    :param gpus: fake GPUs per node (0..64); 0 configures no GRES on the nodes.
    :param cpus: CPUs per node as Slurm sees them (``SlurmdParameters=config_overrides`` lets
        2 real cores pose as any number).
    :returns: ``{"slurm.conf": text, "gres.conf": ..., "cgroup.conf": ..., "slurmdbd.conf": ...}``,
        exactly the configuration measured to work in the notes (§2), with ports 16817 (slurmctld),
        16818 (SlurmdPort, overridden per node), 16819 (slurmdbd), 16820 (MariaDB), 17001+ (nodes).
    :param ports: other ports (and ``FirstJobId``): a further host cluster beside the default one
        (:func:`~hpcsched.slurm.devcluster.base.instance_ports`), or, with ``ports.accounting``
        False, no slurmdbd (``accounting_storage/none``), as the chroot clusters of other Slurm
        versions run (:mod:`~hpcsched.slurm.devcluster.chroot`). Default :data:`DEFAULT_PORTS`.
    :raises DevClusterError: for a geometry out of range or a state path slurm.conf cannot hold.
    """
    check_geometry(nodes, gpus, cpus)
    L = Layout(state_dir)
    ports = ports or DEFAULT_PORTS
    return {"slurm.conf": _slurm_conf(L, nodes, gpus, cpus, ports), "gres.conf": _gres_conf(L, nodes, gpus),
            "cgroup.conf": _cgroup_conf(ports), "slurmdbd.conf": _slurmdbd_conf(L, ports)}


def _accounting(ports: Ports) -> str:
    if not ports.accounting:
        return "AccountingStorageType=accounting_storage/none\n"  # gres/gpu TRES would need slurmdbd
    return (f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
            f"AccountingStoragePort={ports.slurmdbd}\nAccountingStorageTRES=gres/gpu\n"
            # QOS preemption, for extension jobs in the lend QOS (daemons.configure_lend_qos)
            "PreemptType=preempt/qos\nPreemptMode=CANCEL\n")


def _slurm_conf(L: Layout, nodes: int, gpus: int, cpus: int, ports: Ports = DEFAULT_PORTS) -> str:
    """``slurm.conf``: one controller on 127.0.0.1, accounting through slurmdbd, cons_tres with a
    ``gpu`` GRES, and one line per node ``nK`` at ``base.node_addr(K)``, port ``Ports.node(K)``
    (``127.0.0.K:17000+K`` up to n254)."""
    text = f"""\
# Written by `hpcsched devcluster up` ({nodes} nodes x {gpus} GPUs x {cpus} CPUs); do not edit:
# it is rewritten on every start. Facts behind every line: slurm-22.05-notes.md, section 2.
ClusterName={CLUSTER_NAME}
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ports.slurmctld}
SlurmdPort={ports.slurmd}
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={L.state}
SlurmdSpoolDir={L.spool}/%n
SlurmctldPidFile={L.run}/slurmctld.pid
SlurmdPidFile={L.run}/slurmd-%n.pid
SlurmctldLogFile={L.log}/slurmctld.log
SlurmdLogFile={L.log}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
{_accounting(ports)}JobCompType=jobcomp/filetxt
JobCompLoc={L.log}/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SchedulerType=sched/backfill
SchedulerParameters=permit_job_expansion
JobRequeue=1
ReturnToService=2
MpiDefault=none
SlurmdParameters=config_overrides
TreeWidth=65533
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
"""
    if ports.first_job_id != 1:
        text += f"FirstJobId={ports.first_job_id}\n"
    if ports.slurm_plugins:
        text += plugin_lines(L)
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    for k in range(1, nodes + 1):
        text += (f"NodeName=n{k} NodeHostname=n{k} NodeAddr={node_addr(k)} Port={ports.node(k)} "
                 f"CPUs={cpus} RealMemory={NODE_REAL_MEMORY_MB}{gres} State=UNKNOWN\n")
    text += (f"PartitionName={PARTITION} Nodes=n{_span(1, nodes)} Default=YES MaxTime=INFINITE "
             "State=UP OverSubscribe=NO\n")
    return text


def _gres_conf(L: Layout, nodes: int, gpus: int) -> str:
    """``gres.conf``: the fake GPUs' device files (22.05 drops a ``gpu`` GRES without ``File=``)."""
    text = "# Written by `hpcsched devcluster up`. Fake GPUs: character devices, major 195.\nAutoDetect=off\n"
    if gpus:
        text += f"NodeName=n{_span(1, nodes)} Name=gpu File={L.dev}/gpu{_span(0, gpus - 1)}\n"
    return text


_CGROUP_CONF = "# Not read with proctrack/linuxproc + task/none; written as in the notes.\nCgroupPlugin=autodetect\n"


def _cgroup_conf(ports: Ports) -> str:
    """22.05 does not read it (proctrack/linuxproc + task/none); 24.11's slurmd initialises the
    cgroup plugin anyway and fails without a cgroup filesystem, hence ``disabled`` there."""
    if ports.cgroup_plugin == "autodetect":
        return _CGROUP_CONF
    return f"# Written by `hpcsched devcluster up`.\nCgroupPlugin={ports.cgroup_plugin}\n"


def _slurmdbd_conf(L: Layout, ports: Ports) -> str:
    """``slurmdbd.conf`` (written mode 600: it holds the database password)."""
    return f"""\
# Written by `hpcsched devcluster up`; mode 600 (it holds the database password).
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={ports.slurmdbd}
SlurmUser=root
DebugLevel=info
LogFile={L.log}/slurmdbd.log
PidFile={L.run}/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={ports.mariadb}
StorageUser={DB_USER}
StoragePass={DB_PASSWORD}
StorageLoc={DB_NAME}
"""


def write_configs(layout: Layout, nodes: int, gpus: int, cpus: int, ports: Ports | None = None) -> None:
    """Create the state directory's folders, write the configuration files into ``etc/`` and
    make the fake GPU devices in ``dev/``."""
    for d in (layout.etc, layout.dev, layout.run, layout.log, layout.state, layout.spool, layout.db):
        d.mkdir(parents=True, exist_ok=True)
    for name in node_names(nodes):
        (layout.spool / name).mkdir(exist_ok=True)
    for name, text in render_configs(layout.root, nodes, gpus, cpus, ports).items():
        write_file(layout.etc / name, text, 0o600 if name == "slurmdbd.conf" else 0o644)
    _make_gpu_devices(layout.dev, gpus)
    if (ports or DEFAULT_PORTS).slurm_plugins:
        write_plugin_hooks(layout)


def _make_gpu_devices(dev: Path, gpus: int) -> None:
    """``mknod DEV/gpuI c 195 I`` for each fake GPU (the notes, §2 and §6.2). Where mknod is not
    permitted, a regular file is used instead (it works; slurmd logs that it is not a device)."""
    for i in range(gpus):
        path = dev / f"gpu{i}"
        try:
            st = path.lstat()
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == GPU_DEVICE_MAJOR and os.minor(st.st_rdev) == i:
                continue
            if stat.S_ISREG(st.st_mode):
                continue
            path.unlink()
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(GPU_DEVICE_MAJOR, i))
        except PermissionError:
            logger.warning("mknod %s not permitted; using a regular file as fake GPU", path)
            path.touch()
        os.chmod(path, 0o666)
