"""docs/training-api.md shows the diff that makes the plain DDP example elastic: it must be the
diff of the two files as they are (so neither can change without the other), and stay small."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLAIN = "jobscripts/examples/ddp_classifier_plain.py"
ELASTIC = "jobscripts/examples/ddp_classifier.py"


def _documented() -> str:
    text = (ROOT / "docs" / "training-api.md").read_text()
    blocks = re.findall(r"```diff\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1, "docs/training-api.md should hold one diff block"
    return blocks[0]


@pytest.mark.skipif(shutil.which("diff") is None, reason="needs diff(1)")
def test_the_documented_diff_is_the_diff_of_the_two_examples():
    proc = subprocess.run(["diff", "-u", "--label", PLAIN, "--label", ELASTIC, PLAIN, ELASTIC],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert _documented() == proc.stdout, (
        "docs/training-api.md's diff is out of date; regenerate it with: diff -u --label "
        f"{PLAIN} --label {ELASTIC} {PLAIN} {ELASTIC}")


def test_the_diff_is_about_ten_lines():
    changed = [ln for ln in _documented().splitlines()
               if ln[:1] in "+-" and not ln.startswith(("+++", "---")) and ln[1:].strip()]
    removed = sum(ln.startswith("-") for ln in changed)
    added = len(changed) - removed
    assert removed <= 12 and added <= 12, (removed, added)
