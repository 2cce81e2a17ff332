"""Agent: a model, its instructions and tools, and the ways to drive a run (DESIGN 3, 5)."""

from __future__ import annotations

import contextlib
import copy
import hashlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Generic, Literal, overload

import orjson

from . import budgets
from . import journal as j
from ._run.agent_spec import OnUnknown
from ._run.sync import handle_sigterm, run_sync
from .budgets import Price
from .events import EntryEvent, Event
from .humans import Human
from .messages import Message
from .models import Model, resolve_model
from .output import OutputSpec, output_spec
from .permissions import Decision, Rule, decide
from .state import State
from .stores.base import Lease, Store
from .stores.memory import MemoryStore
from .tools import ApprovalCondition, DepsT, Tool, ToolSource
from .tools import tool as make_tool
from .tracing import InstrumentSettings, check_setting
from .writing import JournalWriter

__all__ = ["Agent", "IfExists", "handle_sigterm"]

IfExists = Literal["error", "resume"]
"""What ``agent.run(prompt, id=X)`` does when run X exists: refuse it (ValueError), or resume it."""


class Agent(Generic[DepsT]):
    """A model, its instructions and tools, and where runs are kept.

    Args:
        model: ``"anthropic:<model>"``, ``"openai:<model>"`` or a Model object.
        instructions: the system instructions.
        tools: functions (wrapped with ``@tool`` if they are not already), Tool objects, Agents with a
            ``name`` and ``description`` (subagents: each call runs as a run of its own), or tool sources
            such as ``tether.mcp.MCPTools`` (their tools are listed when each drive starts).
        store: where runs are journaled; None keeps each run in memory only (it still gets an id).
        name: the agent's name, recorded in each run; a run resumes only with an agent of its name.
        description: what the agent does (used when it is a subagent).
        max_turns, max_tokens, max_cost: budgets over the whole run (cost in US dollars), checked before
            each model request; reaching one stops the run ``stopped`` with the reason.
        price: the model's price, needed for ``max_cost`` when tether does not know it.
        poll_interval: seconds between inbox reads while tools run or the model is asked.
        model_retries: how many retryable model errors in a row are retried before the run fails.
        retry_delay: the first retry's delay in seconds (doubling, with jitter; ``retry-after`` honoured).
        lease_ttl: lease length in seconds for stores with expiring leases (default: the store's ``ttl``).
        on_unknown: ``"abort"`` closes a cut-off ``unsafe`` call ``aborted``; ``"ask"`` asks a person.
        strict_resume: raise instead of journaling ``agent_changed`` when the run's agent differs.
        permissions: allow, deny and ask rules (``tether.permissions``).
        default_permission: the decision when no rule matches.
        on_text: called with each text delta while the model streams.
        human: asked about calls that need approval while this process drives the run (``TerminalHuman``,
            ``ScriptedHuman``); without one, such calls wait durably for a decision from anywhere.
        output_type: the type of the final answer (``state.output``); the model gives it by calling a
            ``final_result`` tool whose arguments are validated.
        output_retries: how many invalid final results are sent back to the model before the run fails
            with OutputValidationError.
        compact_at: compact automatically before a request once the context is estimated at this fraction
            of the model's window (the provider's last count plus an estimate of what was added since).
        context_window: the model's context window in tokens, when tether does not know it.
        instrument: trace this agent's runs with OpenTelemetry (``tether.tracing``): True uses the global
            tracer provider, ``InstrumentSettings(...)`` chooses the provider and whether content is
            recorded, False never traces; None (the default) follows ``tether.instrument()``.
        deps_type: the type of the ``deps`` each driving call passes (``ctx.deps`` in tools), for type
            checkers: ``Agent(..., deps_type=Deps)`` is an ``Agent[Deps]``. Nothing checks it at run time.

    Attributes:
        tools: the agent's tools by name (a read-only mapping; subagents included). Add one with
            ``@agent.tool``.
    """

    name: str
    description: str | None
    tools: Mapping[str, Tool]

    def __init__(
        self,
        model: str | Model,
        *,
        instructions: str = "",
        tools: Sequence[Tool | Agent | ToolSource | Callable[..., Any]] = (),
        store: Store | None = None,
        name: str = "agent",
        description: str | None = None,
        max_turns: int | None = None,
        max_tokens: int | None = None,
        max_cost: float | None = None,
        price: Price | None = None,
        poll_interval: float = 1.0,
        model_retries: int = 4,
        retry_delay: float = 0.5,
        lease_ttl: float | None = None,
        on_unknown: OnUnknown = "abort",
        strict_resume: bool = False,
        permissions: Sequence[Rule] = (),
        default_permission: Decision = "allow",
        on_text: Callable[[str], None] | None = None,
        human: Human | None = None,
        output_type: Any = None,
        output_retries: int = 2,
        compact_at: float | None = None,
        context_window: int | None = None,
        instrument: bool | InstrumentSettings | None = None,
        deps_type: type[DepsT] | None = None,
    ) -> None:
        self.model = resolve_model(model)
        self.instructions = instructions
        self.deps_type = deps_type
        self._tools: dict[str, Tool] = {}
        self.tools = MappingProxyType(self._tools)
        self.subagents: dict[str, Agent[Any]] = {}
        self._schemas: list[dict[str, Any]] = []
        self._sources: list[ToolSource] = []
        for item in tools:
            if isinstance(item, ToolSource):
                self._sources.append(item)
            elif isinstance(item, Agent):
                if item._sources:
                    raise ValueError(
                        f"subagent {item.name} has tool sources (MCPTools), which subagents do not support "
                        "yet. Fix: give those tools to the parent agent, or make the subagent's tools plain"
                    )
                from ._run.subagents import subagent_tool  # the driver loads on first use

                self._register(subagent_tool(item))
                self.subagents[item.name] = item
            else:
                self._register(item if isinstance(item, Tool) else make_tool(item))
        if store is not None and not isinstance(store, Store):
            raise TypeError(
                f"store {store!r} is not a tether Store. Fix: pass FileStore(path), open_store(url), ..."
            )
        self.store: Store | None = store
        self.name = name
        self.description = description
        for label, value in (("max_turns", max_turns), ("max_tokens", max_tokens), ("max_cost", max_cost)):
            if value is not None and (value <= 0 if label == "max_cost" else value < 1):
                raise ValueError(f"{label}={value} is not positive. Fix: pass a positive number, or None")
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.max_cost = max_cost
        self.price = price if price is not None else budgets.price_for(self.model.name, lazy=max_cost is None)
        if max_cost is not None and self.price is None:
            raise ValueError(
                f"no price for model {self.model.name}. Fix: pass price=Price(input=..., output=...) (US dollars "
                "per million tokens)"
            )
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive. Fix: pass seconds, e.g. 1.0")
        self.poll_interval = poll_interval
        self.model_retries = model_retries
        self.retry_delay = retry_delay
        self.lease_ttl = lease_ttl
        if on_unknown not in ("abort", "ask"):
            raise ValueError(f"on_unknown={on_unknown!r} is not known. Fix: pass 'abort' or 'ask'")
        self.on_unknown = on_unknown
        self.strict_resume = strict_resume
        self.permissions = list(permissions)
        self.default_permission = default_permission
        self.on_text = on_text
        if human is not None and not isinstance(human, Human):
            raise TypeError(
                f"human {human!r} is not a Human. Fix: pass TerminalHuman(), ScriptedHuman(...) or an object with decide() and notify()"
            )
        self.human = human
        self.output = output_spec(output_type) if output_type is not None else None
        self.output_retries = output_retries
        window = (
            context_window
            or getattr(self.model, "context_window", None)
            or (budgets.window_for(self.model.name) if compact_at is not None else None)
        )
        if compact_at is not None and not 0 < compact_at <= 1:
            raise ValueError(
                f"compact_at={compact_at} is not a fraction. Fix: pass a number in (0, 1], e.g. 0.8"
            )
        if compact_at is not None and window is None:
            raise ValueError(
                f"no context window known for model {self.model.name}. Fix: pass context_window=<tokens>"
            )
        self.compact_at = compact_at
        self.context_window = int(window or 0)
        self.instrument = check_setting(instrument)

    def __repr__(self) -> str:
        return f"Agent(name={self.name!r}, model={self.model.name!r}, tools={list(self.tools)})"

    # ----------------------------------------------------------------------------------------------
    # Tools

    @overload
    def tool(self, fn: Callable[..., Any], /) -> Tool: ...

    @overload
    def tool(
        self,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        effect: Literal["read_only", "idempotent", "unsafe"] = "unsafe",
        approval: bool | ApprovalCondition = False,
        timeout: float | None = None,
        max_attempts: int = 3,
    ) -> Callable[[Callable[..., Any]], Tool]: ...

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        effect: Literal["read_only", "idempotent", "unsafe"] = "unsafe",
        approval: bool | ApprovalCondition = False,
        timeout: float | None = None,
        max_attempts: int = 3,
    ) -> Tool | Callable[[Callable[..., Any]], Tool]:
        """Register a function as a tool of this agent: ``@agent.tool`` or ``@agent.tool(effect=...)``.

        Takes the options of ``tether.tool`` and returns the Tool (still callable like the function).

        Raises:
            TypeError: what is decorated is not a function (e.g. ``@agent.tool("name")``).
            ValueError: an invalid option, or the agent already has a tool of that name.
        """
        if fn is not None and (isinstance(fn, str) or not callable(fn)):
            raise TypeError(
                f"agent.tool got {fn!r}, not a function. Fix: decorate a def with @agent.tool, or pass "
                "options by keyword: @agent.tool(name=..., effect=...)"
            )
        decorate = make_tool(  # checks the effect now, not when a function comes
            name=name,
            description=description,
            effect=effect,
            approval=approval,
            timeout=timeout,
            max_attempts=max_attempts,
        )

        def register(target: Callable[..., Any]) -> Tool:
            if isinstance(target, str) or not callable(target):
                raise TypeError(f"@agent.tool(...) decorates a function, not {target!r}. Fix: decorate a def")
            return self._register(decorate(target))

        if isinstance(fn, Tool):  # a Tool made by @tool keeps its options
            return self._register(fn)
        return register if fn is None else register(fn)

    def _register(self, made: Tool) -> Tool:
        if made.name in self._tools:
            raise ValueError(f"two tools are named {made.name}. Fix: give one of them another name=")
        self._tools[made.name] = made
        self._schemas = [t.schema for t in self._tools.values()]
        return made

    @contextlib.asynccontextmanager
    async def _opened(self) -> AsyncIterator[Agent[DepsT]]:
        """This agent for one drive: its tool sources opened and their tools added (itself when it has none).

        The sources stay open until the drive ends (the run released); their tools join the copy's tools,
        schemas and fingerprint. A source that cannot open raises before the run is taken.
        """
        if not self._sources:
            yield self
            return
        async with contextlib.AsyncExitStack() as stack:
            bound = copy.copy(self)
            bound._tools = dict(self._tools)
            bound.tools = MappingProxyType(bound._tools)
            bound._sources = []
            for source in self._sources:
                for made in await stack.enter_async_context(source.open_tools()):
                    bound._register(made)
            yield bound

    # ----------------------------------------------------------------------------------------------
    # What the driver asks of its agent

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tool schemas the model is shown."""
        return self._schemas

    def unknown_tool_text(self, name: str) -> str:
        """What the model is told when it calls a tool this agent lacks."""
        known = ", ".join(self.tools) or "none"
        return f"tool {name} is not in this agent. Fix: call one of: {known}"

    def permission_for(self, tool: Tool, args: dict[str, Any]) -> tuple[Decision, str]:
        """The decision for a call of ``tool`` with validated ``args`` under this agent's rules."""
        return decide(tool, self.permissions, self.default_permission, args)

    def fingerprint(self) -> dict[str, Any]:
        """The model name and hashes of the instructions and tool schemas, recorded in ``run_started``."""
        tools = orjson.dumps(self._schemas, option=orjson.OPT_SORT_KEYS)
        return {
            "model": self.model.name,
            "instructions": hashlib.sha256(self.instructions.encode()).hexdigest()[:16],
            "tools": hashlib.sha256(tools).hexdigest()[:16],
        }

    def budgets(self) -> dict[str, Any]:
        """The limits recorded in ``run_started`` (and ``budgets_changed``)."""
        out: dict[str, Any] = {}
        if self.max_turns is not None:
            out["max_turns"] = self.max_turns
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        if self.max_cost is not None:
            out["max_cost"] = self.max_cost
        return out

    def budget_exceeded(self, state: State, inherited: dict[str, Any] | None = None) -> str | None:
        """Why no further model request is allowed, or None.

        ``inherited`` are a parent's remaining budgets, which a subagent's run must also keep to.
        """
        limits = budgets.tighter(self.budgets(), inherited) if inherited else self.budgets()
        return budgets.exceeded(limits, state.turn, state.usage, self.price)

    def retry_delay_for(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retrying a failed model request."""
        from ._run.model_step import backoff

        return backoff(attempt, self.retry_delay, retry_after)

    # ----------------------------------------------------------------------------------------------
    # Driving

    def run(
        self,
        prompt: str | Message | State,
        *,
        id: str | None = None,
        output_type: Any = None,
        deps: DepsT | None = None,
        metadata: dict[str, str] | None = None,
        if_exists: IfExists = "error",
    ) -> State:
        """Start a run (or continue a State) and drive it to its next stop. See ``arun``."""
        return run_sync(
            lambda: self.arun(
                prompt, id=id, output_type=output_type, deps=deps, metadata=metadata, if_exists=if_exists
            ),
            "run",
        )

    def resume(self, run_id: str, *, deps: DepsT | None = None) -> State:
        """Continue a run from its journal. See ``aresume``."""
        return run_sync(lambda: self.aresume(run_id, deps=deps), "resume")

    async def arun(
        self,
        prompt: str | Message | State,
        *,
        id: str | None = None,
        output_type: Any = None,
        deps: DepsT | None = None,
        metadata: dict[str, str] | None = None,
        if_exists: IfExists = "error",
    ) -> State:
        """Start a run from a prompt, or drive a State, to its next stop.

        A prompt creates a new run (an existing ``id`` is refused with ValueError before any model
        request, unless ``if_exists="resume"``). A State not yet in the store is created; a State loaded
        from the store is driven after its changes (``add_message``, ``approve``, ``deny``) are journaled.

        Args:
            prompt: the first user message (text or a Message), or a State.
            id: the new run's id (default: a new time-ordered id).
            output_type: the type of ``state.output`` for this run (default: the agent's).
            deps: this drive's dependencies (a database session, the current user): tools read them as
                ``ctx.deps``, a subagent's tools too. Never journaled: pass them again to ``resume``.
            metadata: string keys and values (at most 64 pairs, 4 KB) journaled in ``run_started``,
                inherited by subagents, listed in ``RunInfo.metadata`` and filtered by
                ``store.list(metadata=...)``; tools read them as ``ctx.metadata``.
            if_exists: ``"resume"`` makes the start idempotent: run ``id`` is created when it does not
                exist, resumed when it began with this prompt (a finished run is returned as it is), and
                refused (ValueError, naming both messages) when it began with another. A run another
                process drives is waited for. Two processes racing on one id end with one run.

        Raises:
            ValueError: the id exists (``if_exists="error"``), or began with another prompt; the State
                belongs to another store or agent; bad metadata.
            RunBusyError: another process drives the run.
            ConflictError: the State is stale (another process appended since it was loaded).
        """
        from ._run.drive import Drive

        output = output_spec(output_type) if output_type is not None else None
        async with self._opened() as agent:
            store, journal, lease, _ = await agent._take_for_run(prompt, id, output, metadata, if_exists)
            return await Drive(agent, store, journal, lease, output=output, deps=deps).run()

    async def aresume(self, run_id: str, *, deps: DepsT | None = None) -> State:
        """Continue a run from its journal, in any process: finished tools never run again.

        A completed or cancelled run is returned as it is (nothing written) unless its inbox holds items.
        ``deps`` are this drive's dependencies (``ctx.deps``); the journal never holds them.

        Raises:
            ValueError: no store, a run of another agent, or a subagent run (resume its root).
            RunBusyError: a live process drives the run.
        """
        from ._run import taking
        from ._run.drive import Drive

        store = self._require_store("resume")
        async with self._opened() as agent:
            journal, lease = await taking.take_existing(agent, store, run_id)
            return await Drive(agent, store, journal, lease, deps=deps).run()

    def compact(self, run: str | State) -> State:
        """Summarize a run's conversation so far and journal ``compacted``. See ``acompact``."""
        return run_sync(lambda: self.acompact(run), "compact")

    async def acompact(self, run: str | State) -> State:
        """Take the run, ask the model for a summary of it, journal ``compacted``, and release it.

        The context is then the first user message, the summary and the turns after it; the history
        keeps everything. Compaction falls between turns: a run with calls open is refused (ValueError).
        """
        from ._run import taking
        from ._run.drive import Drive

        store = self._require_store("compact")
        run_id = run.id if isinstance(run, State) else run
        journal, lease = await taking.take_existing(self, store, run_id)
        state = await Drive(self, store, journal, lease).run_compaction()
        if isinstance(run, State):
            await store.acatch_up(run)
        return state

    async def adrive(self, store: Store, lease: Lease, *, deps: DepsT | None = None) -> State:
        """Drive a run this process already holds (a Worker's ``claim_next``), then release it.

        The lease's owner writer id is the writer of what the drive appends. On a wrong agent or a subagent
        run the lease is abandoned and ValueError raised; a tool source that cannot open (an MCP server)
        abandons it too, and its error is raised.
        """
        from ._run import taking
        from ._run.drive import Drive

        async with contextlib.AsyncExitStack() as stack:
            try:
                agent = await stack.enter_async_context(self._opened())
            except BaseException:  # a tool source that cannot open: the run is not driven, so let it go
                await store.aabandon(lease)
                raise
            journal = await taking.take_held(agent, store, lease)
            return await Drive(agent, store, journal, lease, deps=deps).run()

    async def stream(
        self,
        prompt: str | Message | State,
        *,
        id: str | None = None,
        output_type: Any = None,
        deps: DepsT | None = None,
        metadata: dict[str, str] | None = None,
        if_exists: IfExists = "error",
    ) -> AsyncIterator[Event]:
        """Drive a run and yield its events: each entry after its append returned, and text deltas.

        The arguments are ``arun``'s. A consumer that stops iterating cancels the run as Ctrl+C does (it
        stays resumable).
        """
        import asyncio

        from ._run.drive import Drive

        output = output_spec(output_type) if output_type is not None else None
        async with self._opened() as agent:
            store, journal, lease, created = await agent._take_for_run(
                prompt, id, output, metadata, if_exists
            )
            queue: asyncio.Queue[Event | None] = asyncio.Queue()
            if created:  # the entries that created the run were appended before the drive: yield them first
                for entry in journal.state.history:
                    queue.put_nowait(EntryEvent(entry))
            drive = Drive(agent, store, journal, lease, emit=queue.put_nowait, output=output, deps=deps)
            task = asyncio.ensure_future(drive.run())
            task.add_done_callback(lambda _: queue.put_nowait(None))
            try:
                while True:
                    event = await queue.get()
                    if event is None:
                        break
                    yield event
                task.result()
            finally:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task

    def submit(
        self, prompt: str | Message, *, id: str | None = None, metadata: dict[str, str] | None = None
    ) -> State:
        """Create a run that no process drives yet (a worker or ``resume`` picks it up).

        ``metadata`` is journaled as ``arun``'s is.

        Raises:
            ValueError: no store, the id exists, or bad metadata.
        """
        store = self._require_store("submit")
        journal = self._submitted_run(prompt, id, metadata)
        state = journal.state
        store.create(state.id, journal.next_batch(), state.info())
        state.store_identity = store.identity
        return state

    async def asubmit(
        self, prompt: str | Message, *, id: str | None = None, metadata: dict[str, str] | None = None
    ) -> State:
        """``submit`` for async code: the run is created through the store's async face.

        Call it from a request handler: the event loop is not blocked while the store writes.

        Raises:
            ValueError: no store, the id exists, or bad metadata.
        """
        store = self._require_store("asubmit")
        journal = self._submitted_run(prompt, id, metadata)
        state = journal.state
        await store.acreate(state.id, journal.next_batch(), state.info())
        state.store_identity = store.identity
        return state

    def _submitted_run(
        self, prompt: str | Message, run_id: str | None, metadata: dict[str, str] | None
    ) -> JournalWriter:
        """A submitted run's first entries (a ``JournalWriter``), checked and not written yet."""
        from ._run import taking

        return taking.new_run(self, prompt, run_id, None, metadata=j.validate_metadata(metadata))

    # ----------------------------------------------------------------------------------------------
    # Taking runs

    def _require_store(self, what: str) -> Store:
        if self.store is None:
            raise ValueError(
                f"agent.{what}() needs a store. Fix: Agent(..., store=FileStore('runs')) or open_store(url)"
            )
        return self.store

    async def _take_for_run(
        self,
        prompt: str | Message | State,
        run_id: str | None,
        output: OutputSpec | None,
        metadata: dict[str, str] | None,
        if_exists: IfExists,
    ) -> tuple[Store, JournalWriter, Lease, bool]:
        """Take the run a driving call names; the last value says whether this call created it."""
        from ._run import taking

        store = self.store if self.store is not None else MemoryStore()
        meta = j.validate_metadata(metadata) if metadata is not None else None
        if if_exists not in ("error", "resume"):
            raise ValueError(f"if_exists={if_exists!r} is not known. Fix: pass 'error' or 'resume'")
        if isinstance(prompt, State) and prompt.history:
            if run_id is not None and run_id != prompt.id:
                raise ValueError(f"id={run_id!r} differs from the State's id {prompt.id!r}. Fix: drop id=")
            if meta is not None:
                raise ValueError(
                    f"run {prompt.id} exists; metadata is set when a run is created. Fix: drop metadata="
                )
            journal, lease = await taking.take_state(self, store, prompt)
            return store, journal, lease, False
        if if_exists == "resume":
            if run_id is None or isinstance(prompt, State):
                raise ValueError(
                    "if_exists='resume' needs a prompt and the run's id. Fix: agent.run(prompt, "
                    "id='order-42', if_exists='resume')"
                )
            j.validate_run_id(run_id)
            journal, lease, created = await taking.take_or_resume(self, store, prompt, run_id, output, meta)
            return store, journal, lease, created
        journal, lease = await taking.take_new(self, store, prompt, run_id, output, meta)
        return store, journal, lease, True

    def lease_ttl_for(self, store: Store) -> float | None:
        """The lease length this agent takes runs of ``store`` for (None: the store's lease is a lock)."""
        if store.ttl is None:
            return None  # the store's lease is a lock the OS drops
        return self.lease_ttl if self.lease_ttl is not None else store.ttl
