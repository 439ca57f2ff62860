"""``python -m hpcsched.worker``: one training process (``srun`` task); the code is
:mod:`hpcsched.job.worker`. Kept for jobs whose launcher is older than the move.
"""

from hpcsched.job.worker import main

if __name__ == "__main__":  # pragma: no cover
    main()
