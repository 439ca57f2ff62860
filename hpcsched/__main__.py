"""``python -m hpcsched``: the ``hpcsched`` command (:mod:`hpcsched.cli`)."""

from hpcsched.cli import main

if __name__ == "__main__":  # pragma: no cover
    main(prog_name="hpcsched")
