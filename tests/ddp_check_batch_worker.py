"""One rank of several ElasticDDP checks in one process (tests/test_ddp_gloo.py): runs
tests/ddp_check_worker.py's ``main`` once per case, as if started anew for it, so that torch
(and torch._dynamo, which the first optimizer imports) is imported once, not once per case.

argv: a JSON list of cases, each ``{"key", "port", "local", "accum", "argv"}``: ``argv`` is the
single-case worker's command line, ``port`` the case's own ``MASTER_PORT`` (a fresh TCPStore
per case, as with one process per case), ``local``/``accum`` its batch configuration.

Per case, the worker's state is as in a fresh process: the environment it reads, the random
seed (its ``main`` seeds torch itself), ElasticJob's ``survives_lost_workers`` (which
``hooked`` patches on the class; restored here), and no process group (each case's job leaves
its own at ``close``). Prints one JSON line per case, ``{"key", "out"}`` (``out``: the single
worker's JSON line); a case that raises prints ``{"key", "error"}`` and ends the process (the
peers' group is then unusable).
"""

import contextlib
import gc
import io
import json
import os
import sys
import traceback

import torch.distributed as dist

import tests.ddp_check_worker as single
from hpcsched.elastic import ElasticJob


def main() -> None:
    cases = json.loads(sys.argv[1])
    survives = ElasticJob.__dict__.get("survives_lost_workers")
    for case in cases:
        os.environ.update(MASTER_PORT=str(case["port"]),
                          HPCSCHED_LOCAL_BATCH_SIZE=str(case["local"]),
                          HPCSCHED_ACCUMULATION_STEPS=str(case["accum"]))
        sys.argv = [single.__file__, *case["argv"]]
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                single.main()
            assert not dist.is_initialized(), "the case left a process group behind"
            lines = buf.getvalue().strip().splitlines()
            print(json.dumps({"key": case["key"], "out": json.loads(lines[-1])}), flush=True)
        except BaseException:
            print(json.dumps({"key": case["key"], "error": traceback.format_exc()}), flush=True)
            sys.stdout.flush()
            os._exit(1)
        finally:
            if survives is not None:
                ElasticJob.survives_lost_workers = survives
            elif "survives_lost_workers" in ElasticJob.__dict__:
                del ElasticJob.survives_lost_workers   # the inherited property again
        gc.collect()  # the case's loader workers and TCPStore go now, not later


if __name__ == "__main__":
    main()
