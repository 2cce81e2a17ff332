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

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import os
import queue
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from . import journal as j
from .agent import Agent
from .messages import Message
from .models.base import Model, ModelReply, ModelRequest, TextCallback
from .state import State
from .stores import Store, open_store
from .tools import Tool, ToolContext

__all__ = [
    "ENDS",
    "LOG_ENV",
    "POINTS",
    "CrashCase",
    "CrashReport",
    "InvariantViolation",
    "cli_main",
    "crash_test",
    "load_agent",
    "record_execution",
]

POINTS: tuple[str, ...] = ("before_append", "after_append", "torn_append")
"""The failpoints of DESIGN 14, in the order the report lists them."""

LOG_ENV = "TETHER_CRASHTEST_LOG"
"""Names the side file where a child records tool executions and model requests (unset: nothing is recorded)."""

ENDS = frozenset({"completed", "failed", "cancelled", "stopped", "waiting"})
"""The statuses at which the harness stops resuming a run (``waiting``: it waits for a person)."""

_PATH_ENV = "TETHER_CRASHTEST_PATH"
_EFFECTS = ("read_only", "idempotent", "unsafe", "resumable")
_RETRY_EFFECTS = frozenset({"read_only", "idempotent"})
_CHILD_CODE = (
    "import os, sys\n"
    f"sys.path.extend(p for p in os.environ.get({_PATH_ENV!r}, '').split(os.pathsep) if p and p not in sys.path)\n"
    "from tether._crashtest import _child_main\n"
    "sys.exit(_child_main(sys.argv[1:]))\n"
)
_FORK_SERVER_CODE = (
    "import os, sys\n"
    f"sys.path.extend(p for p in os.environ.get({_PATH_ENV!r}, '').split(os.pathsep) if p and p not in sys.path)\n"
    "from tether._crashtest import _fork_server_main\n"
    "_fork_server_main()\n"
)
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


# --------------------------------------------------------------------------------------------------
# What tools and children record


def record_execution(ctx: ToolContext, effect: str, **more: Any) -> None:
    """Record that a call's work took effect, for the crash harness (a no-op outside ``crash_test``).

    The harness already records every tool invocation; call this only where the work happens outside the
    invocation (a process the tool forks, a job it hands over), once per execution of that work.

    Args:
        ctx: the call's ToolContext.
        effect: the tool's effect: ``read_only``, ``idempotent`` or ``unsafe``.
        more: extra JSON fields kept with the record.
    """
    if effect not in _EFFECTS:
        raise ValueError(
            f"effect {effect!r} is not known. Fix: pass the tool's effect: read_only, idempotent or unsafe"
        )
    _record("execution", ctx, effect, source="tool", **more)


def _record(event: str, ctx: ToolContext, effect: str, **more: Any) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    from .testing import ExecutionLog  # tether.testing re-exports this module: import it late

    ExecutionLog(path).record(
        event=event,
        run_id=ctx.run_id,
        call_id=ctx.call_id,
        tool=ctx.tool,
        attempt=ctx.attempt,
        key=ctx.idempotency_key,
        effect=effect,
        at=time.time(),
        **more,
    )


_RECORDED: dict[type[Tool], type[Tool]] = {}


def _recorded_class(cls: type[Tool]) -> type[Tool]:
    """A subclass of ``cls`` that records each invocation (start and end) in the harness's side file."""
    made = _RECORDED.get(cls)
    if made is not None:
        return made

    def invoke_sync(self: Tool, kwargs: dict[str, Any], ctx: ToolContext) -> Any:
        _record("start", ctx, self.effect, source="auto")
        outcome = "error"
        try:
            value = cls.invoke_sync(self, kwargs, ctx)
            outcome = "done"
            return value
        finally:
            _record("end", ctx, self.effect, source="auto", outcome=outcome)

    async def invoke_async(self: Tool, kwargs: dict[str, Any], ctx: ToolContext) -> Any:
        _record("start", ctx, self.effect, source="auto")
        outcome = "error"
        try:
            value = await cls.invoke_async(self, kwargs, ctx)
            outcome = "done"
            return value
        finally:
            _record("end", ctx, self.effect, source="auto", outcome=outcome)

    namespace = {"__slots__": (), "invoke_sync": invoke_sync, "invoke_async": invoke_async}
    made = _RECORDED[cls] = type(f"Recorded{cls.__name__}", (cls,), namespace)
    return made


