"""The layers of docs/architecture.md hold in the code: every module-level import of an
hpcsched package is in its "may import" column, and the packages' dependencies have no cycle.
An import inside a function or under ``TYPE_CHECKING`` is not a dependency of the layer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hpcsched"


def allowed() -> dict[str, set[str]]:
    """``package -> packages it may import`` from the table's rows, in their order
    (``everything above``: every package of an earlier row)."""
    table: dict[str, set[str]] = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        m = re.match(r"\| `hpcsched/(\w+)/` \|.*\| (.*) \|$", line)
        if not m:
            continue
        pkg, col = m.groups()
        if col.startswith("everything above"):
            table[pkg] = set(table)
        else:
            table[pkg] = {t.split(".")[0].split("/")[0] for t in re.findall(r"`([\w./]+)`", col)
                          if (PACKAGE / t.split(".")[0]).is_dir()}
    return table


def imports(path: Path) -> set[str]:
    """The hpcsched packages ``path`` imports at module level (not in functions, not under an
    ``if`` such as ``TYPE_CHECKING``)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                     if node.module == "hpcsched"]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for n in names:
            parts = n.split(".")
            if parts[0] == "hpcsched" and len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
                out.add(parts[1])
    return out


def test_the_table_lists_every_package():
    packages = {p.name for p in PACKAGE.iterdir()
                if p.is_dir() and (p / "__init__.py").exists() and p.name != "data"}
    assert set(allowed()) == packages


def test_every_import_is_allowed_by_the_architecture():
    table = allowed()
    wrong = []
    for pkg, may in table.items():
        for f in sorted((PACKAGE / pkg).rglob("*.py")):
            for used in imports(f) - may - {pkg}:
                wrong.append(f"{f.relative_to(ROOT)} imports hpcsched.{used}")
    assert not wrong, "\n".join(wrong)


def test_the_layers_have_no_cycle():
    uses = {pkg: set().union(*(imports(f) for f in (PACKAGE / pkg).rglob("*.py"))) - {pkg}
            for pkg in allowed()}
    seen, done = set(), set()

    def visit(pkg, path):
        assert pkg not in seen or pkg in done, f"import cycle: {' -> '.join(path + [pkg])}"
        if pkg in done:
            return
        seen.add(pkg)
        for dep in sorted(uses.get(pkg, ())):
            visit(dep, path + [pkg])
        done.add(pkg)

    for pkg in uses:
        visit(pkg, [])
