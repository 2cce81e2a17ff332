"""Worker: claims runs that need work through store leases and drives them (DESIGN 11).

A worker claims, with ``store.claim_next`` (``claim_next_batch`` where the store has it), the root of a
tree that needs work for one of its agents (a run submitted and not started, a ``running`` run no one
holds, a run with unconsumed inbox items, a ``waiting`` root whose child moved on), drives it to its next
stop with ``agent.adrive`` while the driver renews the lease, and releases it. Up to ``concurrency`` runs
are driven at once. It wakes on the store's ``wait_for_work`` (PostgreSQL LISTEN/NOTIFY) where there is
one, and polls every ``poll_interval`` seconds in any case, so it works on every store with
``claim_next`` (SQLiteStore, PostgresStore, MemoryStore).

Child runs are never claimed: their root's driver reaches them. On ``stop()`` (and SIGTERM with
``install_signal_handlers=True``) the worker stops claiming and cancels its drives as ``handle_sigterm``
does: in-flight ``unsafe`` calls are closed ``aborted``, other calls are left open for the next holder,
``run_released`` is written and each run released; then ``run``/``arun`` return. A drive whose lease was
taken over (the process paused past its ttl) has its next append refused (``LeaseLostError``): that run is
dropped and logged, and the worker goes on.

Logs (logger ``tether.worker``): a line per claim and per stop of a run, and when the worker starts and
stops.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._run.drive import lease_lost_in
from .errors import LeaseLostError, RunBusyError
from .stores.base import Lease, Owner, RunInfo, Store

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["DepsFactory", "Worker"]

log = logging.getLogger("tether.worker")

_CLAIMS_AT_ONCE = 16
"""Claims a worker makes at once when it has that many free slots."""

DepsFactory = Callable[[RunInfo], Any]
"""Makes the deps of one drive from the run's ``RunInfo`` (its id, agent, metadata...); may be async."""


