"""The ``hpcsub`` console script (``hpcsched.hpcsub:main``); the code is :mod:`hpcsched.job.submit`."""

from hpcsched.job.submit import main, submit  # noqa: F401

if __name__ == "__main__":  # pragma: no cover
    main()
