"""The daemon <-> job contract, once: the files both sides read and write
(:mod:`~hpcsched.protocol.files`), the job directory and job spec
(:mod:`~hpcsched.protocol.jobdir`), and the batch-size arithmetic both sides apply
(:mod:`~hpcsched.protocol.batching`). See ``docs/control-protocol.md``.
"""
