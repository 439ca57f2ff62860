#!/usr/bin/env python3
#SBATCH --time=00:30:00
"""jobscripts/examples/digits_mlp.py for the dev-cluster tests, with a switch for its padding.

The example pads each step (``--min-step-time``, ``--sample-time``) to stand in for a real
model's compute, so that a job lasts long enough to be resized. The tests give their jobs many
more epochs than their resizes need, as a margin for a loaded machine (four dev clusters side
by side on 2 cores, ``tools/test.sh``), where a job that ends before its resize applies fails
the test. Once a test has seen everything it checks while the job runs, that margin is only
waiting: this script takes ``--unpaced-when PATH`` (before the example's own arguments) and
stops padding as soon as ``PATH`` exists (``tests.conftest.unpace``), so the remaining epochs run at the
tiny model's own speed. The example's code is what runs, unchanged: only the ``time`` module it
sleeps through is replaced by one whose ``sleep`` returns at once once the file exists. Every
step is still trained and recorded; what the tests check of the records (every sample of every
epoch exactly once, the generations, the processes, the loss) is the same.

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


class _Clock:
    """The ``time`` module, but ``sleep`` is a no-op once ``flag`` exists."""

    def __init__(self, flag: str):
        self._flag = flag

    def __getattr__(self, name: str):
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        if not os.path.exists(self._flag):
            time.sleep(seconds)


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
    module.main()


if __name__ == "__main__":
    main()
