"""sbatch's option table and the rules of glibc ``getopt_long`` that sbatch parses it with
(the module docstring of :mod:`hpcsched.job.sbatch_args` lists them): which options take a
value, and the options one argument at a time, as getopt reads them.

Pure. :class:`UsageError` is defined here and re-exported by :mod:`hpcsched.job.sbatch_args`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


class UsageError(ValueError):
    """A mistake on the command line or in the script's directives.

    The message is one line, suitable for ``hpcsub: error: <msg>``.
    """


# --------------------------------------------------------------------------------------------
# sbatch's options
# --------------------------------------------------------------------------------------------


class _Value(enum.Enum):
    """Whether an option takes a value (getopt's ``has_arg``)."""

    NONE = "no_argument"
    REQUIRED = "required_argument"
    OPTIONAL = "optional_argument"


# Every option of sbatch in Slurm 22.05, written the way sbatch(1) writes them: ``--opt=`` takes
# a value, ``--opt[=]`` takes one only after ``=``, a bare ``--opt`` takes none.
#
# Source: the OPTIONS section of the sbatch(1) man page of Slurm 22.05.8 (Debian package
# slurm-client 22.05.8-4+deb12u3, /usr/share/man/man1/sbatch.1.gz, dated December 2022), with
# the value rule of each option checked against the getopt table compiled into that release
# (the ``common_options[]`` entries of src/common/slurm_opt.c that have an sbatch handler, as
# built into libslurmfull.so). The binary also accepts four names the man page does not list,
# included here: --cluster, --context, --ntasks-per-tres and --tasks-per-node. (``sbatch
# --help`` shows ``--export[=names]``, but the man page and the binary both require the value.)
# Options that site SPANK plugins add (such as pyxis's --container-image) are not here.
# tests/test_sbatch_args.py compares this table with the installed sbatch when it is 22.05.
_SBATCH_OPTION_TABLE = """
    -A/--account=          --acctg-freq=          -a/--array=            --batch=
    --bb=                  --bbf=                 -b/--begin=            -D/--chdir=
    --cluster=             --cluster-constraint=  -M/--clusters=         --comment=
    -C/--constraint=       --container=           --context=             --contiguous
    -S/--core-spec=        --cores-per-socket=    --cpu-freq=            --cpus-per-gpu=
    -c/--cpus-per-task=    --deadline=            --delay-boot=          -d/--dependency=
    -m/--distribution=     -e/--error=            -x/--exclude=          --exclusive[=]
    --export=              --export-file=         -B/--extra-node-info=  --get-user-env[=]
    --gid=                 --gpu-bind=            --gpu-freq=            -G/--gpus=
    --gpus-per-node=       --gpus-per-socket=     --gpus-per-task=       --gres=
    --gres-flags=          -h/--help              --hint=                -H/--hold
    --ignore-pbs           -i/--input=            -J/--job-name=         --kill-on-invalid-dep=
    -L/--licenses=         --mail-type=           --mail-user=           --mcs-label=
    --mem=                 --mem-bind=            --mem-per-cpu=         --mem-per-gpu=
    --mincpus=             --network=             --nice[=]              -k/--no-kill[=]
    --no-requeue           -F/--nodefile=         -w/--nodelist=         -N/--nodes=
    -n/--ntasks=           --ntasks-per-core=     --ntasks-per-gpu=      --ntasks-per-node=
    --ntasks-per-socket=   --ntasks-per-tres=     --open-mode=           -o/--output=
    -O/--overcommit        -s/--oversubscribe     --parsable             -p/--partition=
    --power=               --prefer=              --priority=            --profile=
    --propagate[=]         -q/--qos=              -Q/--quiet             --reboot
    --requeue              --reservation=         --signal=              --sockets-per-node=
    --spread-job           --switches=            --tasks-per-node=      --test-only
    --thread-spec=         --threads-per-core=    -t/--time=             --time-min=
    --tmp=                 --uid=                 --usage                --use-min-nodes
    -v/--verbose           -V/--version           -W/--wait              --wait-all-nodes=
    --wckey=               --wrap=
"""

_TABLE_ENTRY = re.compile(r"(?:-(?P<short>[A-Za-z])/)?--(?P<long>[a-z][a-z-]*)(?P<value>\[=\]|=)?")
_TABLE_RULES = {None: _Value.NONE, "=": _Value.REQUIRED, "[=]": _Value.OPTIONAL}


def _load_table(text: str) -> tuple[dict[str, _Value], dict[str, str]]:
    """``({long name: value rule}, {short letter: long name})`` from the table above."""
    longs: dict[str, _Value] = {}
    shorts: dict[str, str] = {}
    for word in text.split():
        m = _TABLE_ENTRY.fullmatch(word)
        if m is None or m["long"] in longs or m["short"] in shorts:
            raise AssertionError(f"bad or repeated entry in the sbatch option table: {word}")
        longs[m["long"]] = _TABLE_RULES[m["value"]]
        if m["short"]:
            shorts[m["short"]] = m["long"]
    return longs, shorts


_LONG_OPTIONS, _SHORT_OPTIONS = _load_table(_SBATCH_OPTION_TABLE)

_HPCSCHED_PREFIX = "--hpcsched-"
_HETJOB_SEPARATOR = ":"


def _skip_separators(argv: Sequence[str], i: int) -> int:
    """The first index from ``i`` on whose argument is not a heterogeneous-job separator."""
    while i < len(argv) and argv[i] == _HETJOB_SEPARATOR:
        i += 1
    return i


@dataclass(frozen=True)
class _Option:
    """One sbatch option as getopt saw it: the canonical long name and its value, if any.

    ``known`` is false for an option that is not in the table: ``name`` is then as written.
    """

    name: str
    value: str | None
    known: bool = True


def _resolve_long(name: str) -> str | None:
    """The option that ``--name`` means: an exact name, else the one name it is a prefix of;
    ``None`` if it is neither (an option hpcsub does not know, for sbatch to judge).

    (glibc also lets a prefix through when all its matches are the same option under several
    names; the only aliases here, --tasks-per-node and --ntasks-per-node, share no prefix.)

    Raises:
        UsageError: a prefix of several options, no name at all, or a name starting with
            ``hpcsched`` (hpcsched's own options, which :func:`split_argv` takes out first).
    """
    if name in _LONG_OPTIONS:
        return name
    matches = [n for n in _LONG_OPTIONS if name and n.startswith(name)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UsageError(f"ambiguous sbatch option --{name} (could be "
                         + ", ".join(f"--{n}" for n in matches) + ")")
    if not name:
        raise UsageError("an option with no name after '--'")
    if name.startswith(_HPCSCHED_PREFIX[2:]):
        raise UsageError(f"--{name}: hpcsched's options are read from the hpcsub command line "
                         "only, not from #SBATCH lines")
    if name.startswith("hpcsched"):
        raise UsageError(f"unknown option --{name} (hpcsched's own options are spelled "
                         "--hpcsched-NAME; see hpcsub --help)")
    return None


def _parse_option(argv: Sequence[str], i: int, unknown_takes_word: bool) -> tuple[list[_Option], int]:
    """Parse the sbatch option at ``argv[i]`` (which starts with ``-``).

    Returns the options found (several for combined short flags) and the index of the argument
    after those consumed. A separate value is the next argument that is not a ``:``.

    An unknown long option without ``=`` followed by a word (an argument that is not an
    option): if ``unknown_takes_word``, the word is its value; if not, it is an error, because
    the word could be its value or the script.
    """
    if argv[i].startswith("--"):
        return _parse_long(argv, i, unknown_takes_word)
    return _parse_short(argv, i)


def _parse_long(argv: Sequence[str], i: int, unknown_takes_word: bool) -> tuple[list[_Option], int]:
    """Parse the long option ``--name`` or ``--name=value`` at ``argv[i]`` (see
    :func:`_parse_option`): a flag, a value after ``=`` (the only way to give an optional
    one), or a required value from the next argument that is not a ``:``; an unknown name
    goes to :func:`_parse_unknown`."""
    written, has_value, value = argv[i][2:].partition("=")
    name = _resolve_long(written)
    if name is None:
        return _parse_unknown(argv, i, written, value if has_value else None,
                              unknown_takes_word)
    rule = _LONG_OPTIONS[name]
    if rule is _Value.NONE:
        if has_value:
            raise UsageError(f"sbatch option --{name} takes no value")
        return [_Option(name, None)], i + 1
    if has_value or rule is _Value.OPTIONAL:
        return [_Option(name, value if has_value else None)], i + 1
    j = _skip_separators(argv, i + 1)
    if j < len(argv):
        return [_Option(name, argv[j])], j + 1
    raise UsageError(f"sbatch option --{name} needs a value")


def _parse_short(argv: Sequence[str], i: int) -> tuple[list[_Option], int]:
    """Parse the short options at ``argv[i]`` (``-QH``, ``-N2``, ``-N 2``; see
    :func:`_parse_option`): flags one letter at a time, until a letter that takes a value
    takes the rest of the argument (an optional value only that way) or, for a required one,
    the next argument that is not a ``:``."""
    arg = argv[i]
    found = []
    for pos in range(1, len(arg)):
        letter = arg[pos]
        if letter not in _SHORT_OPTIONS:
            raise UsageError(f"unknown sbatch option -{letter}")
        name = _SHORT_OPTIONS[letter]
        rule = _LONG_OPTIONS[name]
        if rule is _Value.NONE:
            found.append(_Option(name, None))
            continue
        rest = arg[pos + 1:]
        if rest or rule is _Value.OPTIONAL:
            found.append(_Option(name, rest or None))
            return found, i + 1
        j = _skip_separators(argv, i + 1)
        if j < len(argv):
            found.append(_Option(name, argv[j]))
            return found, j + 1
        raise UsageError(f"sbatch option -{letter} needs a value")
    return found, i + 1


def _parse_unknown(argv: Sequence[str], i: int, name: str, value: str | None,
                   takes_word: bool) -> tuple[list[_Option], int]:
    """Parse ``argv[i]``, the unknown long option ``--name`` (``--name=value`` if ``value`` is
    not ``None``); see :func:`_parse_option`."""
    if value is not None:
        return [_Option(name, value, known=False)], i + 1
    j = _skip_separators(argv, i + 1)
    if j == len(argv) or _is_option(argv[j]):
        return [_Option(name, None, known=False)], i + 1
    if takes_word:
        return [_Option(name, argv[j], known=False)], j + 1
    word = argv[j]
    raise UsageError(
        f"--{name} {word!r}: hpcsub does not know --{name} (it passes such options to sbatch as "
        f"written), so it cannot tell whether {word!r} is its value or the script; write "
        f"--{name}=VALUE, or put -- before the script if --{name} takes no value")


def _is_option(arg: str) -> bool:
    """True if getopt would read ``arg`` as an option (``-`` alone is an operand)."""
    return arg.startswith("-") and arg != "-"


def _iter_options(args: Sequence[str]) -> Iterator[_Option]:
    """The options in ``args``, a list that should hold nothing but sbatch options (and ``:``)."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == _HETJOB_SEPARATOR:
            i += 1
        elif arg == "--":  # getopt skips it; anything after it is an operand
            if i + 1 < len(args):
                raise UsageError(f"{args[i + 1]!r} is not an sbatch option")
            i += 1
        elif _is_option(arg):
            options, i = _parse_option(args, i, unknown_takes_word=True)
            yield from options
        else:
            raise UsageError(f"{arg!r} is not an sbatch option")
