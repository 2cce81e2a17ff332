"""Daemon threads that run blocking work for an event loop: the store's I/O and sync tools (DESIGN 5.3).

``Threads`` keeps idle threads and reuses them, so a step does not pay for a new thread, and hands each
job over with one queue put; the result comes back with one ``call_soon_threadsafe``. That is about half
the cost of ``loop.run_in_executor`` per trip, which matters because a turn makes several.

Without a ``limit`` every job gets a thread of its own at once (an idle one or a new one): a slow job
never delays another. With a ``limit``, jobs beyond it wait for the first thread that frees up.

A job may hand its thread on (``then``): after the job reports back, the same thread runs one more
callable outside the pool, not counted in its limit, so the work that follows needs no other thread to
wake up (the store's thread starts a sync tool right after the append that made its start durable).

``LoopThread`` is the other direction: an event loop on a daemon thread of its own, on which sync callers
run coroutines (the sync face of a store that implements only async primitives).
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import asyncio  # each use imports it: ``import tether`` loads no asyncio (DESIGN 13: import time)

__all__ = ["LoopThread", "Threads"]

log = logging.getLogger("tether")

T = TypeVar("T")

_IDLE_SECONDS = 30.0


class Threads:
    """A pool of daemon threads named ``name``; idle ones retire after 30 s."""

    def __init__(self, name: str, limit: int | None = None) -> None:
        self.name = name
        self.limit = limit
        self._reset()
        _POOLS.add(self)

    def _reset(self) -> None:
        """Empty: no threads (at creation, and in a forked child, where the parent's threads do not exist)."""
        self._lock = threading.Lock()
        self._count = 0  # threads in the pool (not those running a ``then`` outside it)
        self._idle: list[_Inbox] = []  # the job queue of each idle thread; a job goes to exactly one
        self._backlog: collections.deque[Callable[[], None]] = collections.deque()  # beyond the limit
        self._closed = False  # shut down: threads end after their job instead of waiting for another
        self._local = threading.local()  # on the pool's threads: ``then``, what runs after the current job

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on a thread of the pool; it must not raise.

        Raises:
            RuntimeError: no thread could be started (the job was not taken).
        """
        with self._lock:
            self._closed = False
            if self._idle:
                inbox: _Inbox | None = self._idle.pop()
            elif self.limit is None or self._count < self.limit:
                self._count += 1
                inbox = None
            else:
                self._backlog.append(job)
                return
        if inbox is not None:
            inbox.put(job)
            return
        try:
            self._start(job)
        except RuntimeError:  # no thread could be started: the job was not taken, and counts for nothing
            with self._lock:
                self._count -= 1
            raise

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Call ``fn(*args)`` on a thread; the returned future (of the running loop) settles with it.

        A result that comes back after the loop closed is dropped and logged.
        """
        job, future = self.job(fn, *args)
        self.submit(job)
        return future

    def run_through(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``run``, but cancelling the task that awaits the future does not cancel the future.

        The task sees its ``CancelledError`` only once ``fn`` has returned, and the future then holds the
        outcome: an append in progress always completes, and its caller knows how it ended.
        """
        job, future = self.job(fn, *args, through=True)
        self.submit(job)
        return future

    def job(
        self, fn: Callable[..., T], *args: Any, through: bool = False
    ) -> tuple[Callable[[], None], asyncio.Future[T]]:
        """``run`` in two steps: the job to ``submit`` later (from any thread) and the future it settles.

        Call it on the event loop's thread. A job never submitted leaves its future pending. ``through``:
        the future is not cancelled with its awaiter (see ``run_through``).
        """
        import asyncio  # here, not at the top: ``import tether`` loads no asyncio (DESIGN 13)

        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = _through_future(loop) if through else loop.create_future()

        def job() -> None:
            try:
                value = fn(*args)
            except BaseException as exc:  # delivered to the awaiting task
                outcome: tuple[Any, BaseException | None] = (None, exc)
            else:
                outcome = (value, None)
            try:
                loop.call_soon_threadsafe(_settle, future, *outcome)
            except RuntimeError:  # the loop is closed: no one waits for this result any more
                log.info(
                    "%s finished after its event loop closed; result dropped", getattr(fn, "__name__", fn)
                )

        return job, future

    def then(self, after: Callable[[], None], otherwise: Callable[[Callable[[], None]], None]) -> None:
        """Run ``after`` on this thread once the current job has reported back, outside the pool's limit.

        Called from a job on one of this pool's threads (one ``after`` per job); anywhere else, ``after``
        is passed to ``otherwise`` instead. ``after`` must not raise.
        """
        local = self._local
        if getattr(local, "in_pool", False) and getattr(local, "after", None) is None:
            local.after = after
        else:
            otherwise(after)

    def shutdown(self) -> None:
        """Stop the idle threads; busy ones end after their job. A later ``submit`` starts threads again."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
        for inbox in idle:
            inbox.put(None)

    def _start(self, job: Callable[[], None]) -> None:
        """A new thread of the pool, whose first job is ``job`` (the caller has counted it)."""
        threading.Thread(target=self._work, args=(job,), name=self.name, daemon=True).start()

    def _work(self, job: Callable[[], None] | None) -> None:
        self._local.in_pool = True
        inbox: _Inbox = queue.SimpleQueue()
        while job is not None:
            job()
            after, self._local.after = getattr(self._local, "after", None), None
            if after is not None and not self._step_out(after):
                return
            with self._lock:
                if self._backlog:
                    job = self._backlog.popleft()
                    continue
                if self._closed:
                    self._count -= 1
                    return
                self._idle.append(inbox)
            try:
                job = inbox.get(timeout=_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:  # retire; otherwise a job was just handed to it
                        self._idle.remove(inbox)
                        self._count -= 1
                        return
                job = inbox.get()

    def _step_out(self, after: Callable[[], None]) -> bool:
        """Run ``after`` on this thread outside the pool; returns whether the thread rejoined it."""
        with self._lock:
            self._count -= 1
            waiting = self._backlog.popleft() if self._backlog else None
            if waiting is not None:  # the job this thread would have taken next goes to a new thread
                self._count += 1
        if waiting is not None:
            try:
                self._start(waiting)
            except RuntimeError:  # no thread could be started: the job waits for the next free thread
                with self._lock:
                    self._count -= 1
                    self._backlog.appendleft(waiting)
        after()
        with self._lock:
            if self._closed or (self.limit is not None and self._count >= self.limit):
                return False  # shut down, or the pool filled up meanwhile: this thread ends
            self._count += 1
            return True


_Inbox = queue.SimpleQueue  # a thread's own job queue: a job, or None to stop

_POOLS: weakref.WeakSet[Threads] = weakref.WeakSet()


class LoopThread:
    """An event loop running on a daemon thread named ``name``, started on first use.

    ``run`` blocks the calling thread until a coroutine has run to its end on that loop. In a forked child
    the parent's thread does not exist: the first ``run`` there starts a new one.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop's thread and return its result (or raise its exception).

        Raises:
            RuntimeError: called from the loop's own thread (it would wait for itself).
        """
        import asyncio

        loop = self._running_loop()
        if threading.current_thread().name == self.name and asyncio._get_running_loop() is loop:
            coro.close()
            raise RuntimeError(
                f"a sync store call was made on {self.name}, the thread of the store's own event loop. "
                "Fix: await the store's a-prefixed twin in async code"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid() or self._loop.is_closed():
                import asyncio

                loop = asyncio.new_event_loop()
                threading.Thread(target=_serve, args=(loop,), name=self.name, daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def close(self) -> None:
        """Stop the loop and its thread (a later ``run`` starts them again)."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None and self._pid == os.getpid() and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    import asyncio

    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


def _after_fork_in_child() -> None:
    for pool in list(_POOLS):
        pool._reset()


os.register_at_fork(after_in_child=_after_fork_in_child)


_THROUGH: list[type[asyncio.Future[Any]]] = []  # the class ``_through_future`` makes, once


def _through_future(loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
    """A future of ``loop`` that refuses ``cancel``: a task cancelled while awaiting it is cancelled once it
    settles (``Threads.run_through``)."""
    if not _THROUGH:
        import asyncio

        class _Through(asyncio.Future[Any]):
            def cancel(self, msg: Any = None) -> bool:
                return False

        _THROUGH.append(_Through)
    return _THROUGH[0](loop=loop)


def _settle(future: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if future.done():  # cancelled meanwhile (a timeout, an interrupt): the caller no longer waits
        if exc is None:
            log.info("a result arrived after its caller stopped waiting; dropped")
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)
