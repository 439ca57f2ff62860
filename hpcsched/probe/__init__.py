"""The GPU probe that ``slurm-plugins/prolog-gpu-probe`` runs on a compute node at a job's start
(``python -m hpcsched.probe``; docs/slurm-plugins.md).

It benchmarks each GPU Slurm allocated to the job on this node for a few seconds and writes one
:mod:`hpcsched.protocol.probes` record (``<node>-<job id>.json``, atomically) into the probe spool
directory, which the daemon ingests every round (:mod:`hpcsched.daemon.probes`).

A package of its own, not a daemon module: it runs on compute nodes under slurmd's prolog time
bound, so it imports only :mod:`hpcsched.protocol` and the benchmark's library (torch for CUDA,
NumPy for the CPU stand-in), never the daemon (SQLAlchemy, policies) whose import alone would eat
into that bound.

* :mod:`~hpcsched.probe.bench`: the benchmarks (CUDA matmul in TFLOP/s; the CPU stand-in in GFLOP/s);
* :mod:`~hpcsched.probe.__main__`: reading the prolog's environment and writing the record.
"""
