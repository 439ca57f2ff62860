"""Pure job-performance models, which the policies and reconcile predict with.

* :mod:`~hpcsched.perf.pollux`: Pollux's step-time model (Qiao et al., OSDI'21 §3.2), its fit,
  and statistical efficiency (§3.1);
* :mod:`~hpcsched.perf.linear`: the linear model for jobs without a Pollux prior;
* :mod:`~hpcsched.perf.priors`: the shipped per-application priors;
* :mod:`~hpcsched.perf.model`: the one objective, goodput = throughput x efficiency, the model
  of each job (:func:`~hpcsched.perf.model.model_for`) and the best configuration at a size
  (:func:`~hpcsched.perf.model.best_at`).
"""