def calls_without_result(messages: Iterable[Message]) -> list[str]:
    """The ids of the ``tool_call`` blocks that no later ``tool_result`` answers, in the order found."""
    answered: set[Any] = set()
    missing: list[list[str]] = []
    for message in reversed(list(messages)):
        for block in message.content:
            if block.get("type") == "tool_result":
                answered.add(block.get("call_id"))
        if message.role == "assistant":
            calls = [block.get("id") for block in message.content if block.get("type") == "tool_call"]
            missing.append([str(c) for c in calls if c not in answered])
    return [call_id for found in reversed(missing) for call_id in found]


class _WatchedModel:
    """Wraps the agent's model: records each request, and the calls it carried without a result."""

    def __init__(self, inner: Model) -> None:
        self._inner = inner
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def request(self, request: ModelRequest, on_text: TextCallback | None = None) -> ModelReply:
        path = os.environ.get(LOG_ENV)
        if path:
            from .testing import ExecutionLog

            ExecutionLog(path).record(
                event="request",
                run_id=request.run_id,
                index=request.index,
                missing=calls_without_result(request.messages),
                at=time.time(),
            )
        return await self._inner.request(request, on_text)


def _instrument(agent: Agent, seen: set[int] | None = None) -> None:
    """Record every tool execution and model request of ``agent`` and its subagents (in this process only)."""
    seen = set() if seen is None else seen
    if id(agent) in seen:
        return
    seen.add(id(agent))
    for made in agent.tools.values():
        if made.effect != "resumable" and type(made) not in _RECORDED.values():  # a subagent call is driven
            made.__class__ = _recorded_class(type(made))
    if not isinstance(agent.model, _WatchedModel):
        agent.model = _WatchedModel(agent.model)
    for sub in getattr(agent, "subagents", {}).values():
        _instrument(sub, seen)


def _record_appends(store: Store) -> None:
    """Record each append of ``store`` that returned (run, seqs, kinds), in this process's order."""
    append = store.append

    def recorded(run_id: str, entries: Sequence[j.Entry], **kwargs: Any) -> None:
        append(run_id, entries, **kwargs)
        path = os.environ.get(LOG_ENV)
        if path and entries:
            from .testing import ExecutionLog

            ExecutionLog(path).record(
                event="append", run_id=run_id, seq=entries[0].seq, kinds=[e.kind for e in entries]
            )

    store.append = recorded  # type: ignore[method-assign]


# --------------------------------------------------------------------------------------------------
# Agents from a factory


def load_agent(spec: str) -> Agent:
    """The Agent named by ``module:attribute`` or ``path/file.py:attribute`` (an Agent or a callable).

    Raises:
        ValueError: the spec is malformed, cannot be imported, or does not give an Agent.
    """
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ValueError(
            f"agent factory {spec!r} is not module:attribute or path/file.py:attribute. Fix: for example "
            "myapp.agents:build_agent or agents.py:support"
        )
    if target.endswith(".py") or "/" in target or os.sep in target:
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"agent factory {spec!r}: no file {path}. Fix: check the path")
        name = "_tether_crashtest_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
        module = sys.modules.get(name)
        if module is None:
            module_spec = importlib.util.spec_from_file_location(name, path)
            if module_spec is None or module_spec.loader is None:
                raise ValueError(f"agent factory {spec!r}: {path} cannot be imported. Fix: name a .py file")
            if str(path.parent) not in sys.path:
                sys.path.insert(0, str(path.parent))
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            raise ValueError(
                f"agent factory {spec!r}: module {target} not found ({exc}). Fix: run from the folder that "
                "holds it, set PYTHONPATH, or pass path/file.py:attribute"
            ) from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(
                f"agent factory {spec!r}: {target} has no attribute {attr}. Fix: check the name"
            ) from None
    if not isinstance(obj, Agent):
        if isinstance(obj, Tool) or not callable(obj) or not _takes_no_arguments(obj):
            raise ValueError(
                f"agent factory {spec!r} is a {type(obj).__name__}, not an Agent or a function without "
                "arguments. Fix: name an Agent or a zero-argument function returning one"
            )
        obj = obj()
        if not isinstance(obj, Agent):
            raise ValueError(
                f"agent factory {spec!r} returned a {type(obj).__name__}, not an Agent. Fix: return an Agent"
            )
    return obj


