"""What every benchmark writes: its figures plus when and where they were measured."""

from __future__ import annotations

import json
import os
import platform
import re
import time
from pathlib import Path


def write_report(out: Path, benchmark: str, **figures) -> None:
    """Write ``figures`` as JSON to ``out`` with the benchmark's name, time and machine."""
    doc = {"benchmark": benchmark, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, **figures}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


def rss_mib() -> float:
    """This process's resident set (``VmRSS``), MiB."""
    text = Path("/proc/self/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+)", text, re.M).group(1)) / 1024
