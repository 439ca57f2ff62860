"""``static``: change nothing -- every job keeps the size and batch size it was submitted with,
and Slurm schedules as it always does (FIFO/backfill). The baseline the other policies are
measured against, and a safe mode for the daemon (it then only observes and records)."""

from __future__ import annotations

from ..snapshot import ClusterSnapshot, Plan


class Static:
    name = "static"

    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan:
        """No targets: nothing to change. Objective: the GPUs hpcsched jobs hold."""
        return Plan(self.name, (), objective=float(sum(j.gpus for j in snapshot.jobs
                                                      if j.state == "RUNNING")))
