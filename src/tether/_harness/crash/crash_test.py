"""The crash-injection harness: prove that an agent survives a crash at every journal boundary (DESIGN 14).

``crash_test(agent_factory, prompt, store_url=...)`` runs a scenario once in a child process to count its
journal boundaries (the appends after each run's creation, the subagent runs' included), then, for every
boundary and every failpoint (``before_append``, ``after_append``, ``torn_append``), runs the scenario again
in a fresh child process that is killed with SIGKILL right there, resumes the run in new child processes
until it ends, and checks, for the run and each of its subagent runs:

- the run ends (``completed``, ``failed``, ``cancelled``, ``stopped``, or ``waiting`` for a person);
- no ``unsafe`` call executed more than once;
- every ``idempotent`` or ``read_only`` call saw a single idempotency key;
- every execution had a durable ``tool_started`` (same call, attempt and key), and no attempt ran twice;
- the journal loads and folds (``store.load``), after the crash and at the end;
- no model request carried a call without its result.

Every child builds the agent from the same ``agent_factory`` (``module:attribute`` or
``path/file.py:attribute``, naming an ``Agent`` or a zero-argument callable returning one), points it at the
store, and wraps each tool (its subagents' too) so that every execution is recorded (run id, call id,
attempt, idempotency key, effect, pid, start and end) in a side file outside the store: "ran once" is judged
there, never from the journal alone. A tool whose work happens elsewhere (a forked process, a remote job)
can record that work itself with ``record_execution(ctx, effect)``; those records are judged separately from
the automatic ones. The model is wrapped too: each request is checked for calls without results before it
is sent, and the store, so the uncrashed run's appends are known in the order the process made them.

A run without subagents is failed by seq (``TETHER_FAILPOINT=POINT:SEQ``); in a tree a seq names an append
in every run, so the boundary is named by its first entry's kind and occurrence (``POINT:KIND#N``).

The children start fast: a fork server (a ``python -c`` process that has imported tether and nothing of
the agent's code) forks each one, which then imports the agent's code and runs ``_child_main``; with
``fresh_interpreter=True`` each child is a new ``python -c`` interpreter instead. The parent never builds
the agent.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ... import journal as j
from ...stores import open_store
from .checks import ENDS, _boundaries, _Boundary, _describe, _records
from .checks import judge as judge
from .child import LOG_ENV, load_agent, record_execution
from .child import _instrument as _instrument
from .child import calls_without_result as calls_without_result
from .runner import _Setup

__all__ = [
    "ENDS",
    "LOG_ENV",
    "POINTS",
    "CrashCase",
    "CrashReport",
    "InvariantViolation",
    "crash_test",
    "load_agent",
    "record_execution",
]

POINTS: tuple[str, ...] = ("before_append", "after_append", "torn_append")
"""The failpoints of DESIGN 14, in the order the report lists them."""

_SHORT = {"before_append": "b", "after_append": "a", "torn_append": "t"}


# --------------------------------------------------------------------------------------------------
# The report


@dataclass(slots=True)
class CrashCase:
    """One case: the scenario killed at one failpoint of one boundary, then resumed until it ended.

    Attributes:
        point: ``before_append``, ``after_append`` or ``torn_append`` (``none`` for the uncrashed baseline).
        seq: the first seq of the append the failpoint names (-1 for the baseline).
        kind: the kinds of that append's entries, as the baseline wrote them.
        died: whether the child was killed there (False: the scenario never reached that append).
        resumes: how many child processes resumed the run after the crash.
        status: the run's status at the end.
        violations: what went wrong (empty when every invariant held).
        run_id: the run this case made (left in the store, for ``tether show``).
        where: whose append the failpoint names: ``root``, or ``subagent N`` (numbered in the order the
            uncrashed run's subagent runs first appended).
    """

    point: str
    seq: int
    kind: str
    died: bool
    resumes: int
    status: str
    violations: list[str] = field(default_factory=list)
    run_id: str = ""
    where: str = "root"


@dataclass(slots=True)
class CrashReport:
    """What ``crash_test`` found: one row per (boundary, failpoint); ``str(report)`` is a table.

    Attributes:
        rows: the cases, in the order the uncrashed run appended, then by failpoint.
        boundaries: the appends after each run's creation in the uncrashed run and its subagent runs
            (each one a crash site).
        baseline: the uncrashed run (its invariants are checked too).
        agent: the agent factory.
        store_url: the store the runs were made in.
        seconds: how long the whole test took.
    """

    rows: list[CrashCase]
    boundaries: int
    baseline: CrashCase | None = None
    agent: str = ""
    store_url: str = ""
    seconds: float = 0.0

    @property
    def violations(self) -> int:
        """How many invariant violations were found, over every case and the baseline (the goal is 0)."""
        base = len(self.baseline.violations) if self.baseline is not None else 0
        return base + sum(len(row.violations) for row in self.rows)

    @property
    def not_reached(self) -> list[CrashCase]:
        """The cases whose child ran to its end without reaching its failpoint."""
        return [row for row in self.rows if not row.died]

    @property
    def exercised(self) -> int:
        """How many boundaries had every one of their failpoints reached."""
        reached: dict[tuple[str, int], bool] = {}
        for row in self.rows:
            reached[(row.where, row.seq)] = reached.get((row.where, row.seq), True) and row.died
        return sum(1 for every in reached.values() if every)

    def __str__(self) -> str:
        lines = [
            f"crash test of {self.agent} on {self.store_url}: {self.boundaries} boundaries, "
            f"{len(self.rows)} cases, {self.exercised} boundaries exercised, {self.violations} violations "
            f"({self.seconds:.1f}s)"
        ]
        if self.baseline is not None:
            lines.append(
                f"  without a crash the run ends {self.baseline.status} (run {self.baseline.run_id})"
            )
        width = max([len(row.kind) for row in self.rows] + [6])
        width = min(width, 48)
        lines.append(
            f"  {'point':<13}  {'seq':>4}  {'append':<{width}}  {'died':<4}  {'resumes':>7}  "
            f"{'status':<9}  violations"
        )
        for row in self.rows:
            kind = row.kind if len(row.kind) <= width else row.kind[: width - 3] + "..."
            lines.append(
                f"  {row.point:<13}  {row.seq:>4}  {kind:<{width}}  {'yes' if row.died else 'no':<4}  "
                f"{row.resumes:>7}  {row.status:<9}  {len(row.violations)}"
            )
        cases = ([self.baseline] if self.baseline is not None else []) + self.rows
        broken = [case for case in cases if case.violations]
        if broken:
            lines.append("violations:")
            for case in broken:
                where = "without a crash" if case.point == "none" else f"{case.point} at seq {case.seq}"
                for violation in case.violations:
                    lines.append(f"  {where} (run {case.run_id}): {violation}")
        if self.not_reached:
            lines.append(
                f"not reached: {len(self.not_reached)} cases ran to their end without meeting their failpoint"
            )
        return "\n".join(lines)


class InvariantViolation(AssertionError):
    """An invariant broke in a crash test; ``report`` holds every case (``str(exc)`` shows the table)."""

    def __init__(self, report: CrashReport) -> None:
        self.report = report
        super().__init__(
            f"{report.violations} crash-test invariant violations. Fix: see the violations below; "
            f"tether show RUN_ID --store {report.store_url} shows a case's journal\n{report}"
        )


def crash_test(
    agent_factory: str,
    prompt: str,
    *,
    store_url: str,
    points: Sequence[str] = POINTS,
    max_resumes: int = 5,
    timeout: float = 60,
    run_id_prefix: str = "crash",
    jobs: int | None = None,
    on_case: Callable[[CrashCase], None] | None = None,
    fresh_interpreter: bool = False,
    approve: str | None = None,
) -> CrashReport:
    """Kill a scenario at every journal boundary, resume it in fresh processes, and check the invariants.

    Args:
        agent_factory: ``module:attribute`` or ``path/file.py:attribute`` naming an ``Agent`` or a
            zero-argument callable returning one; every child process builds the agent from it (the
            agent's own store is replaced by ``store_url``).
        prompt: the prompt each run starts with.
        store_url: the store every run is made in (``file:...``, ``sqlite:///...``; not ``memory:``). The
            runs are left there (ids ``{run_id_prefix}-{random}-...``) for ``tether show``.
        points: the failpoints to try at each boundary.
        max_resumes: how many resuming processes a case may use before "the run did not end".
        timeout: seconds each child process may take.
        run_id_prefix: how the runs' ids begin.
        jobs: how many cases run at once (default: the CPU count, at most 4).
        on_case: called with each case as it finishes (from a worker thread).
        fresh_interpreter: start every child as a new interpreter (slower). By default each child is
            forked from a server process that has imported tether (and nothing of the agent's code).
        approve: ``"all"``: every agent of the tree (subagents too) gets a person who approves each call
            it asks about, so the scenario runs past its approvals; a case whose run ends ``waiting`` (a
            crash between a request for approval and its answer) has its pending calls approved through the
            inbox, as ``tether approve`` does, and is resumed again. None (the default): approvals are left
            pending, and a run waiting for one has ended.

    Returns:
        The report: a row per (boundary, failpoint); ``report.violations`` is 0.

    Raises:
        InvariantViolation: an invariant broke (``exc.report`` holds every case).
        ValueError: bad arguments (an unknown failpoint, a ``memory:`` store, a malformed factory).
        RuntimeError: the scenario does not run to its end once, without any crash.
    """
    began = time.monotonic()
    if isinstance(points, str):
        points = (points,)
    points = tuple(points)
    bad = [p for p in points if p not in POINTS]
    if bad or not points:
        raise ValueError(f"failpoints {bad or 'none'} are not known. Fix: use some of {', '.join(POINTS)}")
    points = tuple(p for p in POINTS if p in points)  # each once, in the report's order
    if ":" not in agent_factory:
        raise ValueError(
            f"agent factory {agent_factory!r} is not module:attribute or path/file.py:attribute. Fix: for "
            "example myapp.agents:build_agent"
        )
    j.validate_run_id(f"{run_id_prefix}-0")
    if len(run_id_prefix) > 96:
        raise ValueError("run_id_prefix is longer than 96 characters. Fix: pass a shorter prefix")
    if max_resumes < 1 or timeout <= 0:
        raise ValueError("max_resumes must be at least 1 and timeout positive. Fix: pass e.g. 5 and 60")
    if approve not in (None, "all"):
        raise ValueError(f"approve={approve!r} is not known. Fix: pass approve='all', or None")
    if store_url.strip().startswith("memory:"):
        raise ValueError(
            "a memory: store lives in one process, and the crash test runs many. Fix: pass file:PATH or "
            "sqlite:///PATH"
        )
    store = open_store(store_url)
    workdir = Path(tempfile.mkdtemp(prefix="tether-crashtest-"))
    token = secrets.token_hex(4)
    fork = not fresh_interpreter and hasattr(os, "fork")
    setup = _Setup(agent_factory, prompt, store, store.identity, workdir, timeout, max_resumes, fork, approve)
    try:
        baseline, boundaries = _baseline(setup, f"{run_id_prefix}-{token}-base")
        plan = [
            (point, boundary, f"{run_id_prefix}-{token}-{index:02d}{_SHORT[point]}")
            for index, boundary in enumerate(boundaries)
            for point in points
        ]
        lock = threading.Lock()

        def one(item: tuple[str, _Boundary, str]) -> CrashCase:
            case = _case(setup, *item)
            if on_case is not None:
                with lock:
                    on_case(case)
            return case

        workers = max(1, jobs if jobs is not None else min(4, os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tether-crashtest") as pool:
            rows = list(pool.map(one, plan))
    finally:
        setup.close()
        shutil.rmtree(workdir, ignore_errors=True)
        store.close()
    report = CrashReport(
        rows=rows,
        boundaries=len(boundaries),
        baseline=baseline,
        agent=agent_factory,
        store_url=setup.url,
        seconds=time.monotonic() - began,
    )
    if report.violations:
        raise InvariantViolation(report)
    return report


def _baseline(setup: _Setup, run_id: str) -> tuple[CrashCase, list[_Boundary]]:
    log = setup.workdir / f"{run_id}.jsonl"
    done = setup.spawn("start", run_id, log)
    try:
        runs = setup.tree(run_id)
    except Exception as exc:
        raise RuntimeError(
            f"the scenario's run {run_id} cannot be loaded after running once without a crash "
            f"({_describe(exc)}); the child {done.problem()}. Fix: make the agent run the prompt to its end "
            "in one process first"
        ) from exc
    status = runs[0].status
    if status not in ENDS or (done.code != 0 and status != "failed"):
        raise RuntimeError(
            f"the scenario did not run to its end in one process without a crash: run {run_id} is "
            f"{status} and the child {done.problem()}. Fix: make the agent run the prompt to its end "
            "in one process first"
        )
    boundaries = _boundaries(run_id, runs, _records(log))
    case = CrashCase("none", -1, "no crash", False, 0, status, setup.check(run_id, log), run_id)
    return case, boundaries


def _case(setup: _Setup, point: str, boundary: _Boundary, run_id: str) -> CrashCase:
    log = setup.workdir / f"{run_id}.jsonl"
    first = setup.spawn("start", run_id, log, f"{point}:{boundary.spec}")
    died = first.code == -signal.SIGKILL
    status, resumes, violations = setup.drive_to_end(run_id, log, first, crashing=True)
    if status != "unknown":
        violations += setup.check(run_id, log)
    return CrashCase(
        point, boundary.seq, boundary.label, died, resumes, status, violations, run_id, boundary.where
    )
