"""Read an ``hpcsub`` command line and a batch script the way ``sbatch`` would.

``hpcsub`` has exactly sbatch's shape::

    hpcsub [sbatch options] [hpcsched options] train.py [script args]

Options come first; the first argument that is not an option (or the argument after ``--``) is
the script, and everything after it belongs to the script, even if it looks like an option. The
hpcsched options (``--hpcsched-NAME=V``, ``--hpcsched-NAME V`` or, for flags,
``--hpcsched-NAME``) can be mixed in with sbatch's.

Finding the script means knowing, for each sbatch option, whether it takes a value, so this
module carries sbatch's option table and follows the rules of glibc ``getopt_long`` that sbatch
parses with (option string starting with ``+``, so parsing stops at the first non-option):

* ``-N 2``, ``-N2``, ``-QHN2`` (flags combined, the last one taking the rest as its value);
* ``--nodes 2``, ``--nodes=2``, and any unique prefix of a long name (``--ntasks-per-no 4``);
  an exact name always wins, and a prefix matching several names is an error;
* an option with a *required* value takes the next argument whatever it looks like;
  an *optional* value is only ever given with ``=`` (``--exclusive=user``; ``--exclusive x``
  leaves ``x`` alone) or attached to a short option (``-koff``);
* ``--`` ends the options; a lone ``:`` separates the components of a heterogeneous job.
  sbatch drops every ``:`` before it looks for the script, so one is never an option's value:
  in ``-J : x.sh`` the ``x.sh`` is the job name and there is no script.

A long option that is not in the table (a newer Slurm's ``--tres-per-task``, a SPANK plugin's
``--container-image``) is passed to sbatch as it is written, and sbatch judges it. Not knowing
whether it takes a value, hpcsub never guesses (:func:`split_argv`): on the command line it is
taken as ``--name=value`` or as a flag, and one followed by a word (``--name word``) is an error,
since the word could be its value or the script; in ``#SBATCH`` lines, where there is no script
to mistake, such a word is its value (:func:`read_directives`). Names that hpcsub's own options
could be meant by (``--hpcsched...``) and unknown short options (sbatch's are all in the table;
plugins cannot add any) are errors.

Everything here is pure except that callers hand :func:`read_directives` the script's text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hpcsched.job.sbatch_options import (
    _HETJOB_SEPARATOR,
    _HPCSCHED_PREFIX,
    UsageError,
    _is_option,
    _iter_options,
    _parse_option,
    _skip_separators,
)

# the option table, where it was read from before it moved (tests/test_sbatch_args.py)
from hpcsched.job.sbatch_options import _LONG_OPTIONS as _LONG_OPTIONS
from hpcsched.job.sbatch_options import _SHORT_OPTIONS as _SHORT_OPTIONS
from hpcsched.job.sbatch_options import _Value as _Value

__all__ = [
    "Geometry",
    "HpcsubArgs",
    "UsageError",
    "geometry",
    "read_directives",
    "split_argv",
]


# sbatch's option table and getopt_long's rules: hpcsched.job.sbatch_options (UsageError is
# defined there, for both modules, and is this module's too)


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HpcsubArgs:
    """An ``hpcsub`` command line, split.

    Attributes:
        sbatch_args: sbatch's options exactly as given, in order, ``:`` separators included,
            for passing to sbatch unchanged. A ``--`` that ended the options is left out: put
            one before the script when it starts with ``-``.
        hpcsched_opts: ``(name, value)`` for each ``--hpcsched-NAME`` option in order; the
            name is without the ``--hpcsched-`` prefix and the value is ``None`` for flags.
        script: the batch script, or ``None`` if the command line has none.
        script_args: the arguments after the script, all of them (sbatch itself would also
            drop any ``:`` among them).
    """

    sbatch_args: tuple[str, ...]
    hpcsched_opts: tuple[tuple[str, str | None], ...]
    script: str | None
    script_args: tuple[str, ...]


def split_argv(argv: Sequence[str], hpcsched_flags: frozenset[str] = frozenset()) -> HpcsubArgs:
    """Split an ``hpcsub`` command line (without the program name) as sbatch would.

    Args:
        argv: the arguments after ``hpcsub``.
        hpcsched_flags: names (without ``--hpcsched-``) of the hpcsched options that take no
            value; every other ``--hpcsched-NAME`` takes one, as ``--hpcsched-NAME=V`` or as the
            next argument.

    Returns:
        The split command line; its ``script`` is ``None`` if there is no script.

    Long options that are not sbatch 22.05's pass through into ``sbatch_args`` as written, as
    ``--name=value`` or as a flag; they never take the next argument.

    Raises:
        UsageError: an ambiguous sbatch option, an unknown short option, an option missing its
            value or given one it does not take, the same for an hpcsched option, or an unknown
            long option without ``=`` followed by a word that is not an option (its value or
            the script? write ``--name=value``, or ``--`` before the script).
    """
    sbatch_args: list[str] = []
    hpcsched_opts: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            end = _skip_separators(argv, i + 1)
            sbatch_args.extend(argv[i + 1:end])
            i = end
            break
        if arg.startswith(_HPCSCHED_PREFIX):
            option, i = _parse_hpcsched_option(argv, i, hpcsched_flags)
            hpcsched_opts.append(option)
        elif arg == _HETJOB_SEPARATOR:
            sbatch_args.append(arg)
            i += 1
        elif _is_option(arg):
            _, end = _parse_option(argv, i, unknown_takes_word=False)
            sbatch_args.extend(argv[i:end])
            i = end
        else:
            break
    script = argv[i] if i < len(argv) else None
    return HpcsubArgs(
        sbatch_args=tuple(sbatch_args),
        hpcsched_opts=tuple(hpcsched_opts),
        script=script,
        script_args=tuple(argv[i + 1:]),
    )


def _parse_hpcsched_option(
    argv: Sequence[str], i: int, flags: frozenset[str]
) -> tuple[tuple[str, str | None], int]:
    """Parse the ``--hpcsched-`` option at ``argv[i]``: ``((name, value), next index)``."""
    name, has_value, value = argv[i][len(_HPCSCHED_PREFIX):].partition("=")
    option = _HPCSCHED_PREFIX + name
    if not name:
        raise UsageError(f"{argv[i]}: missing the option name after {_HPCSCHED_PREFIX}")
    if name in flags:
        if has_value:
            raise UsageError(f"{option} takes no value")
        return (name, None), i + 1
    if has_value:
        return (name, value), i + 1
    if i + 1 < len(argv):
        return (name, argv[i + 1]), i + 2
    raise UsageError(f"{option} needs a value")


# --------------------------------------------------------------------------------------------
# #SBATCH directives
# --------------------------------------------------------------------------------------------

# sbatch 22.05 still reads the old #SLURM spelling (with a warning), so it counts here too.
_DIRECTIVE_PREFIXES = ("#SBATCH", "#SLURM")
_HETJOB_WORDS = ("hetjob", "packjob")
_C_SPACE = " \t\n\v\f\r"  # C's isspace() in the "C" locale


def read_directives(script_text: str) -> tuple[str, ...]:
    """The sbatch options that a batch script's ``#SBATCH`` lines give, as argv tokens.

    This follows sbatch 22.05 (``_opt_batch_script`` and ``get_argument`` in Slurm; the
    behaviour below was checked against the 22.05.8 binary):

    * A directive is a line that starts, in its first column, with ``#SBATCH`` (or the old
      ``#SLURM``). Reading stops at the first line that is neither blank nor a comment (after
      optional whitespace), so directives after the first command are ignored.
    * A line may hold several options, separated by whitespace. Single or double quotes group
      words (``--comment="a b"``); a backslash makes the next character literal, inside quotes
      too (but an escaped space still ends the word, as in sbatch). An unquoted, unescaped
      ``#`` ends the line, even in the middle of a word (``--job-name=a#b`` gives ``a``).
    * As in sbatch, an empty word (``""``) ends its line, and the words of all lines form one
      argument list, so an option's value can come from the next line.
    * ``#SBATCH hetjob`` (or ``packjob``) separates heterogeneous-job components; it becomes a
      ``:`` token, which is how the command line separates them.
    * A long option that is not sbatch 22.05's is kept as it is, for sbatch to judge; a word
      after it that is not an option is its value (``#SBATCH --container-image img``), since
      a word that is not an option's value is an error in ``#SBATCH`` lines anyway.

    Returns:
        The tokens, in script order.

    Raises:
        UsageError: an unmatched quote, a word starting with ``:``, a ``hetjob`` that is not
            the first word of its line, or tokens that are not valid sbatch options (sbatch
            rejects all of these too), or an ``--hpcsched-`` option.
    """
    tokens: list[str] = []
    for lineno, line in enumerate(script_text.split("\n"), start=1):
        rest = next((line[len(p):] for p in _DIRECTIVE_PREFIXES if line.startswith(p)), None)
        if rest is None:
            stripped = line.lstrip(_C_SPACE)
            if stripped and not stripped.startswith("#"):
                break  # the first command: sbatch reads no further
            continue
        words = _directive_words(rest, lineno)
        if words and words[0].lower() in _HETJOB_WORDS:
            tokens.append(_HETJOB_SEPARATOR)  # sbatch ignores the rest of that line
            continue
        if any(w.lower() in _HETJOB_WORDS for w in words):
            # sbatch silently drops the rest of such a line, or worse; refuse it instead.
            raise UsageError(f"script line {lineno}: 'hetjob' must start its #SBATCH line")
        tokens.extend(words)
    try:
        for _ in _iter_options(tokens):
            pass
    except UsageError as exc:
        raise UsageError(f"invalid #SBATCH directive: {exc}") from None
    return tuple(tokens)


def _directive_words(text: str, lineno: int) -> list[str]:
    """Split the text after ``#SBATCH`` into words, as sbatch's ``get_argument`` does."""
    words: list[str] = []
    i, end = 0, len(text)
    while True:
        while i < end and text[i] in _C_SPACE:
            i += 1
        if i == end:
            return words
        if text[i] == ":":
            raise UsageError(f"script line {lineno}: unexpected ':' in #SBATCH line")
        word, i = _directive_word(text, i, lineno)
        if not word:
            return words  # sbatch stops reading the line at an empty word
        words.append(word)


def _directive_word(text: str, i: int, lineno: int) -> tuple[str, int]:
    """The word of an ``#SBATCH`` line's ``text`` that starts at ``text[i]`` (not a space)
    and the index after it: quotes group, a backslash makes the next character literal, an
    unquoted ``#`` ends the line (the index is then the text's end); ``""`` for an empty
    word. Raises UsageError, naming script line ``lineno``, on an unmatched quote."""
    end = len(text)
    word: list[str] = []
    quote = None
    escaped = False
    while i < end and (quote or text[i] not in _C_SPACE):
        char = text[i]
        i += 1
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
            continue
        elif quote:
            if char == quote:
                quote = None
                continue
        elif char in "\"'":
            quote = char
            continue
        elif char == "#":
            i = end  # a comment: the rest of the line is not read
            break
        word.append(char)
    if quote:
        raise UsageError(f"script line {lineno}: unmatched {quote} in #SBATCH line")
    return "".join(word), i


# --------------------------------------------------------------------------------------------
# What the options ask for
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Geometry:
    """The shape of the job that sbatch options ask for; ``None`` where they do not say.

    Attributes:
        nodes_min, nodes_max: from ``-N/--nodes`` (``N`` gives ``N`` for both, ``N-M`` a range).
        gpus_per_node: GPUs per node from ``--gres=gpu[:type][:K]`` (summed over the ``gpu``
            entries of the list; a ``gpu`` entry without a count means 1) or from
            ``--gpus-per-node=[type:]K``.
        gpus_total: from ``-G/--gpus=[type:]K``.
        ntasks: from ``-n/--ntasks``.
        ntasks_per_node: from ``--ntasks-per-node`` (alias ``--tasks-per-node``).
        array: the ``-a/--array`` value.
        partition: the ``-p/--partition`` value.
        parsable, wait, test_only: whether ``--parsable``, ``-W/--wait``, ``--test-only`` are
            present.
    """

    nodes_min: int | None = None
    nodes_max: int | None = None
    gpus_per_node: int | None = None
    gpus_total: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    array: str | None = None
    partition: str | None = None
    parsable: bool = False
    wait: bool = False
    test_only: bool = False


def geometry(*arg_lists: Sequence[str]) -> Geometry:
    """Interpret sbatch options for the job geometry hpcsched needs.

    Options that are not in sbatch 22.05's table are skipped: a job's shape must be given with
    the options read here (``--tres-per-task``, for example, is passed on but not read).

    Args:
        *arg_lists: lists of sbatch options only (no script), such as the output of
            :func:`read_directives` and :attr:`HpcsubArgs.sbatch_args`. Later lists and later
            options override earlier ones, so pass the directives first: sbatch's command line
            wins over ``#SBATCH`` lines.

    Raises:
        UsageError: a malformed value (naming the option), an argument that is not an sbatch
            option, a heterogeneous job (``:`` or ``#SBATCH hetjob``), or GPUs per node given
            with both ``--gres`` and ``--gpus-per-node`` with different counts.
    """
    geo = Geometry()
    gres_gpus: int | None = None  # GPUs per node from --gres and from --gpus-per-node:
    per_node_gpus: int | None = None  # sbatch sends both, so they must agree
    if any(_HETJOB_SEPARATOR in args for args in arg_lists):
        raise UsageError("heterogeneous jobs (':' or '#SBATCH hetjob') are not supported")
    for args in arg_lists:
        for option in _iter_options(args):
            if not option.known:
                continue  # passed to sbatch as it is; hpcsched reads nothing from it
            name, value = option.name, option.value or ""
            if name == "gres":
                gres_gpus = _parse_gres_gpus(value)
            elif name == "gpus-per-node":
                per_node_gpus = _parse_gpu_counts(name, value)
            else:
                geo = _with_option(geo, name, value)
    if gres_gpus is not None and per_node_gpus is not None and gres_gpus != per_node_gpus:
        raise UsageError(f"--gres asks for {gres_gpus} GPUs per node but --gpus-per-node for "
                         f"{per_node_gpus}; give one of them")
    return replace(geo, gpus_per_node=per_node_gpus if per_node_gpus is not None else gres_gpus)


def _with_option(geo: Geometry, name: str, value: str) -> Geometry:
    """``geo`` with what option ``name`` (long name, ``value`` "" if none) says; other options
    leave it as it is. GPUs per node (``--gres``, ``--gpus-per-node``) are not handled here."""
    match name:
        case "nodes":
            low, high = _parse_nodes(value)
            return replace(geo, nodes_min=low, nodes_max=high)
        case "gpus":
            return replace(geo, gpus_total=_parse_gpu_counts(name, value))
        case "ntasks":
            return replace(geo, ntasks=_parse_positive(name, value))
        case "ntasks-per-node" | "tasks-per-node":
            return replace(geo, ntasks_per_node=_parse_positive(name, value))
        case "array":
            return replace(geo, array=value)
        case "partition":
            return replace(geo, partition=value)
        case "parsable":
            return replace(geo, parsable=True)
        case "wait":
            return replace(geo, wait=True)
        case "test-only":
            return replace(geo, test_only=True)
    return geo


_COUNT = re.compile(r"[0-9]+")


def _parse_nodes(value: str) -> tuple[int, int]:
    """``-N N`` or ``-N N-M`` as ``(min, max)``."""
    m = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", value)
    if m is None:
        raise UsageError(f"invalid --nodes value {value!r}: expected N or N-M")
    low = int(m[1])
    high = int(m[2]) if m[2] is not None else low
    if high < low:
        raise UsageError(f"invalid --nodes value {value!r}: the maximum is below the minimum")
    return low, high


def _parse_positive(name: str, value: str) -> int:
    """A count of at least 1, as sbatch requires of --ntasks and --ntasks-per-node."""
    if not _COUNT.fullmatch(value) or int(value) < 1:
        raise UsageError(f"invalid --{name} value {value!r}: expected a positive integer")
    return int(value)


def _parse_gpu_counts(name: str, value: str) -> int:
    """``--gpus``/``--gpus-per-node``: a comma list of ``[type:]count``, summed."""
    total = 0
    for entry in value.split(","):
        fields = entry.split(":")
        count = fields[-1]
        if len(fields) > 2 or fields[0] == "" or not _COUNT.fullmatch(count):
            raise UsageError(f"invalid --{name} value {value!r}: expected [type:]count")
        total += int(count)
    return total


def _parse_gres_gpus(value: str) -> int | None:
    """The GPUs per node in a ``--gres`` list, or ``None`` if it names no ``gpu``.

    Each entry is ``[gres:]name[[:type]:count]``, the count 1 when left out. As in Slurm, the
    ``X`` of ``gpu:X`` is a count if it starts with a digit and a type otherwise, so
    ``gpu:tesla`` is one GPU of type tesla.
    """
    total = None
    for entry in value.split(","):
        fields = entry.split(":")
        if fields[0] == "gres":
            del fields[0]
        if fields[:1] != ["gpu"]:
            continue  # another resource (tmpfs, mps, ...) or "none"
        match fields[1:]:
            case []:
                count = "1"
            case [count] if count[:1].isdigit():
                pass
            case [type_] if type_:
                count = "1"
            case [type_, count] if type_:
                pass
            case _:
                count = ""
        if not _COUNT.fullmatch(count):
            raise UsageError(f"invalid --gres value {value!r}: expected gpu[:type][:count]")
        total = (total or 0) + int(count)
    return total


_PLAIN_WORD = re.compile(r"[A-Za-z0-9_./:=,%@+-]+")


def quote_directive_word(token: str) -> str:
    """Quote one word for an ``#SBATCH`` line so that sbatch reads back exactly ``token``.

    sbatch reads a backslash as an escape even inside single quotes, so ``shlex.quote`` is
    wrong here: words are double-quoted with ``\\`` and ``"`` escaped (plain words stay as
    they are). A word that starts with ``:`` is quoted too: sbatch refuses an unquoted one
    ("unexpected ':'", as :func:`read_directives` does). Inverse of :func:`read_directives`
    (property-tested).
    """
    if _PLAIN_WORD.fullmatch(token) and not token.startswith(":"):
        return token
    return '"' + re.sub(r'(["\\])', r"\\\1", token) + '"'
