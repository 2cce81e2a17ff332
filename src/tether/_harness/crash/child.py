"""The crash harness's child-process side (see ``tether._harness.crash.crash_test``): what runs in each child.

A child builds the agent from its factory, points it at the store, and wraps each tool (its subagents'
too), its model and its store so that every execution, model request and append is recorded in the side
file named by ``LOG_ENV``. The fork server (``_fork_server_main``) forks such children on request.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import time
import traceback
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from ... import _loading
from ... import journal as j
from ...agent import Agent
from ...humans import ApprovalQuestion, HumanDecision
from ...messages import Message
from ...models.base import Model, ModelReply, ModelRequest, TextCallback
from ...stores import Store, open_store
from ...tools import Tool, ToolContext
from ..execution_log import ExecutionLog

__all__ = ["LOG_ENV", "calls_without_result", "load_agent", "record_execution"]

LOG_ENV = "TETHER_CRASHTEST_LOG"
"""Names the side file where a child records tool executions and model requests (unset: nothing is recorded)."""

_PATH_ENV = "TETHER_CRASHTEST_PATH"
_APPROVE_ENV = "TETHER_CRASHTEST_APPROVE"
"""``all``: every agent of the tree gets a person who approves each call it is asked about."""
_EFFECTS = ("read_only", "idempotent", "unsafe", "resumable")


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


class _ApproveAll:
    """The person of ``crash_test(approve="all")``: approves every call it is asked about."""

    async def decide(self, question: ApprovalQuestion) -> HumanDecision:
        return HumanDecision(True, "crashtest", None)

    def notify(self, text: str) -> None:
        return None


def _approve_all(agent: Agent, seen: set[int] | None = None) -> None:
    """Give ``agent`` and its subagents the person who approves everything."""
    seen = set() if seen is None else seen
    if id(agent) in seen:
        return
    seen.add(id(agent))
    agent.human = _ApproveAll()
    for sub in getattr(agent, "subagents", {}).values():
        _approve_all(sub, seen)


def _record_appends(store: Store) -> None:
    """Record each append of ``store`` that returned (run, seqs, kinds), in this process's order."""
    append = store.append

    def recorded(run_id: str, entries: Sequence[j.Entry], **kwargs: Any) -> int | None:
        result = append(run_id, entries, **kwargs)
        path = os.environ.get(LOG_ENV)
        if path and entries:
            ExecutionLog(path).record(
                event="append", run_id=run_id, seq=entries[0].seq, kinds=[e.kind for e in entries]
            )
        return result

    store.append = recorded  # type: ignore[method-assign]


# --------------------------------------------------------------------------------------------------
# Agents from a factory


def load_agent(spec: str) -> Agent:
    """The Agent named by ``module:attribute`` or ``path/file.py:attribute`` (an Agent or a callable).

    Raises:
        ValueError: the spec is malformed, cannot be imported, or does not give an Agent.
    """
    return _loading.load_agent(spec, _loading.FACTORY)


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
        if os.environ.get(_APPROVE_ENV) == "all":
            _approve_all(agent)
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

    from ...models import scripted  # what tether.testing imports (the harness never imports tether.testing)
    from ...stores import files, sqlite
    from ...tools import tool

    tool(warm)
    del scripted, files, sqlite
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
    failpoints = sys.modules.get("tether.stores._failpoints")
    if failpoints is not None:
        importlib.reload(failpoints)  # TETHER_FAILPOINT is read at import: read this child's
    sys.argv = ["-c", *request["argv"]]
    return _child_main(request["argv"])
