"""Time of ``import tether`` in a fresh interpreter, against ``import json`` as a baseline (DESIGN 13).

Each figure is the median of 15 fresh processes; it also lists which heavy modules the import pulled in
(none of typer, rich, a provider SDK or a database driver should be there).

    python bench/import_time.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys

PROBE = (
    "import time, sys; t = time.perf_counter(); import {module}; "
    "print(time.perf_counter() - t); "
    "print(','.join(m for m in ('typer', 'rich', 'anthropic', 'openai', 'psycopg', 'httpx') if m in sys.modules))"
)


def measure(module: str, runs: int = 15) -> tuple[float, str]:
    """Median seconds to import ``module`` in a new interpreter, and the heavy modules it loaded."""
    times, loaded = [], ""
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", PROBE.format(module=module)], capture_output=True, text=True, check=True
        ).stdout.split("\n")
        times.append(float(out[0]))
        loaded = out[1]
    return statistics.median(times), loaded


def main() -> int:
    tether_s, loaded = measure("tether")
    json_s, _ = measure("json")
    print(f"import tether: {tether_s * 1e3:6.1f} ms (budget 150 ms)")
    print(f"import json:   {json_s * 1e3:6.1f} ms (baseline)")
    print(f"heavy modules loaded by import tether: {loaded or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
