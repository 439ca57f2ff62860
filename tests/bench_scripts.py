"""The benchmark scripts (``benchmarks/*.py``) as modules, for the tests of their pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: the benchmarks' folder (put on ``sys.path``: the scripts import their ``_helpers``)
BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def load(script: str) -> ModuleType:
    """``benchmarks/<script>.py`` imported as the module ``<script>_script`` (registered in
    ``sys.modules``, where its dataclasses look their module up)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    name = f"{script}_script"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{script}.py")
    assert spec is not None and spec.loader is not None, script
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
