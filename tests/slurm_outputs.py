"""Output captured from the dev cluster (Slurm 22.05.8, openapi v0.0.38; 4 nodes x gpu:4),
trimmed to the fields the parsers read; shared by the parser tests and the CLI-backend tests
that serve it through fake ``squeue``/``sinfo`` executables."""

from __future__ import annotations

import json

_META = '{"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"}, "Slurm": {"release": "22.05.8"}}'

# `sinfo --json` with nothing running: gres_used is "gpu:0", tres_used is null.
SINFO_IDLE = '{"meta": ' + _META + ''', "errors": [], "nodes": [
  {"name": "n1", "hostname": "n1", "state": "idle", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:0", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": null},
  {"name": "n2", "hostname": "n2", "state": "idle", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:0", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": null},
  {"name": "n3", "hostname": "n3", "state": "idle", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:0", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": null},
  {"name": "n4", "hostname": "n4", "state": "idle", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:0", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": null}
]}'''

# `sinfo --json` with job 61 (`sbatch -N2 --gres=gpu:2 --wrap 'sleep 30'`) on n[1-2] beside a
# foreign job 59 (gres:gpu:2 on n[1-3]): gres_used sums both, "gpu:4", with no (IDX:...) suffix.
SINFO_RUNNING = '{"meta": ' + _META + ''', "errors": [], "nodes": [
  {"name": "n1", "hostname": "n1", "state": "mixed", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:4", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": "cpu=3,gres/gpu=4"},
  {"name": "n2", "hostname": "n2", "state": "mixed", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:4", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": "cpu=3,gres/gpu=4"},
  {"name": "n3", "hostname": "n3", "state": "mixed", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:2", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": "cpu=2,gres/gpu=2"},
  {"name": "n4", "hostname": "n4", "state": "idle", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:0", "gres_drained": "N/A", "partitions": ["gpu"], "tres": "cpu=8,mem=16000M,billing=8,gres/gpu=4", "tres_used": null}
]}'''

# `squeue --json` at the same moment: the foreign job, a held job, and ours.
SQUEUE_RUNNING = '{"meta": ' + _META + ''', "errors": [], "jobs": [
  {"job_id": 59, "job_state": "RUNNING", "state_reason": "None", "name": "digits_mlp.py", "user_name": "root", "partition": "gpu", "nodes": "n[1-3]", "node_count": 3, "tres_per_node": "gres:gpu:2", "gres_detail": ["gpu:2(IDX:0-1)", "gpu:2(IDX:0-1)", "gpu:2(IDX:0-1)"], "restart_cnt": 1, "batch_host": "n1", "priority": 4294901720},
  {"job_id": 60, "job_state": "PENDING", "state_reason": "JobHeldUser", "name": "wrap", "user_name": "root", "partition": "gpu", "nodes": "", "node_count": 1, "tres_per_node": "", "gres_detail": [], "restart_cnt": 0, "batch_host": "", "priority": 0},
  {"job_id": 61, "job_state": "RUNNING", "state_reason": "None", "name": "wrap", "user_name": "root", "partition": "gpu", "nodes": "n[1-2]", "node_count": 2, "tres_per_node": "gres:gpu:2", "gres_detail": ["gpu:2(IDX:2-3)", "gpu:2(IDX:2-3)"], "restart_cnt": 0, "batch_host": "n1", "priority": 4294901719}
]}'''

# `squeue --json` after `scancel 60 61`: finished jobs stay listed (MinJobAge).
SQUEUE_CANCELLED = '{"meta": ' + _META + ''', "errors": [], "jobs": [
  {"job_id": 60, "job_state": "CANCELLED", "state_reason": "JobHeldUser", "name": "wrap", "user_name": "root", "partition": "gpu", "nodes": "", "node_count": 1, "tres_per_node": "", "gres_detail": [], "restart_cnt": 0, "batch_host": "", "priority": 0},
  {"job_id": 61, "job_state": "CANCELLED", "state_reason": "None", "name": "wrap", "user_name": "root", "partition": "gpu", "nodes": "n[1-2]", "node_count": 2, "tres_per_node": "gres:gpu:2", "gres_detail": [], "restart_cnt": 0, "batch_host": "n1", "priority": 4294901719}
]}'''

# What 22.05.8 prints, with exit status 0 and nothing on stderr, when slurmctld does not answer
# (SlurmctldPort pointing at a closed port; after about 9 s of retries).
SQUEUE_DOWN = '{"meta": ' + _META + ''', "errors": [{"description": "Failed while looking for jobs", "error_number": -1, "error": "Unspecified error", "source": "slurm_load_jobs"}], "jobs": []}'''
SINFO_DOWN = '{"meta": ' + _META + ''', "errors": [{"error": "Unspecified error", "errno": -1}], "nodes": []}'''


def node(name="n1", **kw) -> dict:
    """One ``sinfo --json`` node object: idle, ``gpu:4``, partition ``gpu``, overridden by ``kw``."""
    d = {"name": name, "state": "idle", "state_flags": [], "gres": "gpu:4", "gres_used": "gpu:0",
         "partitions": ["gpu"]}
    d.update(kw)
    return d


def sinfo(*nodes: dict) -> str:
    """A ``sinfo --json`` document listing ``nodes``."""
    return json.dumps({"meta": {}, "errors": [], "nodes": list(nodes)})