def _takes_no_arguments(fn: Callable[..., Any]) -> bool:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return True  # cannot tell: let the call say
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in signature.parameters.values()
    )


def _child_main(argv: Sequence[str]) -> int:
    """A child process: ``start|resume FACTORY STORE_URL RUN_ID PROMPT``; returns the exit code."""
    if len(argv) != 5 or argv[0] not in ("start", "resume"):
        print("usage: start|resume FACTORY STORE_URL RUN_ID PROMPT", file=sys.stderr)
        return 2
    mode, factory, store_url, run_id, prompt = argv
    try:
        agent = load_agent(factory)
        agent.store = open_store(store_url)
        _record_appends(agent.store)
        _instrument(agent)
        state = agent.run(prompt, id=run_id) if mode == "start" else agent.resume(run_id)
    except Exception as exc:
        traceback.print_exc()
        first = (str(exc).splitlines() or [""])[0]
        print(f"error: {type(exc).__name__}: {first}", file=sys.stderr)
        return 3
    print(f"{mode}: run {state.id} is {state.status}")
    return 0


def _fork_server_main() -> None:
    """The fork server: imports tether once, then forks one child per request line read from stdin.

    A request is ``{"argv", "env", "stdout", "stderr"}``. For each, the server writes ``{"pid"}`` once the
    child is forked and ``{"pid", "code"}`` once it ended (a negative code: killed by that signal). The
    child takes the request's environment (failpoints are read again) and runs ``_child_main``; it imports
    the agent's own code itself, so nothing of it is shared between children.
    """

    def warm(text: str, ctx: ToolContext) -> str:
        """Warm the imports every child needs.

        Args:
            text: some text.
            ctx: the context.
        """
        return text

    from . import testing
    from .stores import files, sqlite
    from .tools import tool

    tool(warm)
    del testing, files, sqlite
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        request = orjson.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                code = _forked_child(request)
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        out.write(orjson.dumps({"pid": pid}) + b"\n")
        out.flush()
        _, status = os.waitpid(pid, 0)
        out.write(orjson.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)}) + b"\n")
        out.flush()


def _forked_child(request: dict[str, Any]) -> int:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(request["env"])
    failpoints = sys.modules.get("tether._failpoints")
    if failpoints is not None:
        importlib.reload(failpoints)  # TETHER_FAILPOINT is read at import: read this child's
    sys.argv = ["-c", *request["argv"]]
    return _child_main(request["argv"])


class _ServerGone(Exception):
    """The fork server ended (or stopped answering)."""


