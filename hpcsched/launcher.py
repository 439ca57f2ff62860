"""``python -m hpcsched.launcher``: the batch step of an hpcsched job.

Batch scripts already queued (or requeued) call this module path; the code is
:mod:`hpcsched.job.launcher`.
"""

import sys

from hpcsched.job.launcher import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
