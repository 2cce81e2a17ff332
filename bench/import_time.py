"""Time of ``import tether`` in a fresh interpreter, against ``import json`` as a baseline (DESIGN 13).

Each figure is the median of 15 fresh processes; it also lists which heavy modules the import pulled in
(none of typer, rich, a provider SDK or a database driver should be there). With ``--tree`` (repeatable)
each source tree is imported through PYTHONPATH instead, the trees taking turns process by process, so
a busy machine slows them alike:

    python bench/import_time.py
    python bench/import_time.py --tree /tmp/before/src --tree src --runs 31
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

PROBE = (
    "import time, sys; t = time.perf_counter(); import {module}; "
    "print(time.perf_counter() - t); "
    "print(','.join(m for m in ('typer', 'rich', 'anthropic', 'openai', 'psycopg', 'httpx') if m in sys.modules))"
)


def _once(module: str, tree: Path | None) -> tuple[float, str]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd="/",
    ).stdout.split("\n")
    return float(out[0]), out[1]


def measure(module: str, runs: int = 15) -> tuple[float, str]:
    """Median seconds to import ``module`` in a new interpreter, and the heavy modules it loaded."""
    times, loaded = [], ""
    for _ in range(runs):
        elapsed, loaded = _once(module, None)
        times.append(elapsed)
    return statistics.median(times), loaded


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tree", action="append", help="a src/ folder holding tether (repeat to compare)")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    if not args.tree:
        tether_s, loaded = measure("tether", args.runs)
        json_s, _ = measure("json", args.runs)
        print(f"import tether: {tether_s * 1e3:6.1f} ms (budget 100 ms)")
        print(f"import json:   {json_s * 1e3:6.1f} ms (baseline)")
        print(f"heavy modules loaded by import tether: {loaded or 'none'}")
        return 0
    trees = [Path(t).resolve() for t in args.tree]
    times: dict[Path | None, list[float]] = {tree: [] for tree in [None, *trees]}
    loaded: dict[Path, str] = {}
    for _ in range(args.runs):
        times[None].append(_once("json", None)[0])
        for tree in trees:
            elapsed, loaded[tree] = _once("tether", tree)
            times[tree].append(elapsed)
    print(f"python {sys.version.split()[0]}; {args.runs} fresh processes each, interleaved")
    print(f"{'import':60}  {'median ms':>9}  {'min ms':>7}  heavy modules")
    print(
        f"{'json (baseline)':60}  {statistics.median(times[None]) * 1e3:9.1f}  {min(times[None]) * 1e3:7.1f}"
    )
    for tree in trees:
        median, low = statistics.median(times[tree]) * 1e3, min(times[tree]) * 1e3
        print(f"{'tether from ' + str(tree):60}  {median:9.1f}  {low:7.1f}  {loaded[tree] or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