class _ForkServer:
    """A fork server process and the parent's end of its pipes (used by one thread at a time)."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.workdir = workdir
        self.errors = open(workdir / f"fork-server-{secrets.token_hex(4)}.err", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _FORK_SERVER_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            env=env,
        )
        self.buffer = b""

    def _line(self, deadline: float | None) -> dict[str, Any] | None:
        """The next line the server wrote, or None at the deadline."""
        stdout = self.proc.stdout
        assert stdout is not None
        while b"\n" not in self.buffer:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            ready, _, _ = select.select([stdout.fileno()], [], [], left)
            if not ready:
                return None
            chunk = os.read(stdout.fileno(), 65536)
            if not chunk:
                raise _ServerGone()
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        found: dict[str, Any] = orjson.loads(line)
        return found

    def run(self, argv: list[str], env: dict[str, str], timeout: float) -> _Exit:
        name = secrets.token_hex(6)
        out, err = self.workdir / f"{name}.out", self.workdir / f"{name}.err"
        request = {"argv": argv, "env": env, "stdout": str(out), "stderr": str(err)}
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            stdin.write(orjson.dumps(request) + b"\n")
            stdin.flush()
        except OSError as exc:
            raise _ServerGone() from exc
        deadline = time.monotonic() + timeout
        started = self._line(deadline)
        if started is None:
            raise _ServerGone()
        ended = self._line(deadline)
        timed_out = ended is None
        if ended is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(started["pid"]), signal.SIGKILL)  # the child this server forked for us
            ended = self._line(time.monotonic() + 30)
            if ended is None:
                raise _ServerGone()
        stderr = err.read_bytes().decode(errors="replace") if err.exists() else ""
        for path in (out, err):
            path.unlink(missing_ok=True)
        return _Exit(None if timed_out else int(ended["code"]), stderr)

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.errors.close()


# --------------------------------------------------------------------------------------------------
# The parent


@dataclass(slots=True)
class _Exit:
    code: int | None  # None: timed out (and killed)
    stderr: str

    def problem(self) -> str:
        lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error: ")]
        last = errors[-1] if errors else (lines[-1] if lines else "no output")
        if self.code is None:
            return f"did not end within the timeout ({last})"
        if self.code < 0:
            return f"was killed by signal {-self.code} ({last})"
        return f"exited with code {self.code} ({last})"


@dataclass(slots=True)
class _Setup:
    factory: str
    prompt: str
    store: Store
    url: str
    workdir: Path
    timeout: float
    max_resumes: int
    fork: bool = True
    idle: queue.SimpleQueue[_ForkServer] = field(default_factory=queue.SimpleQueue)
    servers: list[_ForkServer] = field(default_factory=list)

    def env(self, log: Path | None, failpoint: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("TETHER_FAILPOINT", LOG_ENV)}
        env[_PATH_ENV] = os.pathsep.join(p for p in sys.path if p)
        if log is not None:
            env[LOG_ENV] = str(log)
        if failpoint is not None:
            env["TETHER_FAILPOINT"] = failpoint
        return env

    def spawn(self, mode: str, run_id: str, log: Path, failpoint: str | None = None) -> _Exit:
        """Run one child to its end: forked from a fork server, or (``fork`` False) a new interpreter."""
        env = self.env(log, failpoint)
        argv = [mode, self.factory, self.url, run_id, self.prompt]
        if self.fork:
            try:
                server = self.idle.get_nowait()
            except queue.Empty:
                server = _ForkServer(self.env(None), self.workdir)
                self.servers.append(server)
            try:
                done = server.run(argv, env, self.timeout)
            except _ServerGone:
                return _Exit(None, "error: the fork server ended while the child ran")
            self.idle.put(server)
            return done
        try:
            ran = subprocess.run(
                [sys.executable, "-c", _CHILD_CODE, *argv],
                env=env,
                capture_output=True,
                timeout=self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            err = exc.stderr or b""
            return _Exit(None, err.decode(errors="replace") if isinstance(err, bytes) else str(err))
        return _Exit(ran.returncode, ran.stderr.decode(errors="replace"))

    def close(self) -> None:
        for server in self.servers:
            server.close()

    def status(self, run_id: str) -> str:
        return self.store.load(run_id).status

    def drive_to_end(
        self, run_id: str, log: Path, first: _Exit, crashing: bool
    ) -> tuple[str, int, list[str]]:
        """After the first child: resume until the run ends; returns (status, resumes, violations)."""
        violations: list[str] = []
        what = "the crashing child" if crashing else "the child"
        try:
            status = self.status(run_id)
        except Exception as exc:
            problem = "" if first.code in (0, -signal.SIGKILL) else f"; {what} {first.problem()}"
            return "unknown", 0, [f"the journal does not load after the crash: {_describe(exc)}{problem}"]
        expected = (0, -signal.SIGKILL) if crashing else (0,)
        if first.code not in expected and status != "failed":
            return status, 0, [f"{what} {first.problem()}"]
        resumes = 0
        while status not in ENDS and resumes < self.max_resumes:
            resumes += 1
            done = self.spawn("resume", run_id, log)
            try:
                status = self.status(run_id)
            except Exception as exc:
                return (
                    "unknown",
                    resumes,
                    [f"the journal does not load after resume {resumes}: {_describe(exc)}"],
                )
            if done.code != 0 and status != "failed":
                return status, resumes, [f"resume {resumes} {done.problem()}"]
        if status not in ENDS:
            violations.append(f"the run did not end: still {status} after {resumes} resumes")
        return status, resumes, violations

    def tree(self, run_id: str) -> list[State]:
        """The run and its subagent runs (every run whose root it is), loaded."""
        root = self.store.load(run_id)
        children = [info.id for info in self.store.list(root_id=run_id, limit=100_000) if info.id != run_id]
        return [root, *(self.store.load(child) for child in sorted(children))]

    def check(self, run_id: str, log: Path) -> list[str]:
        """The invariants on a finished case: the journals of its tree, the side file, the requests."""
        try:
            runs = self.tree(run_id)
        except Exception as exc:
            return [f"the journal does not load: {_describe(exc)}"]
        records = _records(log)
        violations: list[str] = []
        for state in runs:
            mine = [r for r in records if r.get("run_id") == state.id]
            where = "" if state.id == run_id else f"in subagent run {state.id}: "
            violations += [where + problem for problem in judge(state.id, state.history, mine)]
        return violations


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def _records(log: Path) -> list[dict[str, Any]]:
    from .testing import ExecutionLog

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
    if store_url.strip().startswith("memory:"):
        raise ValueError(
            "a memory: store lives in one process, and the crash test runs many. Fix: pass file:PATH or "
            "sqlite:///PATH"
        )
    store = open_store(store_url)
    workdir = Path(tempfile.mkdtemp(prefix="tether-crashtest-"))
    token = secrets.token_hex(4)
    fork = not fresh_interpreter and hasattr(os, "fork")
    setup = _Setup(agent_factory, prompt, store, store.identity, workdir, timeout, max_resumes, fork)
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


# --------------------------------------------------------------------------------------------------
# The command line


def cli_main(agent: str, prompt: str, store: str, points: list[str]) -> int:
    """``tether crashtest AGENT PROMPT --store URL [--points P,...]``: print the report; 1 on a violation.

    Returns:
        0 when every invariant held, 1 on a violation, 2 on bad input or a scenario that does not run.
    """
    chosen = tuple(p.strip() for item in points for p in item.split(",") if p.strip()) or POINTS

    def progress(case: CrashCase) -> None:
        mark = "ok" if not case.violations else f"{len(case.violations)} violations"
        reached = "" if case.died else " (not reached)"
        print(
            f"  {case.point} at seq {case.seq}: {case.status}{reached}, {mark}", file=sys.stderr, flush=True
        )

    try:
        report = crash_test(agent, prompt, store_url=store, points=chosen, on_case=progress)
    except InvariantViolation as exc:
        print(exc.report)
        return 1
    except (ValueError, RuntimeError, OSError) as exc:
        message = str(exc) if "Fix:" in str(exc) else f"{exc}. Fix: check the command's arguments"
        print(f"error: {message}", file=sys.stderr)
        return 2
    print(report)
    return 0
