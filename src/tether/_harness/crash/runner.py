"""The crash harness's parent side of the child processes (see ``tether._harness.crash.crash_test``).

``_Setup`` runs one child to its end, forked from a fork server (``_ForkServer``) or as a new interpreter,
resumes a crashed run until it ends, and checks a finished case.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ...state import State
from ...stores import Store
from .checks import ENDS, _describe, _records, judge
from .child import _APPROVE_ENV, _PATH_ENV, LOG_ENV

_CHILD_CODE = (
    "import os, sys\n"
    f"sys.path.extend(p for p in os.environ.get({_PATH_ENV!r}, '').split(os.pathsep) if p and p not in sys.path)\n"
    "from tether._harness.crash.child import _child_main\n"
    "sys.exit(_child_main(sys.argv[1:]))\n"
)
_FORK_SERVER_CODE = (
    "import os, sys\n"
    f"sys.path.extend(p for p in os.environ.get({_PATH_ENV!r}, '').split(os.pathsep) if p and p not in sys.path)\n"
    "from tether._harness.crash.child import _fork_server_main\n"
    "_fork_server_main()\n"
)


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
    approve: str | None = None
    idle: queue.SimpleQueue[_ForkServer] = field(default_factory=queue.SimpleQueue)
    servers: list[_ForkServer] = field(default_factory=list)

    def env(self, log: Path | None, failpoint: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("TETHER_FAILPOINT", LOG_ENV, _APPROVE_ENV)}
        env[_PATH_ENV] = os.pathsep.join(p for p in sys.path if p)
        if self.approve is not None:
            env[_APPROVE_ENV] = self.approve
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
        while (status not in ENDS or self._answered(run_id, status)) and resumes < self.max_resumes:
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

    def _answered(self, run_id: str, status: str) -> bool:
        """With ``approve="all"``, approve the pending calls of a run that ended ``waiting`` (posted, as
        ``tether approve`` does); True when there were some, so the run is resumed again."""
        if self.approve != "all" or status != "waiting":
            return False
        state = self.store.load(run_id)
        pending = state.pending_approvals
        for call in pending:
            state.approve(call.call_id, by="crashtest", run_id=call.run_id)
        if pending:
            self.store.save(state)
        return bool(pending)

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
