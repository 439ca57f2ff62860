#!/usr/bin/env python3
#SBATCH --time=00:30:00
"""jobscripts/examples/digits_mlp.py for the dev-cluster tests, with a switch for its padding.

The example pads each step (``--min-step-time``, ``--sample-time``) to stand in for a real
model's compute, so that a job lasts long enough to be resized. The tests give their jobs many
more epochs than their resizes need, as a margin for a loaded machine (four dev clusters side
by side on 2 cores, ``tools/test.sh``), where a job that ends before its resize applies fails
the test. Once a test has seen everything it checks while the job runs, that margin is only
waiting: this script takes ``--unpaced-when PATH`` (before the example's own arguments) and,
as soon as ``PATH`` exists (``tests.conftest.unpace``), stops padding and ends training with the
epoch in progress. Trained unpadded, the margin would cost CPU instead of waiting: the margin
epochs of the suite's paced jobs came to about 135 CPU-seconds of its 1,400, on a machine the
suite keeps busy.

The example's code is what runs, unchanged: only the ``time`` module it sleeps through is
replaced by one whose ``sleep`` returns at once once the file exists, and its ``ElasticJob`` by
a subclass that ends the run early. The ranks must agree on the step they stop at, and a rank
may see the file one step before another, so each rank puts what it sees (a tiny number or 0)
into one extra gradient that rides in the job's own gradient all-reduce: every rank reads the
same sum at the same step, and once it is positive each sets its run's last epoch to the one in
progress. Workers that join later (a grow, a restart from a checkpoint) see the file at their
first step and set the same epoch. Every step is still trained and recorded; the tests check
every sample of every epoch that ran exactly once (``tests.jobrecords.epochs_trained``), the
generations, the processes and the loss.

    python paced_digits.py --unpaced-when /tmp/x/unpaced --epochs 120 --min-step-time 0.05

``--example PATH`` (also before the example's arguments) paces another example whose padding
sleeps through its module's ``time`` (``ddp_classifier.py``'s ``--batch-time``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "jobscripts" / "examples" / "digits_mlp.py"
FLAG = "--unpaced-when"
EXAMPLE_FLAG = "--example"


#: what a rank that sees the flag adds to the probe's gradient: a power of two, so a sum over
#: ranks is exact, and small enough that its square is nothing beside the gradient noise
#: statistics it travels with (hpcsched.job.collective.allreduce_flat)
_SEEN = 2.0 ** -40


class _Clock:
    """The ``time`` module, but ``sleep`` is a no-op once ``flag`` exists."""

    def __init__(self, flag: str):
        self._flag = flag

    def __getattr__(self, name: str):
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        if not os.path.exists(self._flag):
            time.sleep(seconds)


def _ending_once_unpaced(base, flag: str):
    """``base`` (hpcsched's ElasticJob), ending its run with the epoch in progress once ``flag``
    exists, at the same step on every rank (module docstring)."""
    import torch

    class EndsOnceUnpaced(base):
        _probe = None
        _announced = False

        def reduce_gradients(self, model) -> None:
            seen = os.path.exists(flag)
            if self.world_size == 1:
                super().reduce_gradients(model)
            else:
                if self._probe is None:
                    self._probe = torch.zeros(1, requires_grad=True)
                self._probe.grad = torch.full((1,), _SEEN if seen else 0.0)
                params = model.parameters() if hasattr(model, "parameters") else model
                super().reduce_gradients([*params, self._probe])
                grad = self._probe.grad   # None: a lost peer voided the step
                seen = grad is not None and grad.item() > 0
            if seen and self.state.epochs > self.state.epoch + 1:
                self.state.epochs = self.state.epoch + 1
            if seen and self.rank == 0 and not self._announced:
                self._announced = True
                print(f"paced_digits: unpaced; training ends with epoch {self.state.epochs - 1}",
                      flush=True)

    return EndsOnceUnpaced


def main() -> None:
    args = sys.argv[1:]
    i = args.index(FLAG)
    flag = args[i + 1]
    args = args[:i] + args[i + 2:]
    example = EXAMPLE
    if EXAMPLE_FLAG in args:   # another example that pads through its module's time.sleep
        i = args.index(EXAMPLE_FLAG)
        example = Path(args[i + 1])
        args = args[:i] + args[i + 2:]
    sys.argv = [str(example)] + args
    spec = importlib.util.spec_from_file_location(example.stem, example)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.time = _Clock(flag)
    if example == EXAMPLE:
        module.ElasticJob = _ending_once_unpaced(module.ElasticJob, flag)
    module.main()


if __name__ == "__main__":
    main()
