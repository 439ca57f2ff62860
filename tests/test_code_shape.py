"""The code's shape (issue 32): no function or method of ``hpcsched/**/*.py`` has a cyclomatic
complexity over 15, no class spans over 300 lines and no module over 600 physical lines, as
radon measures them. A function that outgrows the limit is split along a real seam (a helper
naming one step, a table instead of an if-chain, a module for one concern), not waived here.

radon is a dev dependency (setup.cfg's ``dev`` extra): without it the test fails, it does not
skip."""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_visit
from radon.visitors import Class

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hpcsched"

MAX_COMPLEXITY = 15   # radon's cyclomatic complexity of one function or method
MAX_CLASS_LINES = 300   # a class statement's lines, first to last
MAX_MODULE_LINES = 600   # a module's physical lines


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _blocks(blocks, seen=None):
    """Every block radon found, once each, depth first: each class, its methods and inner
    classes, and each function's closures (radon counts a closure apart from the function
    around it; ``cc_visit`` lists a class's methods beside the class as well)."""
    seen = set() if seen is None else seen
    for block in blocks:
        key = (type(block).__name__, block.lineno, block.name)
        if key in seen:
            continue
        seen.add(key)
        yield block
        if isinstance(block, Class):
            yield from _blocks(list(block.methods) + list(block.inner_classes), seen)
        else:
            yield from _blocks(block.closures, seen)


def _offenders() -> list[str]:
    """One line ``file: kind name value (limit)`` for each function, class or module over its
    limit, over every module of the package."""
    out = []
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            out.append(f"{rel}: module {lines} lines (limit {MAX_MODULE_LINES})")
        for block in _blocks(cc_visit(text)):
            if isinstance(block, Class):
                span = block.endline - block.lineno + 1
                if span > MAX_CLASS_LINES:
                    out.append(f"{rel}:{block.lineno}: class {block.name} {span} lines "
                               f"(limit {MAX_CLASS_LINES})")
            elif block.complexity > MAX_COMPLEXITY:
                out.append(f"{rel}:{block.lineno}: function {block.fullname} complexity "
                           f"{block.complexity} (limit {MAX_COMPLEXITY})")
    return out


def test_package_is_found():
    assert len(_modules()) > 50, PACKAGE


def test_no_function_class_or_module_over_its_limit():
    offenders = _offenders()
    assert not offenders, "over the code-shape limits:\n" + "\n".join(offenders)
