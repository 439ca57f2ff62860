"""Pure job-performance models: the step-time/throughput model of Pollux (Qiao et al., OSDI'21)
and statistical efficiency, which the policies and reconcile predict with.
"""