class Worker:
    """Claims runs of its agents from a store and drives them, up to ``concurrency`` at once.

    Args:
        agents: the agents whose runs this worker drives, matched by ``Agent.name`` (unique here).
        store: a store with ``claim_next`` (defaults to ``agents[0].store`` when None).
        concurrency: how many runs are driven at once.
        lease_ttl: the lease length in seconds (default: the store's ``ttl``); drives renew every ttl/4.
        poll_interval: seconds between claims when nothing wakes the worker.
        owner_prefix: the worker's name in its log lines (default ``worker-HOST-PID``).
        deps: called with the ``RunInfo`` of each run the worker takes; what it returns (or, from an async
            function, resolves to) is that drive's deps (``ctx.deps`` in tools). A factory that raises
            leaves the run for a later claim, and the error is logged.

    Raises:
        ValueError: no agents, two agents with one name, a bad number, or a store without ``claim_next``.
    """

    def __init__(
        self,
        agents: Sequence[Agent],
        store: Store | None = None,
        *,
        concurrency: int = 4,
        lease_ttl: float | None = None,
        poll_interval: float = 2.0,
        owner_prefix: str | None = None,
        deps: DepsFactory | None = None,
    ) -> None:
        agents = list(agents)
        if deps is not None and not callable(deps):
            raise TypeError(
                f"deps={deps!r} is not callable. Fix: pass a function taking the RunInfo, e.g. "
                "deps=lambda info: Deps(user=info.metadata['user'])"
            )
        self.deps = deps
        if not agents:
            raise ValueError("Worker needs at least one agent. Fix: Worker([agent], store)")
        self.agents: dict[str, Agent] = {}
        for agent in agents:
            if agent.name in self.agents:
                raise ValueError(f"two agents are named {agent.name}. Fix: give each agent its own name=")
            self.agents[agent.name] = agent
        store = store if store is not None else agents[0].store
        if store is None or not callable(getattr(store, "claim_next", None)):
            raise ValueError(
                f"store {store!r} cannot hand out runs (no claim_next). Fix: use a SQLiteStore or PostgresStore"
            )
        if concurrency < 1:
            raise ValueError(f"concurrency={concurrency} is not positive. Fix: pass 1 or more")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval={poll_interval} is not positive. Fix: pass seconds, e.g. 2.0")
        self.store = store
        self.concurrency = concurrency
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self.name = owner_prefix or f"worker-{socket.gethostname()}-{os.getpid()}"
        self.claimed = 0
        """How many runs this worker has claimed."""
        self.lost = 0
        """How many of its drives lost their lease."""
        self._stop_requested = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._freed: asyncio.Event | None = None  # set when a drive ends
        self._tasks: dict[asyncio.Task[None], str] = {}

    def __repr__(self) -> str:
        return f"Worker({self.name!r}, agents={list(self.agents)}, concurrency={self.concurrency})"

    # ----------------------------------------------------------------------------------------------
    # Running and stopping

    def run(self, *, install_signal_handlers: bool = False, stop_when_idle: bool = False) -> None:
        """Claim and drive runs until ``stop()`` (or SIGTERM with ``install_signal_handlers``). See ``arun``."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("Worker.run() was called from a running event loop. Fix: await worker.arun()")
        asyncio.run(self._run_then_close(install_signal_handlers, stop_when_idle))

    async def _run_then_close(self, install_signal_handlers: bool, stop_when_idle: bool) -> None:
        """``arun``, then close what the store holds for this loop, which ends with ``run``."""
        try:
            await self.arun(install_signal_handlers=install_signal_handlers, stop_when_idle=stop_when_idle)
        finally:
            await self.store.aclose_loop()

    async def arun(self, *, install_signal_handlers: bool = False, stop_when_idle: bool = False) -> None:
        """Claim and drive runs until ``stop()``; return once every drive has released its run.

        Args:
            install_signal_handlers: SIGTERM stops the worker (main thread only).
            stop_when_idle: return when no run needs work and no drive is in progress.
        """
        loop = asyncio.get_running_loop()
        self._loop, self._wake, self._freed, self._tasks = loop, asyncio.Event(), asyncio.Event(), {}
        if install_signal_handlers:
            loop.add_signal_handler(signal.SIGTERM, self.stop)
        work = asyncio.Event()  # set by the waiting thread: a NOTIFY, or a poll interval passed
        threading.Thread(
            target=self._waiter, args=(loop, work), name="tether-worker-wait", daemon=True
        ).start()
        log.info("%s started: agents %s, concurrency %d", self.name, ", ".join(self.agents), self.concurrency)
        try:
            while not self._stop_requested.is_set():
                work.clear()  # before claiming: a wake-up that comes meanwhile makes the next wait return
                self._freed.clear()  # likewise a drive that ends meanwhile
                idle = await self._claim_while_free()
                if self._stop_requested.is_set() or (stop_when_idle and idle and not self._tasks):
                    break
                events = [self._wake, self._freed] + ([work] if len(self._tasks) < self.concurrency else [])
                waits = {asyncio.ensure_future(event.wait()) for event in events}  # not each drive's task
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for future in waits:
                    future.cancel()
        finally:
            self._stop_requested.set()
            await self._close_drives()
            if install_signal_handlers:
                loop.remove_signal_handler(signal.SIGTERM)
            self._loop = None
            log.info("%s stopped (claimed %d runs)", self.name, self.claimed)

    def _waiter(self, loop: asyncio.AbstractEventLoop, work: asyncio.Event) -> None:
        """The waiting thread: wake the loop on the store's NOTIFY (``wait_for_work``) or every poll interval."""
        wait = getattr(self.store, "wait_for_work", None)
        while not self._stop_requested.is_set():
            try:
                if callable(wait):
                    wait(self.poll_interval)
                else:
                    self._stop_requested.wait(self.poll_interval)
            except Exception as exc:  # never fatal: polling goes on
                log.warning("%s: waiting for work failed: %s", self.name, exc)
                self._stop_requested.wait(self.poll_interval)
            try:
                loop.call_soon_threadsafe(work.set)
            except RuntimeError:  # the loop is closed: the worker has stopped
                return

    def stop(self) -> None:
        """Stop claiming and close every drive (thread-safe; callable from a signal handler)."""
        self._stop_requested.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    async def _close_drives(self) -> None:
        """Cancel the drives (each closes its steps, saves and releases) and wait for them."""
        tasks = list(self._tasks)
        if tasks:
            log.info("%s stopping: closing %d drive(s)", self.name, len(tasks))
        for task in tasks:
            task.cancel()
        while tasks:
            try:
                await asyncio.gather(*tasks, return_exceptions=True)
                break
            except asyncio.CancelledError:  # cancelled again (a second Ctrl+C): the drives still finish
                continue

    # ----------------------------------------------------------------------------------------------
    # Claiming and driving

    async def _claim_while_free(self) -> bool:
        """Claim until ``concurrency`` drives run or none needs work; True when none needed work.

        The free slots are claimed for together: in one statement on a store with ``aclaim_next_batch``
        (PostgresStore), else up to ``_CLAIMS_AT_ONCE`` claims at a time, each its own ``claim_next``, so a
        store that commits concurrent writes together (SQLiteStore's group commit) fills them in a few
        commits rather than one after another.
        """
        names = list(self.agents)
        ttl = self.lease_ttl if self.lease_ttl is not None else self.store.ttl
        batch = getattr(self.store, "aclaim_next_batch", None)
        while len(self._tasks) < self.concurrency and not self._stop_requested.is_set():
            if callable(batch):
                wanted = self.concurrency - len(self._tasks)
                try:
                    leases = await batch([Owner.here() for _ in range(wanted)], ttl, agents=names)
                except Exception as exc:  # a store that is down: try again at the next wake-up or poll
                    log.warning("%s could not claim a run: %s", self.name, exc)
                    return False
                for lease in leases:
                    self._start_drive(lease)
                if len(leases) < wanted:
                    return True
                continue
            wanted = min(self.concurrency - len(self._tasks), _CLAIMS_AT_ONCE)
            claims = [self.store.aclaim_next(Owner.here(), ttl, agents=names) for _ in range(wanted)]
            outcomes = await asyncio.gather(*claims, return_exceptions=True)
            idle = failed = False
            for outcome in outcomes:
                if isinstance(
                    outcome, Exception
                ):  # a store that is down: try again at the next wake-up or poll
                    if not failed:
                        log.warning("%s could not claim a run: %s", self.name, outcome)
                    failed = True
                elif isinstance(outcome, BaseException):
                    raise outcome
                elif outcome is None:
                    idle = True
                else:
                    self._start_drive(outcome)
            if failed:
                return False
            if idle:
                return True
        return False

    def _start_drive(self, lease: Lease) -> None:
        self.claimed += 1
        task = asyncio.ensure_future(self._drive(lease))
        self._tasks[task] = lease.run_id
        task.add_done_callback(self._drive_done)

    def _drive_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
        if self._freed is not None:
            self._freed.set()  # a slot is free: the loop claims again
        if self._wake is not None and self._stop_requested.is_set():
            self._wake.set()

    async def _info_for(self, lease: Lease) -> RunInfo | None:
        """The claimed root's listing record (its tree's runs are paged through until it is found)."""
        cursor: str | None = None
        while True:
            page, cursor = await self.store.alist_page(root_id=lease.run_id, limit=100, cursor=cursor)
            found = next((info for info in page if info.id == lease.run_id), None)
            if found is not None or cursor is None:
                return found

    async def _agent_for(self, info: RunInfo | None, lease: Lease) -> Agent | None:
        if len(self.agents) == 1:
            return next(iter(self.agents.values()))
        name = info.agent if info is not None else None
        if name is None:
            entries = await self.store.aread(lease.run_id)
            name = getattr(entries[0], "agent", None) if entries else None
        return self.agents.get(name or "")

    async def _deps_for(self, info: RunInfo | None, lease: Lease) -> Any:
        """The drive's deps from the factory (None without one)."""
        if self.deps is None:
            return None
        if info is None:
            raise LookupError(f"run {lease.run_id} is not listed, so no RunInfo can be given to deps")
        made = self.deps(info)
        return await made if inspect.isawaitable(made) else made

    async def _drive(self, lease: Lease) -> None:
        run_id = lease.run_id
        try:
            info = await self._info_for(lease) if self.deps is not None or len(self.agents) > 1 else None
            agent = await self._agent_for(info, lease)
            deps = await self._deps_for(info, lease) if agent is not None else None
        except BaseException as exc:
            await self.store.aabandon(lease)
            if not isinstance(exc, Exception):
                return
            log.warning(
                "%s could not start run %s (reading it, or making its deps): %s", self.name, run_id, exc
            )
            return
        if agent is None:
            log.error("%s claimed run %s of an agent it does not have; released it", self.name, run_id)
            await self.store.aabandon(lease)
            return
        log.info("%s claimed run %s (agent %s, token %d)", self.name, run_id, agent.name, lease.token)
        try:
            state = await agent.adrive(self.store, lease, deps=deps)
        except LeaseLostError as exc:
            self.lost += 1
            log.warning("%s lost its lease on run %s; dropped it (%s)", self.name, run_id, exc)
        except asyncio.CancelledError as exc:
            why = "worker stopping" if self._stop_requested.is_set() else "drive cancelled"
            if (lost := lease_lost_in(exc)) is not None:  # paused past its lease: another holder took the run
                self.lost += 1
                log.warning("%s lost its lease on run %s before it stopped (%s); dropped it (%s)", self.name,
                            run_id, why, lost)  # fmt: skip
            else:
                log.info("%s released run %s (%s)", self.name, run_id, why)
        except RunBusyError as exc:
            log.warning("%s stopped run %s: %s", self.name, run_id, exc)
        except Exception:
            log.exception("%s: driving run %s failed", self.name, run_id)
        else:
            answer = f": {state.answer[:60]!r}" if state.status == "completed" and state.answer else ""
            log.info("%s stopped run %s: %s%s", self.name, run_id, state.status, answer)
