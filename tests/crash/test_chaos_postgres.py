"""Chaos on PostgreSQL (issue 7): worker processes killed with SIGKILL at random moments and restarted while
other processes post approvals and messages; every run ends and every assertion of DURABILITY 7 holds. And a
worker paused past its lease: another takes over; the first, continued, is fenced and runs no further tool.

Tools record each execution (run, call id, attempt, effect, key, pid, start and end times, the lease token
and writer the run had when it started) in a side file; "ran once" and "never overlapped" are judged there.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _chaos_agents import fresh_schema, make_agent, open_test_store

from tether import journal as j
from tether.stores.base import Store
from tether.testing import ExecutionLog

pytestmark = [pytest.mark.crash, pytest.mark.slow]

SCRIPT = str(Path(__file__).with_name("_chaos_agents.py"))
RUNS = int(os.environ.get("TETHER_CHAOS_RUNS", "200"))
CHAOS_SECONDS = float(os.environ.get("TETHER_CHAOS_SECONDS", "40"))
WORKERS = 4
TTL = 5.0


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    with fresh_schema("tether_test_chaos") as made:
        yield made


def _spawn(mode: str, url: str, side: Path, *args: str, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINT"}
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, SCRIPT, mode, url, str(side), *args],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )


def _wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _all_ended(store: Store, ids: list[str]) -> bool:
    infos = {info.id: info for info in store.list(limit=len(ids) + 10)}
    return all(
        infos[r].status in ("completed", "failed") and infos[r].lease_owner is None and infos[r].inbox_len == infos[r].inbox_consumed + 1
        for r in ids
    )  # fmt: skip


def _executions(side: Path, ends_of: dict[int, float]) -> list[dict[str, Any]]:
    """One record per execution: its start record with ``end`` (its end record's time, or when its process
    was killed, or infinity if neither)."""
    records = ExecutionLog(side).records()
    ends = {
        (r["run_id"], r["call_id"], r["attempt"], r["pid"]): r["t"] for r in records if r["event"] == "end"
    }
    out = []
    for r in records:
        if r["event"] == "start":
            key = (r["run_id"], r["call_id"], r["attempt"], r["pid"])
            out.append({**r, "end": ends.get(key, ends_of.get(r["pid"], float("inf")))})
    return out


def _check_durability(
    store: Store, ids: list[str], side: Path, killed_at: dict[int, float]
) -> dict[str, int]:
    """Every assertion of DURABILITY 7; returns counts. Raises AssertionError listing the violations."""
    executions = _executions(side, killed_at)
    violations: list[str] = []
    by_call: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ex in executions:
        by_call[(ex["run_id"], ex["call_id"])].append(ex)
        by_run[ex["run_id"]].append(ex)
    for (run_id, call_id), runs in by_call.items():
        if runs[0]["effect"] == "unsafe" and len(runs) > 1:
            violations.append(f"unsafe call {run_id}/{call_id} executed {len(runs)} times")
    for run_id, runs in by_run.items():  # SIGKILL-only chaos: no two processes' executions overlap at all
        runs.sort(key=lambda ex: ex["t"])
        for i, a in enumerate(runs):
            for b in runs[i + 1 :]:
                if b["t"] >= a["end"]:
                    break
                if a["pid"] != b["pid"]:
                    violations.append(
                        f"run {run_id}: {a['call_id']} (pid {a['pid']}) overlaps {b['call_id']} (pid {b['pid']})"
                    )
    posted = [r for r in ExecutionLog(f"{side}.posts").records() if r.get("event") != "posting"]
    posted_ids: dict[str, set[str]] = defaultdict(set)
    for r in posted:
        posted_ids[r["run_id"]].add(r["item_id"])
    for run_id in ids:
        history = store.read(run_id)
        resumed = {j.short_writer(e.writer): e for e in history if isinstance(e, j.RunResumed)}  # w: 64 bits
        started = {(e.call_id, e.attempt): e for e in history if isinstance(e, j.ToolStarted)}
        tokens = [e.token for e in history if isinstance(e, j.RunResumed)]
        if tokens != sorted(tokens) or len(set(tokens)) != len(tokens):
            violations.append(f"run {run_id}: run_resumed tokens {tokens} do not rise")
        for ex in by_run.get(run_id, []):  # started by the writer whose run_resumed carries its lease token
            entry = started.get((ex["call_id"], ex["attempt"]))
            mark = resumed.get(entry.w) if entry else None
            if entry is None or mark is None or entry.w != j.short_writer(ex["writer"]):
                violations.append(
                    f"run {run_id} {ex['call_id']}#{ex['attempt']}: no tool_started/run_resumed of its writer"
                )
            elif (mark.token, mark.pid) != (ex["token"], ex["pid"]) or mark.seq > entry.seq:
                violations.append(
                    f"run {run_id} {ex['call_id']}: token {ex['token']} pid {ex['pid']} vs run_resumed {mark.token} pid {mark.pid}"
                )
        inbox = store.read_inbox(run_id)
        journaled = [
            e.inbox_seq for e in history if getattr(e, "inbox_seq", None) is not None and e.inbox_seq >= 0
        ]  # type: ignore[attr-defined]
        if journaled != list(range(len(inbox))):
            violations.append(f"run {run_id}: inbox items journaled as {journaled}, inbox holds {len(inbox)}")
        missing = posted_ids.get(run_id, set()) - {item.item_id for item in inbox}
        if missing:
            violations.append(f"run {run_id}: posted items {sorted(missing)} are not in its inbox")
    assert not violations, "\n".join(violations[:40])
    unsafe = sum(1 for ex in executions if ex["effect"] == "unsafe")
    return {"executions": len(executions), "unsafe executions": unsafe, "posted items": len(posted)}


def test_chaos_sigkilled_workers_posters_and_every_durability_rule(dsn: str, tmp_path: Path) -> None:
    side, errors = tmp_path / "side.jsonl", tmp_path / "stderr.log"
    store = open_test_store(dsn, ttl=TTL)
    agent = make_agent("chaos", store, side, TTL)
    ids = [agent.submit(f"order {i}").id for i in range(RUNS)]
    stop = tmp_path / "stop-messages"
    stop_approvals = tmp_path / "stop-approvals"
    workers = [_spawn("worker", dsn, side, "chaos", str(TTL), "4", log=errors) for _ in range(WORKERS)]
    messenger = _spawn("messenger", dsn, side, str(stop), log=errors)
    approver = _spawn("approver", dsn, side, str(stop_approvals), log=errors)
    killed_at: dict[int, float] = {}
    rng = random.Random(7)
    try:
        deadline = time.monotonic() + CHAOS_SECONDS
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.3, 2.0))
            i = rng.randrange(WORKERS)
            victim = workers[i]
            victim.kill()  # SIGKILL
            victim.wait()
            killed_at[victim.pid] = time.time()
            workers[i] = _spawn("worker", dsn, side, "chaos", str(TTL), "4", log=errors)
        stop.touch()
        assert messenger.wait(60) == 0, errors.read_text()[-3000:]
        _wait_for(lambda: _all_ended(store, ids), 120, "every run to end")
    finally:
        stop.touch()
        stop_approvals.touch()
        for proc in workers:  # SIGTERM once its handler is in place (it logs "started" after that)
            with contextlib.suppress(AssertionError):
                _wait_for(lambda p=proc: f"-{p.pid} started" in errors.read_text(), 30, "a worker to start")
            proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in [*workers, messenger, approver]:
            try:
                codes.append(proc.wait(60))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
    assert codes == [0] * len(codes), errors.read_text()[-3000:]
    figures = _check_durability(store, ids, side, killed_at)
    states = [store.load(run_id) for run_id in ids]
    failed = [s for s in states if s.status != "completed"]
    assert all(s.status == "failed" and "crash loop" in str(s.history[-1].reason) for s in failed)  # type: ignore[attr-defined]
    finished = [e for state in states for e in state.history if isinstance(e, j.ToolFinished)]
    figures.update(
        runs=RUNS, completed=RUNS - len(failed), kills=len(killed_at), violations=0,
        **{"unsafe calls closed aborted": sum(e.outcome == "aborted" for e in finished)},
    )  # fmt: skip
    print("\nchaos figures:", ", ".join(f"{k} {v}" for k, v in figures.items()))
    assert figures["kills"] >= 5 and figures["posted items"] > RUNS  # the chaos really happened
    store.close()


def test_a_worker_paused_past_its_lease_is_fenced_and_runs_no_further_tool(dsn: str, tmp_path: Path) -> None:
    side, err_a, err_b = tmp_path / "side.jsonl", tmp_path / "a.log", tmp_path / "b.log"
    ttl = 1.5
    store = open_test_store(dsn, ttl=ttl)
    run_id = make_agent("pause", store, side, ttl).submit("slow then after").id
    log = ExecutionLog(side)
    first = _spawn("worker", dsn, side, "pause", str(ttl), "1", log=err_a)
    second = None
    try:
        _wait_for(lambda: log.count(event="start", tool="slow_step"), 60, "worker A to start slow_step")
        first.send_signal(signal.SIGSTOP)
        held_by_a = store.holder(run_id)
        assert held_by_a is not None and held_by_a.pid == first.pid
        second = _spawn("worker", dsn, side, "pause", str(ttl), "1", log=err_b)
        _wait_for(lambda: store.load(run_id).status == "completed", 60, "worker B to finish the run")
        first.send_signal(signal.SIGCONT)
        _wait_for(
            lambda: f"lost its lease on run {run_id}" in err_a.read_text(),
            60,
            "worker A to see its lease lost",
        )
        _wait_for(lambda: log.count(event="end", pid=first.pid), 60, "worker A's slow_step to return")
        assert first.poll() is None  # not fatal: the worker goes on
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(60) for proc in (first, second) if proc is not None]
    assert codes == [0, 0], err_a.read_text()[-2000:] + err_b.read_text()[-2000:]
    records = log.records()
    a_runs = [(r["tool"], r["event"]) for r in records if r["pid"] == first.pid]
    assert a_runs == [("slow_step", "start"), ("slow_step", "end")]  # it finished its tool, then ran nothing
    after = [r for r in records if r["tool"] == "after_step" and r["event"] == "start"]
    assert len(after) == 1 and second is not None and after[0]["pid"] == second.pid
    history = store.read(run_id)
    a_writer = next(r["writer"] for r in records if r["pid"] == first.pid)
    b_mark = next(e for e in history if isinstance(e, j.RunResumed) and e.pid == second.pid)
    assert not [
        e for e in history[b_mark.seq :] if e.w == j.short_writer(a_writer)
    ]  # A's late append was refused
    assert b_mark.token > next(r["token"] for r in records if r["pid"] == first.pid)
    finished = [(e.call_id, e.outcome) for e in history if isinstance(e, j.ToolFinished)]
    assert len(finished) == 2 and len({c for c, _ in finished}) == 2 and {o for _, o in finished} == {"done"}
    store.close()
