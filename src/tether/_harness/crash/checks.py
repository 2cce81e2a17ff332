"""The crash harness's invariant checks (see ``tether._harness.crash.crash_test``): judging a run's journal and side file.

Also where the crash sites come from: the appends of the uncrashed run and its subagent runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import journal as j
from ...state import State
from ..execution_log import ExecutionLog

__all__ = ["ENDS", "judge"]

ENDS = frozenset({"completed", "failed", "cancelled", "stopped", "waiting"})
"""The statuses at which the harness stops resuming a run (``waiting``: it waits for a person)."""

_RETRY_EFFECTS = frozenset({"read_only", "idempotent"})


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def _records(log: Path) -> list[dict[str, Any]]:
    return ExecutionLog(log).records()


def judge(run_id: str, history: Sequence[j.Entry], records: Sequence[dict[str, Any]]) -> list[str]:
    """The invariant violations shown by a run's journal and its side-file records (empty: none).

    Args:
        run_id: the run.
        history: its entries (``state.history``).
        records: the side file's records of this run: ``start`` and ``end`` (every tool invocation),
            ``execution`` (``record_execution``), ``request`` (every model request).
    """
    violations: list[str] = []
    started: dict[tuple[str, int], str] = {}
    for entry in history:
        if isinstance(entry, j.ToolStarted):
            started[(entry.call_id, entry.attempt)] = entry.idempotency_key
    for source, event in (("the tool", "start"), ("record_execution", "execution")):
        runs: dict[str, list[dict[str, Any]]] = {}
        for record in records:
            if record.get("event") == event:
                runs.setdefault(str(record.get("call_id")), []).append(record)
        for call_id, execs in runs.items():
            name = execs[0].get("tool")
            effect = execs[0].get("effect")
            label = f"{effect} call {call_id} ({name})"
            attempts = [int(r.get("attempt") or 0) for r in execs]
            if effect == "unsafe" and len(execs) > 1:
                pids = ", ".join(str(r.get("pid")) for r in execs)
                violations.append(f"{label} executed {len(execs)} times, by {source} (pids {pids})")
            elif len(set(attempts)) < len(attempts):
                violations.append(f"{label}: an attempt executed twice, by {source} (attempts {attempts})")
            keys = sorted({str(r.get("key")) for r in execs})
            if effect in _RETRY_EFFECTS and len(keys) > 1:
                violations.append(f"{label} saw {len(keys)} idempotency keys: {', '.join(keys)}")
            for record, attempt in zip(execs, attempts, strict=True):
                key = started.get((call_id, attempt))
                if key is None:
                    violations.append(
                        f"{label} attempt {attempt} executed without a durable tool_started, by {source}"
                    )
                elif key != record.get("key"):
                    violations.append(
                        f"{label} attempt {attempt} executed with key {record.get('key')}; its tool_started "
                        f"says {key}"
                    )
    for record in records:
        if record.get("event") == "request" and record.get("missing"):
            missing = ", ".join(str(m) for m in record["missing"])
            violations.append(
                f"model request {record.get('index')} carried calls without a result: {missing} "
                f"(pid {record.get('pid')})"
            )
    return violations


@dataclass(frozen=True, slots=True)
class _Boundary:
    """One append of the uncrashed run (or of one of its subagent runs), where a failpoint can fire."""

    run_id: str
    seq: int
    kinds: tuple[str, ...]
    where: str  # "root", or "subagent N" in the order the subagent runs first appended
    spec: str  # what follows "POINT:" in TETHER_FAILPOINT

    @property
    def label(self) -> str:
        text = _label(self.kinds)
        return text if self.where == "root" else f"{text} ({self.where})"


def _appends(run_id: str, history: Sequence[j.Entry]) -> list[list[j.Entry]]:
    """The journal's appends, from the countdown ``b`` each entry carries (``b == 0`` ends an append)."""
    appends: list[list[j.Entry]] = []
    current: list[j.Entry] = []
    for entry in history:
        current.append(entry)
        if entry.b == 0:
            appends.append(current)
            current = []
    if current:
        raise ValueError(f"run {run_id}: its last append has no end (b never reaches 0). Fix: report a bug")
    return appends


def _boundaries(run_id: str, runs: Sequence[State], records: Sequence[dict[str, Any]]) -> list[_Boundary]:
    """The appends of the uncrashed run's tree, in the order the process made them.

    A run without subagents is failed by seq (``POINT:SEQ``, the append holding that seq). In a tree, a seq
    names an append in every run, so the n-th entry of the append's first kind, counted over the whole
    process (``POINT:KIND#N``), names it instead.
    """
    done = [r for r in records if r.get("event") == "append" and isinstance(r.get("kinds"), list)]
    if not done or len(runs) == 1:
        root = runs[0]
        return [
            _Boundary(run_id, batch[0].seq, tuple(e.kind for e in batch), "root", str(batch[0].seq))
            for batch in _appends(run_id, root.history)[1:]  # the first is the creation: no failpoint there
        ]
    names: dict[str, str] = {run_id: "root"}
    seen: dict[str, int] = {}
    out: list[_Boundary] = []
    for record in done:
        kinds = tuple(str(k) for k in record["kinds"])
        owner = str(record["run_id"])
        where = names.setdefault(owner, f"subagent {len(names)}")
        nth = seen.get(kinds[0], 0) + 1
        out.append(_Boundary(owner, int(record["seq"]), kinds, where, f"{kinds[0]}#{nth}"))
        for kind in kinds:
            seen[kind] = seen.get(kind, 0) + 1
    return out


def _label(kinds: Sequence[str]) -> str:
    parts: list[str] = []
    counts: dict[str, int] = {}
    for kind in kinds:
        if kind not in counts:
            parts.append(kind)
        counts[kind] = counts.get(kind, 0) + 1
    return "+".join(kind if counts[kind] == 1 else f"{kind}*{counts[kind]}" for kind in parts)
