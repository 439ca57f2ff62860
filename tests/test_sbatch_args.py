"""Tests for hpcsched.job.sbatch_args: splitting hpcsub's command line, #SBATCH directives, geometry."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcsched.job.sbatch_args import (
    _LONG_OPTIONS,
    _SHORT_OPTIONS,
    Geometry,
    HpcsubArgs,
    UsageError,
    _Value,
    geometry,
    quote_directive_word,
    read_directives,
    split_argv,
)

FLAGS = frozenset({"print-script", "record-samples"})


def split(*argv: str) -> HpcsubArgs:
    return split_argv(list(argv), hpcsched_flags=FLAGS)


# --------------------------------------------------------------------------------------------
# split_argv
# --------------------------------------------------------------------------------------------


class TestSplitArgv:
    def test_plain(self):
        assert split("-N", "2", "--gres=gpu:4", "train.py", "--lr", "0.1") == HpcsubArgs(
            sbatch_args=("-N", "2", "--gres=gpu:4"),
            hpcsched_opts=(),
            script="train.py",
            script_args=("--lr", "0.1"),
        )

    def test_everything_after_the_script_belongs_to_it(self):
        args = split("train.py", "-N", "3", "--hpcsched-max-nodes=4", "--", "--bogus")
        assert args.script == "train.py"
        assert args.script_args == ("-N", "3", "--hpcsched-max-nodes=4", "--", "--bogus")
        assert args.sbatch_args == () and args.hpcsched_opts == ()

    def test_combined_short_flags(self):
        args = split("-QH", "-vvQ", "train.py")
        assert args.sbatch_args == ("-QH", "-vvQ") and args.script == "train.py"

    def test_combined_flags_ending_in_an_option_with_a_value(self):
        assert split("-QHN2", "train.py").sbatch_args == ("-QHN2",)
        assert split("-QHN", "2", "train.py").sbatch_args == ("-QHN", "2")

    def test_attached_short_values(self):
        args = split("-N2", "-pgpu", "-t1:00:00", "train.py")
        assert args.sbatch_args == ("-N2", "-pgpu", "-t1:00:00") and args.script == "train.py"

    def test_separate_values_are_taken_whatever_they_look_like(self):
        args = split("-J", "-N", "--comment", "--", "-o", "--hpcsched-x=1", "train.py")
        assert args.sbatch_args == ("-J", "-N", "--comment", "--", "-o", "--hpcsched-x=1")
        assert args.hpcsched_opts == () and args.script == "train.py"

    def test_long_options_with_equals_and_separate_values(self):
        args = split("--nodes=2", "--partition", "gpu", "--gres", "gpu:4", "train.py")
        assert args.sbatch_args == ("--nodes=2", "--partition", "gpu", "--gres", "gpu:4")
        assert args.script == "train.py"

    def test_flags_take_no_value(self):
        args = split("--requeue", "--parsable", "-Q", "-H", "-v", "train.py", "x")
        assert args.sbatch_args == ("--requeue", "--parsable", "-Q", "-H", "-v")
        assert args.script == "train.py" and args.script_args == ("x",)

    def test_unique_prefix_abbreviations(self):
        args = split("--ntasks-per-no", "4", "--part", "gpu", "--pars", "--exclus", "train.py")
        assert args.sbatch_args == ("--ntasks-per-no", "4", "--part", "gpu", "--pars", "--exclus")
        assert args.script == "train.py"

    def test_an_exact_name_wins_over_longer_names(self):
        # --mem is also a prefix of --mem-bind, --mem-per-cpu and --mem-per-gpu.
        assert split("--mem", "4G", "train.py").script == "train.py"
        assert split("--wait", "train.py").script == "train.py"  # --wait-all-nodes takes a value

    @pytest.mark.parametrize("prefix, names", [
        ("--nod", "--nodefile, --nodelist, --nodes"),
        ("--clus", "--cluster, --cluster-constraint, --clusters"),
        ("--wai", "--wait, --wait-all-nodes"),
    ])
    def test_an_ambiguous_prefix_is_an_error(self, prefix, names):
        with pytest.raises(UsageError, match=f"^ambiguous sbatch option {prefix} \\(could be {names}\\)$"):
            split(prefix, "2", "train.py")

    @pytest.mark.parametrize("option", ["--exclusive", "--get-user-env", "--nice", "--propagate",
                                        "--no-kill", "-k"])
    def test_an_optional_value_is_never_the_next_argument(self, option):
        args = split(option, "train.py", "a")
        assert args.sbatch_args == (option,)
        assert args.script == "train.py" and args.script_args == ("a",)

    @pytest.mark.parametrize("option", ["--exclusive=user", "--nice=-5", "--propagate=STACK",
                                        "--get-user-env=10L", "-koff", "--no-kill=off"])
    def test_an_optional_value_with_equals_or_attached(self, option):
        assert split(option, "train.py") == HpcsubArgs((option,), (), "train.py", ())

    def test_kill_on_invalid_dep_needs_a_value(self):
        assert split("--kill-on-invalid-dep", "yes", "train.py").script == "train.py"

    def test_hpcsched_options_interleaved(self):
        args = split("-N", "2", "--hpcsched-max-nodes=4", "--gres=gpu:4", "--hpcsched-min-nodes",
                     "1", "--hpcsched-print-script", "-p", "gpu", "train.py", "--hpcsched-x=1")
        assert args.sbatch_args == ("-N", "2", "--gres=gpu:4", "-p", "gpu")
        assert args.hpcsched_opts == (("max-nodes", "4"), ("min-nodes", "1"), ("print-script", None))
        assert args.script == "train.py" and args.script_args == ("--hpcsched-x=1",)

    def test_an_hpcsched_value_is_taken_whatever_it_looks_like(self):
        assert split("--hpcsched-python", "-N", "train.py").hpcsched_opts == (("python", "-N"),)
        assert split("--hpcsched-x=", "train.py").hpcsched_opts == (("x", ""),)
        assert split("--hpcsched-x=a=b", "train.py").hpcsched_opts == (("x", "a=b"),)

    def test_an_hpcsched_option_at_the_end_without_its_value(self):
        with pytest.raises(UsageError, match="^--hpcsched-max-nodes needs a value$"):
            split("-N", "2", "--hpcsched-max-nodes")

    def test_an_hpcsched_flag_given_a_value(self):
        with pytest.raises(UsageError, match="^--hpcsched-print-script takes no value$"):
            split("--hpcsched-print-script=yes", "train.py")

    def test_an_hpcsched_option_without_a_name(self):
        with pytest.raises(UsageError, match="missing the option name"):
            split("--hpcsched-", "train.py")

    def test_no_script(self):
        assert split() == HpcsubArgs((), (), None, ())
        assert split("-N", "2", "--hpcsched-print-script") == HpcsubArgs(
            ("-N", "2"), (("print-script", None),), None, ())

    def test_double_dash_ends_the_options(self):
        assert split("-N", "2", "--", "--weird-name.py", "-x") == HpcsubArgs(
            ("-N", "2"), (), "--weird-name.py", ("-x",))
        assert split("--", "--hpcsched-x=1") == HpcsubArgs((), (), "--hpcsched-x=1", ())
        assert split("-N", "2", "--") == HpcsubArgs(("-N", "2"), (), None, ())

    def test_a_lone_dash_is_the_script(self):
        assert split("-N", "2", "-", "a") == HpcsubArgs(("-N", "2"), (), "-", ("a",))

    def test_heterogeneous_job_separator_passes_through(self):
        assert split("-N1", ":", "-N2", "train.py").sbatch_args == ("-N1", ":", "-N2")

    def test_a_separator_is_never_a_value(self):
        # sbatch drops every ':' before it looks for the script.
        assert split("-J", ":", "x.sh") == HpcsubArgs(("-J", ":", "x.sh"), (), None, ())
        assert split("--comment", ":", "MARK", "2") == HpcsubArgs(
            ("--comment", ":", "MARK"), (), "2", ())
        assert split("-N1", "--", ":", "a.sh", ":") == HpcsubArgs(("-N1", ":"), (), "a.sh", (":",))
        with pytest.raises(UsageError, match="^sbatch option -J needs a value$"):
            split("-J", ":")

    @pytest.mark.parametrize("argv, message", [
        (["-Z", "train.py"], "unknown sbatch option -Z"),
        (["-QZ", "train.py"], "unknown sbatch option -Z"),
        (["--=x", "train.py"], "an option with no name after '--'"),
        (["--hpcsched", "train.py"], "unknown option --hpcsched (hpcsched's own options are "
                                     "spelled --hpcsched-NAME; see hpcsub --help)"),
        (["--hpcsched_max_nodes=2", "train.py"], "unknown option --hpcsched_max_nodes (hpcsched's "
                                                 "own options are spelled --hpcsched-NAME; see "
                                                 "hpcsub --help)"),
        (["--parsable=1", "train.py"], "sbatch option --parsable takes no value"),
        (["--pars=1", "train.py"], "sbatch option --parsable takes no value"),
        (["-N"], "sbatch option -N needs a value"),
        (["-QN"], "sbatch option -N needs a value"),
        (["--nodes"], "sbatch option --nodes needs a value"),
        (["--ntasks-per-no"], "sbatch option --ntasks-per-node needs a value"),
    ])
    def test_errors(self, argv, message):
        with pytest.raises(UsageError, match=f"^{re.escape(message)}$"):
            split(*argv)


class TestUnknownOptionsPassThrough:
    """Long options not in sbatch 22.05's table go to sbatch as written (issue 34): as
    ``--name=value`` or as a flag; one followed by a word is refused, never guessed."""

    def test_name_equals_value_passes_through(self):
        args = split("--container-image=nvcr.io/nvidia/pytorch:24.01", "-N", "2",
                     "--tres-per-task=gres/gpu:1", "--bogus=", "--x==a b", "train.py", "--lr", "1")
        assert args == HpcsubArgs(
            sbatch_args=("--container-image=nvcr.io/nvidia/pytorch:24.01", "-N", "2",
                         "--tres-per-task=gres/gpu:1", "--bogus=", "--x==a b"),
            hpcsched_opts=(), script="train.py", script_args=("--lr", "1"))

    def test_a_flag_followed_by_an_option_passes_through(self):
        args = split("--container-mount-home", "-N2", "--container-writable",
                     "--hpcsched-max-nodes=4", "--no-container-entrypoint", "--", "train.py")
        assert args == HpcsubArgs(
            sbatch_args=("--container-mount-home", "-N2", "--container-writable",
                         "--no-container-entrypoint"),
            hpcsched_opts=(("max-nodes", "4"),), script="train.py", script_args=())

    def test_a_flag_at_the_end(self):
        assert split("--container-writable") == HpcsubArgs(("--container-writable",), (), None, ())

    def test_an_unknown_option_never_takes_a_separate_value(self):
        # The value of an option hpcsub knows is still taken whatever it looks like.
        assert split("--comment", "--bogus", "train.py").sbatch_args == ("--comment", "--bogus")
        assert split("--bogus", "--comment", "x", "train.py").sbatch_args == (
            "--bogus", "--comment", "x")

    @pytest.mark.parametrize("argv, word", [
        (["--container-image", "img", "train.py"], "img"),
        (["--container-mount-home", "train.py"], "train.py"),
        (["-N", "2", "--bogus", "train.py", "a"], "train.py"),
        (["--bogus", ":", "train.py"], "train.py"),
    ])
    def test_an_unknown_option_followed_by_a_word_is_refused(self, argv, word):
        name = next(a for a in argv if a.startswith("--"))
        with pytest.raises(UsageError) as exc:
            split(*argv)
        assert str(exc.value) == (
            f"{name} {word!r}: hpcsub does not know {name} (it passes such options to sbatch as "
            f"written), so it cannot tell whether {word!r} is its value or the script; write "
            f"{name}=VALUE, or put -- before the script if {name} takes no value")
        assert "\n" not in str(exc.value)

    def test_a_prefix_of_one_known_option_is_still_that_option(self):
        # getopt_long's rule, as before: --part is --partition and takes the next argument.
        assert split("--part", "gpu", "train.py").sbatch_args == ("--part", "gpu")
        assert geometry(["--part", "gpu"]).partition == "gpu"

    def test_unknown_options_in_geometry_are_skipped(self):
        geo = geometry(["--container-image=img", "-N", "2", "--tres-per-task=gres/gpu:4",
                        "--container-writable", "--gres=gpu:4", "--bogus", "7", "-p", "gpu"])
        assert (geo.nodes_min, geo.gpus_per_node, geo.partition) == (2, 4, "gpu")


# --------------------------------------------------------------------------------------------
# The option table
# --------------------------------------------------------------------------------------------


class TestOptionTable:
    def test_spot_checks_against_the_man_page(self):
        assert _LONG_OPTIONS["nodes"] is _Value.REQUIRED and _SHORT_OPTIONS["N"] == "nodes"
        assert _LONG_OPTIONS["gres"] is _Value.REQUIRED
        assert _LONG_OPTIONS["requeue"] is _Value.NONE
        assert _LONG_OPTIONS["parsable"] is _Value.NONE
        assert _LONG_OPTIONS["kill-on-invalid-dep"] is _Value.REQUIRED
        assert _LONG_OPTIONS["export"] is _Value.REQUIRED  # although --help says [=names]
        optional = {n for n, v in _LONG_OPTIONS.items() if v is _Value.OPTIONAL}
        assert optional == {"exclusive", "get-user-env", "nice", "no-kill", "propagate"}
        assert set(_SHORT_OPTIONS) == set("AabDMCScdmexBGhHiJLkFwNnoOspqQtvVW")

    def test_size(self):
        # The 102 long options of sbatch(1) 22.05 plus 4 that the binary accepts undocumented.
        assert len(_LONG_OPTIONS) == 106
        assert {"cluster", "context", "ntasks-per-tres", "tasks-per-node"} <= set(_LONG_OPTIONS)


# --------------------------------------------------------------------------------------------
# Property: split_argv recovers what was put together
# --------------------------------------------------------------------------------------------


def _unique_prefixes(name: str) -> list[str]:
    """Abbreviations of --name that getopt_long resolves to it (the name itself included)."""
    return [name[:k] for k in range(1, len(name) + 1)
            if k == len(name) or [n for n in _LONG_OPTIONS if n.startswith(name[:k])] == [name]]


_SHORT_OF = {long: short for short, long in _SHORT_OPTIONS.items()}
_FLAG_LETTERS = sorted(s for s, n in _SHORT_OPTIONS.items() if _LONG_OPTIONS[n] is _Value.NONE)
_values = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8)


@st.composite
def sbatch_option(draw) -> list[str]:
    """One sbatch option (or a cluster of short flags), in any form getopt accepts, as tokens."""
    name = draw(st.sampled_from(sorted(_LONG_OPTIONS)))
    rule = _LONG_OPTIONS[name]
    short = _SHORT_OF.get(name)
    spelled = "--" + draw(st.sampled_from(_unique_prefixes(name)))
    forms = []
    if rule is _Value.NONE:
        forms += [[spelled]]
        if short:
            forms += [["-" + draw(st.text(st.sampled_from(_FLAG_LETTERS), max_size=3)) + short]]
    elif rule is _Value.REQUIRED:
        value = draw(_values.filter(lambda v: v != ":"))  # sbatch never reads ':' as a value
        forms += [[f"{spelled}={value}"], [spelled, value]]
        if short:
            flags = draw(st.text(st.sampled_from(_FLAG_LETTERS), max_size=2))
            forms += [[f"-{flags}{short}", value]]
            if value:
                forms += [[f"-{flags}{short}{value}"]]
    else:
        forms += [[spelled], [f"{spelled}={draw(_values)}"]]
        if short:
            forms += [[f"-{short}"], [f"-{short}{draw(_values)}"]]
    return draw(st.sampled_from(forms))


# Long options sbatch 22.05 does not have: hpcsub passes them on as written (issue 34).
_unknown_names = st.one_of(
    st.sampled_from(["container-image", "container-mount-home", "tres-per-task", "x11", "segment"]),
    st.from_regex(r"zz[a-z0-9-]{0,8}", fullmatch=True))


@st.composite
def unknown_option(draw, flags: bool) -> list[str]:
    """An unknown long option as ``--name=value`` or, if ``flags``, also as a bare flag."""
    name = draw(_unknown_names)
    forms = [[f"--{name}={draw(_values)}"]] + ([[f"--{name}"]] if flags else [])
    return draw(st.sampled_from(forms))


_hpcsched_names = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)


@st.composite
def hpcsched_option(draw) -> tuple[list[str], tuple[str, str | None]]:
    if draw(st.booleans()):
        name = draw(st.sampled_from(sorted(FLAGS)))
        return [f"--hpcsched-{name}"], (name, None)
    name = draw(_hpcsched_names.filter(lambda n: n not in FLAGS))
    value = draw(_values)
    tokens = draw(st.sampled_from([[f"--hpcsched-{name}={value}"], [f"--hpcsched-{name}", value]]))
    return tokens, (name, value)


_scripts = _values.filter(lambda s: s not in ("", ":") and not s.startswith("-"))
_script_args = st.lists(st.one_of(_values, _values.map(lambda v: "-" + v),
                                  _values.map(lambda v: "--" + v)), max_size=5)


@given(
    parts=st.lists(st.one_of(sbatch_option().map(lambda t: ("sbatch", t)),
                             unknown_option(flags=False).map(lambda t: ("sbatch", t)),
                             st.just(("sbatch", [":"])),  # heterogeneous-job separator
                             hpcsched_option().map(lambda t: ("hpcsched", t))), max_size=8),
    script=st.one_of(_scripts.map(lambda s: [s]),
                     _values.filter(lambda s: s != ":").map(lambda s: ["--", s])),
    script_args=_script_args,
)
@settings(max_examples=400, deadline=None)
def test_split_argv_recovers_the_parts(parts, script, script_args):
    argv, sbatch_args, hpcsched_opts = [], [], []
    for kind, part in parts:
        if kind == "sbatch":
            argv += part
            sbatch_args += part
        else:
            tokens, opt = part
            argv += tokens
            hpcsched_opts.append(opt)
    argv += script + script_args
    assert split_argv(argv, hpcsched_flags=FLAGS) == HpcsubArgs(
        sbatch_args=tuple(sbatch_args),
        hpcsched_opts=tuple(hpcsched_opts),
        script=script[-1],
        script_args=tuple(script_args),
    )


# --------------------------------------------------------------------------------------------
# read_directives
# --------------------------------------------------------------------------------------------


class TestReadDirectives:
    def test_basic(self):
        script = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH -p gpu\npython train.py\n"
        assert read_directives(script) == ("--nodes=2", "-p", "gpu")

    def test_stops_at_the_first_command(self):
        script = ("#!/bin/bash\n#SBATCH -N 2\n\n   \n# a comment\n  # indented comment\n"
                  "#SBATCH -n 8\nexport X=1\n#SBATCH --gres=gpu:4\n")
        assert read_directives(script) == ("-N", "2", "-n", "8")

    def test_an_indented_command_also_stops(self):
        assert read_directives("#!/bin/sh\n#SBATCH -N 2\n  echo x\n#SBATCH -n 3\n") == ("-N", "2")

    def test_several_options_per_line(self):
        script = "#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=4\t--gres gpu:4\n"
        assert read_directives(script) == ("-N", "2", "--ntasks-per-node=4", "--gres", "gpu:4")

    def test_inline_comments(self):
        script = ("#!/bin/bash\n#SBATCH -N 2   # two nodes, -p ignored\n"
                  "#SBATCH --job-name=a#b\n#SBATCH -n 4 #-p x\n")
        assert read_directives(script) == ("-N", "2", "--job-name=a", "-n", "4")

    def test_quotes_and_escapes(self):
        script = ("#!/bin/bash\n"
                  "#SBATCH --comment=\"a b # c\" -J 'x y'\n"
                  "#SBATCH --comment \"say \\\"hi\\\"\" --wckey=a\\#b\n"
                  "#SBATCH -J a\"b c\"d\n")
        assert read_directives(script) == ("--comment=a b # c", "-J", "x y", "--comment",
                                           'say "hi"', "--wckey=a#b", "-J", "ab cd")

    def test_an_escaped_space_still_ends_the_word_as_in_sbatch(self):
        with pytest.raises(UsageError, match="'b' is not an sbatch option"):
            read_directives("#!/bin/bash\n#SBATCH -J a\\ b\n")

    def test_directives_must_start_in_the_first_column(self):
        script = "#!/bin/bash\n  #SBATCH -N 3\n#sbatch -N 4\n# SBATCH -N 5\n#SBATCH -n 1\n"
        assert read_directives(script) == ("-n", "1")

    def test_old_slurm_spelling(self):
        assert read_directives("#!/bin/bash\n#SLURM -N 2\n") == ("-N", "2")

    def test_no_directives(self):
        assert read_directives("") == ()
        assert read_directives("#!/usr/bin/env python\nimport torch\n") == ()
        assert read_directives("import os\n#SBATCH -N 2\n") == ()

    def test_a_python_script(self):
        script = ('#!/usr/bin/env python3\n# -*- coding: utf-8 -*-\n#SBATCH --gres=gpu:2\n'
                  '"""Docstring."""\n#SBATCH -N 8\n')
        assert read_directives(script) == ("--gres=gpu:2",)

    def test_crlf_line_ends(self):
        assert read_directives("#!/bin/bash\r\n#SBATCH -N 2\r\n") == ("-N", "2")

    def test_the_lines_form_one_argument_list(self):
        # As in sbatch, a value can come from the next line.
        assert read_directives("#!/bin/bash\n#SBATCH -J\n#SBATCH -N\n") == ("-J", "-N")

    def test_an_empty_word_ends_its_line_as_in_sbatch(self):
        assert read_directives('#!/bin/bash\n#SBATCH --comment "" -N 3\n#SBATCH x\n') == (
            "--comment", "x")

    def test_unknown_options_are_kept_as_written(self):
        script = ("#!/bin/bash\n#SBATCH --container-image=nvcr.io/x:1 -N 2\n"
                  "#SBATCH --container-mount-home\n#SBATCH --tres-per-task gres/gpu:4 -p gpu\n"
                  "#SBATCH --container-mounts\n#SBATCH /data:/data\n#SBATCH --bogus\n")
        directives = read_directives(script)
        assert directives == ("--container-image=nvcr.io/x:1", "-N", "2", "--container-mount-home",
                              "--tres-per-task", "gres/gpu:4", "-p", "gpu", "--container-mounts",
                              "/data:/data", "--bogus")
        # the word after an unknown option is its value; what hpcsub reads is read as before
        geo = geometry(directives)
        assert (geo.nodes_min, geo.partition, geo.gpus_per_node) == (2, "gpu", None)

    def test_hetjob_separator(self):
        script = "#!/bin/bash\n#SBATCH -N 2\n#SBATCH HetJob -n 3\n#SBATCH -N 1\n#SBATCH packjob\n"
        assert read_directives(script) == ("-N", "2", ":", "-N", "1", ":")

    @pytest.mark.parametrize("line, message", [
        ("#SBATCH --comment=\"open", 'script line 2: unmatched " in #SBATCH line'),
        ("#SBATCH -N 2 'open", "script line 2: unmatched ' in #SBATCH line"),
        ("#SBATCH : -N 2", "script line 2: unexpected ':' in #SBATCH line"),
        ("#SBATCH -N 2 hetjob", "script line 2: 'hetjob' must start its #SBATCH line"),
        ("#SBATCH --hpcsched-max-nodes=4", "invalid #SBATCH directive: --hpcsched-max-nodes: "
                                           "hpcsched's options are read from the hpcsub command "
                                           "line only, not from #SBATCH lines"),
        ("#SBATCH --hpcsched", "invalid #SBATCH directive: unknown option --hpcsched (hpcsched's "
                               "own options are spelled --hpcsched-NAME; see hpcsub --help)"),
        ("#SBATCH --bogus a b", "invalid #SBATCH directive: 'b' is not an sbatch option"),
        ("#SBATCH -Z", "invalid #SBATCH directive: unknown sbatch option -Z"),
        ("#SBATCH --nod=2", "invalid #SBATCH directive: ambiguous sbatch option --nod "
                            "(could be --nodefile, --nodelist, --nodes)"),
        ("#SBATCHX -N 2", "invalid #SBATCH directive: 'X' is not an sbatch option"),
        ("#SBATCH -N 2 3", "invalid #SBATCH directive: '3' is not an sbatch option"),
        ("#SBATCH -N 2 -- -n 3", "invalid #SBATCH directive: '-n' is not an sbatch option"),
        ("#SBATCH -N", "invalid #SBATCH directive: sbatch option -N needs a value"),
        ("#SBATCH --parsable=yes", "invalid #SBATCH directive: sbatch option --parsable takes no value"),
    ])
    def test_errors(self, line, message):
        with pytest.raises(UsageError, match=f"^{re.escape(message)}$"):
            read_directives(f"#!/bin/bash\n{line}\n")


@pytest.mark.parametrize("token, written", [
    (":0", '":0"'),            # unquoted, sbatch refuses it: "unexpected ':'"
    ("a:0", "a:0"),            # a colon inside a word is plain
    ("gpu:4", "gpu:4"),
])
def test_a_word_starting_with_a_colon_is_quoted_and_read_back(token, written):
    # found by the property test below: --acco :0 was written unquoted and read back as an error
    assert quote_directive_word(token) == written
    assert read_directives(f"#!/bin/bash\n#SBATCH --account {written}\n") == ("--account", token)


_directive_safe = st.one_of(sbatch_option(), unknown_option(flags=True)).filter(
    lambda tokens: all(t and "\n" not in t and t.lower() not in ("hetjob", "packjob") for t in tokens))


@given(
    options=st.lists(_directive_safe, max_size=6),
    breaks=st.lists(st.sampled_from(["", "  ", "# a comment", "#", "  # indented #SBATCH -N 9"]),
                    max_size=6),
    data=st.data(),
)
@settings(deadline=None)
def test_read_directives_recovers_quoted_options(options, breaks, data):
    tokens = [t for option in options for t in option]
    lines = ["#!/bin/bash"]
    i = 0
    while i < len(tokens):  # random numbers of words per line, comments in between
        n = data.draw(st.integers(1, 3))
        lines.append("#SBATCH " + " ".join(quote_directive_word(t) for t in tokens[i:i + n])
                     + data.draw(st.sampled_from(["", "  # trailing comment", "\t"])))
        if breaks:
            lines.append(breaks.pop())
        i += n
    lines += ["srun python train.py", "#SBATCH --nodes=99"]
    assert read_directives("\n".join(lines)) == tuple(tokens)


# --------------------------------------------------------------------------------------------
# geometry
# --------------------------------------------------------------------------------------------


class TestGeometry:
    def test_nothing(self):
        assert geometry() == geometry([]) == Geometry(
            nodes_min=None, nodes_max=None, gpus_per_node=None, gpus_total=None, ntasks=None,
            ntasks_per_node=None, array=None, partition=None, parsable=False, wait=False,
            test_only=False)

    @pytest.mark.parametrize("args, low, high", [
        (["-N", "2"], 2, 2),
        (["-N2"], 2, 2),
        (["--nodes=3"], 3, 3),
        (["--nodes", "2-4"], 2, 4),
        (["-N", "2-4"], 2, 4),
        (["--nodes=1-1"], 1, 1),
        (["-QN4"], 4, 4),
    ])
    def test_nodes(self, args, low, high):
        geo = geometry(args)
        assert (geo.nodes_min, geo.nodes_max) == (low, high)

    @pytest.mark.parametrize("gres, gpus", [
        ("gpu:4", 4),
        ("gpu:tesla:2", 2),
        ("gpu", 1),
        ("gpu:tesla", 1),  # Slurm: a type without a count means one
        ("gpu:v100:2,tmpfs:1", 2),
        ("tmpfs:1,gpu:3", 3),
        ("gpu:v100:2,gpu:k80:1", 3),
        ("gres:gpu:2", 2),
        ("gpu:0", 0),
        ("tmpfs:1", None),
        ("mps:100", None),
        ("none", None),
    ])
    def test_gres(self, gres, gpus):
        assert geometry([f"--gres={gres}"]).gpus_per_node == gpus
        assert geometry(["--gres", gres]).gpus_per_node == gpus

    @pytest.mark.parametrize("args, gpus", [
        (["--gpus-per-node=4"], 4),
        (["--gpus-per-node", "a100:8"], 8),
        (["--gpus-per-no=2"], 2),
        (["--gpus-per-node=v100:1,a100:2"], 3),
    ])
    def test_gpus_per_node(self, args, gpus):
        assert geometry(args).gpus_per_node == gpus

    @pytest.mark.parametrize("args, gpus", [
        (["-G", "8"], 8), (["-G8"], 8), (["--gpus=a100:16"], 16), (["--gpus", "2"], 2),
    ])
    def test_gpus_total(self, args, gpus):
        geo = geometry(args)
        assert geo.gpus_total == gpus and geo.gpus_per_node is None

    def test_tasks_array_partition_and_flags(self):
        geo = geometry(["-n8", "--ntasks-per-node", "4", "-a", "1-3%1", "-pgpu", "--parsable",
                        "-W", "--test-only"])
        assert (geo.ntasks, geo.ntasks_per_node, geo.array, geo.partition) == (8, 4, "1-3%1", "gpu")
        assert geo.parsable and geo.wait and geo.test_only

    def test_long_forms_and_aliases(self):
        geo = geometry(["--ntasks=2", "--tasks-per-node=2", "--array=0-9", "--partition=a",
                        "--wait", "--test"])
        assert (geo.ntasks, geo.ntasks_per_node, geo.array, geo.partition) == (2, 2, "0-9", "a")
        assert geo.wait and geo.test_only and not geo.parsable

    def test_flags_combined_with_a_value(self):
        geo = geometry(["-WQp", "gpu"])
        assert geo.wait and geo.partition == "gpu"

    def test_values_that_merely_look_like_options_are_not_read_as_options(self):
        assert geometry(["--comment", "--parsable", "-J", "-N5"]) == Geometry()

    def test_the_command_line_overrides_the_directives(self):
        directives = read_directives("#!/bin/bash\n#SBATCH -N 2 --gres=gpu:2 -p small -n 4\n")
        geo = geometry(directives, ["--nodes=4", "--gres=gpu:8", "--partition=big"])
        assert (geo.nodes_min, geo.nodes_max, geo.gpus_per_node, geo.partition, geo.ntasks) == (
            4, 4, 8, "big", 4)

    def test_a_later_gres_without_gpus_replaces_one_with(self):
        assert geometry(["--gres=gpu:4"], ["--gres=tmpfs:1"]).gpus_per_node is None

    def test_gres_and_gpus_per_node_together(self):
        assert geometry(["--gres=gpu:4", "--gpus-per-node=4"]).gpus_per_node == 4
        with pytest.raises(UsageError, match="--gres asks for 4 GPUs per node but "
                                             "--gpus-per-node for 8"):
            geometry(["--gres=gpu:4"], ["--gpus-per-node=8"])

    def test_a_heterogeneous_job_is_refused(self):
        with pytest.raises(UsageError, match="heterogeneous jobs"):
            geometry(["-N1", ":", "-N2"])
        with pytest.raises(UsageError, match="heterogeneous jobs"):
            geometry(read_directives("#!/bin/bash\n#SBATCH -N1\n#SBATCH hetjob\n#SBATCH -N2\n"))

    def test_an_argument_that_is_not_an_option(self):
        with pytest.raises(UsageError, match="^'train.py' is not an sbatch option$"):
            geometry(["-N", "2", "train.py"])

    @pytest.mark.parametrize("args, option", [
        (["--nodes=abc"], "--nodes"),
        (["-N", ""], "--nodes"),
        (["-N", "4-2"], "--nodes"),
        (["-N", "2-"], "--nodes"),
        (["-N", "1,4"], "--nodes"),
        (["--gres=gpu:v100:x"], "--gres"),
        (["--gres=gpu:"], "--gres"),
        (["--gres=gpu:2k"], "--gres"),
        (["--gres=gpu:1.5"], "--gres"),
        (["--gres=gpu:a:2:3"], "--gres"),
        (["--gres=gpu::2"], "--gres"),
        (["--gres=tmpfs:1,gpu:x:y"], "--gres"),
        (["--gpus-per-node=tesla"], "--gpus-per-node"),
        (["--gpus-per-node=x:y"], "--gpus-per-node"),
        (["--gpus-per-node=:2"], "--gpus-per-node"),
        (["--gpus-per-node=a:b:2"], "--gpus-per-node"),
        (["--gpus-per-node="], "--gpus-per-node"),
        (["-G", "many"], "--gpus"),
        (["-n", "0"], "--ntasks"),
        (["-n", "x"], "--ntasks"),
        (["--ntasks-per-node=0"], "--ntasks-per-node"),
        (["--tasks-per-node=3x"], "--tasks-per-node"),
    ])
    def test_malformed_values_name_the_option(self, args, option):
        with pytest.raises(UsageError, match=f"^invalid {option} value "):
            geometry(args)


# --------------------------------------------------------------------------------------------
# Against the real sbatch, where it is 22.05
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_sbatch(tmp_path_factory):
    """Run the installed sbatch with a throwaway slurm.conf; nothing here reaches a controller.

    Every call fails while sbatch reads its options or opens the script, before it would try to
    submit. Skips unless sbatch is Slurm 22.05, the release the option table describes.
    """
    exe = shutil.which("sbatch")
    if exe is None:
        pytest.skip("no sbatch on PATH")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=probe\nSlurmctldHost=localhost\n"
                    "NodeName=localhost CPUs=1 State=UNKNOWN\n"
                    "PartitionName=debug Nodes=localhost Default=YES\n")
    env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(conf)}

    def run(*argv: str) -> str:
        proc = subprocess.run([exe, *argv], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=20)
        return proc.stdout + proc.stderr

    version = run("--version")
    if not version.startswith("slurm") or " 22.05." not in f" {version.split()[-1]}":
        pytest.skip(f"sbatch is not Slurm 22.05: {version.strip()[:80]!r}")
    return run


def test_the_table_matches_sbatchs_getopt(real_sbatch):
    for name, rule in _LONG_OPTIONS.items():
        # Alone, an option that needs a value fails in getopt (the others print help, or find
        # no script on stdin); given a value, one that takes none fails there, and the unknown
        # option after it makes getopt fail for all the others.
        alone = real_sbatch(f"--{name}")
        with_value = real_sbatch(f"--{name}=1", "--zz-not-an-option")
        assert f"unrecognized option '--{name}" not in alone + with_value, name
        assert (f"option '--{name}' requires an argument" in alone) == (rule is _Value.REQUIRED), name
        assert (f"option '--{name}' doesn't allow an argument" in with_value) == (
            rule is _Value.NONE), name
    for letter in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ":
        out = real_sbatch(f"-{letter}")
        known = f"invalid option -- '{letter}'" not in out
        assert known == (letter in _SHORT_OPTIONS), letter
        if known:
            required = _LONG_OPTIONS[_SHORT_OPTIONS[letter]] is _Value.REQUIRED
            assert (f"option requires an argument -- '{letter}'" in out) == required, letter


@pytest.mark.parametrize("argv", [
    ["--exclusive", "MARK", "-N", "2"],
    ["--exclusive=user", "MARK"],
    ["-QHN2", "MARK", "x"],
    ["-pdebug", "-N", "1", "MARK"],
    ["--ntasks-per-no", "2", "--part", "debug", "MARK"],
    ["-k", "MARK"],
    ["--nice", "MARK"],
    ["--nice=-5", "MARK"],
    ["--get-user-env", "MARK"],
    ["--propagate", "MARK"],
    ["-J", "-N", "MARK", "-J"],
    ["--comment", "--", "MARK"],
    ["-N", "1", "--", "MARK", "--bogus"],
    ["-N1", ":", "-N2", "MARK"],
    ["--requeue", "--parsable", "-v", "MARK", "-N"],
    ["--comment", ":", "x", "MARK"],
    ["-J", ":", "-N", "MARK", "2"],
    ["-N1", "--", ":", "MARK"],
])
def test_split_argv_finds_the_script_sbatch_finds(real_sbatch, argv):
    # sbatch reports the file it could not open (-Q would hide that).
    assert split_argv(argv).script == "MARK"
    assert "Unable to open file MARK" in real_sbatch(*argv)


def test_ambiguous_prefixes_agree_with_sbatch(real_sbatch):
    for prefix in ("nod", "clus", "wai", "mem-", "gpus-per-"):
        assert "is ambiguous" in real_sbatch(f"--{prefix}=1")
        with pytest.raises(UsageError, match="ambiguous"):
            split_argv([f"--{prefix}=1", "x"])
