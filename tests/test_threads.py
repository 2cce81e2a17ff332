"""Tests for tether._threads: the daemon threads that run store I/O and sync tools for an event loop."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from tether._threads import Threads


def test_without_a_limit_every_job_gets_a_thread_at_once() -> None:
    threads = Threads("test-unlimited")
    barrier = threading.Barrier(5, timeout=5)  # passes only when all five jobs run at the same time

    async def main() -> list[int]:
        return list(await asyncio.gather(*(threads.run(barrier.wait) for _ in range(5))))

    assert sorted(asyncio.run(main())) == [0, 1, 2, 3, 4]
    threads.shutdown()


def test_with_a_limit_jobs_beyond_it_wait_for_a_free_thread_and_all_finish() -> None:
    threads = Threads("test-limited", limit=2)
    lock = threading.Lock()
    running, most = 0, 0

    def job(n: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)
        with lock:
            running -= 1
        return n

    async def main() -> list[int]:
        return list(await asyncio.gather(*(threads.run(job, n) for n in range(8))))

    assert asyncio.run(main()) == list(range(8))
    assert most == 2
    threads.shutdown()


def test_an_idle_thread_is_reused() -> None:
    threads = Threads("test-reuse")

    async def main() -> list[int]:
        used = []
        for _ in range(20):
            used.append(await threads.run(threading.get_ident))
            # A thread marks itself idle just after reporting back; once it has, it gets the next job.
            while not threads._idle:
                await asyncio.sleep(0.001)
        return used

    used = asyncio.run(main())
    assert len(set(used)) == 1, used
    threads.shutdown()


def test_an_exception_reaches_the_awaiting_task() -> None:
    threads = Threads("test-raise")

    def fail() -> None:
        raise OSError("disk full")

    async def main() -> None:
        await threads.run(fail)

    with pytest.raises(OSError, match="disk full"):
        asyncio.run(main())
    threads.shutdown()


def test_a_job_made_on_the_loop_can_be_submitted_from_another_thread() -> None:
    threads = Threads("test-job")

    async def main() -> str:
        job, future = threads.job(str.upper, "started elsewhere")
        threading.Thread(target=threads.submit, args=(job,)).start()
        return await future

    assert asyncio.run(main()) == "STARTED ELSEWHERE"
    threads.shutdown()


def test_shutdown_stops_idle_threads() -> None:
    threads = Threads("test-shutdown")

    async def main() -> None:
        await asyncio.gather(*(threads.run(time.sleep, 0.01) for _ in range(3)))

    asyncio.run(main())
    assert sum(t.name == "test-shutdown" for t in threading.enumerate()) == 3
    threads.shutdown()
    deadline = time.monotonic() + 5
    while any(t.name == "test-shutdown" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == "test-shutdown" for t in threading.enumerate())


def test_then_runs_on_the_same_thread_after_the_result_is_reported_and_outside_the_limit() -> None:
    threads = Threads("test-then", limit=1)
    reported = threading.Event()
    ran_on: list[int] = []

    def after() -> None:
        ran_on.append(threading.get_ident())
        assert reported.wait(5), "the job's result reached the loop before this ran to its end"

    def job() -> int:
        threads.then(after, otherwise=lambda _: None)
        return threading.get_ident()

    async def main() -> tuple[int, int]:
        appended_on = await threads.run(job)
        # ``after`` is still running on that thread (it waits for ``reported``): with a limit of 1 this job
        # only runs because ``after`` does not count toward the limit.
        other = await asyncio.wait_for(threads.run(threading.get_ident), 5)
        reported.set()
        return appended_on, other

    appended_on, other = asyncio.run(main())
    deadline = time.monotonic() + 5
    while not ran_on and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran_on == [appended_on] and other != appended_on
    threads.shutdown()


def test_then_off_the_pool_hands_the_callable_to_otherwise() -> None:
    threads = Threads("test-then-off")
    handed: list[object] = []

    def after() -> None:
        pass

    threads.then(after, otherwise=handed.append)
    assert handed == [after]


def test_a_task_cancelled_while_awaiting_run_through_sees_it_only_once_the_call_returned() -> None:
    threads = Threads("test-through")
    release = threading.Event()
    seen: dict[str, object] = {}

    def append() -> str:
        release.wait(5)
        return "appended"

    async def waiter(future: asyncio.Future[str]) -> None:
        try:
            await future
        except asyncio.CancelledError:
            seen["done_when_cancelled"] = future.done()
            seen["result"] = future.result()
            raise

    async def main() -> None:
        future = threads.run_through(append)
        task = asyncio.ensure_future(waiter(future))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.sleep(0.05)
        seen["task_done_before_release"] = task.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert seen == {"task_done_before_release": False, "done_when_cancelled": True, "result": "appended"}
    threads.shutdown()


def test_a_forked_child_starts_its_own_threads() -> None:
    threads = Threads("test-fork")

    async def ident() -> int:
        return await threads.run(threading.get_ident)

    asyncio.run(ident())  # the parent now has an idle thread, which a forked child does not
    pid = os.fork()
    if pid == 0:  # the child: a job must run, not wait for the parent's thread
        code = 1

        async def upper() -> str:
            return await asyncio.wait_for(threads.run(str.upper, "ran"), 5)

        try:
            code = 0 if asyncio.run(upper()) == "RAN" else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    threads.shutdown()


def test_a_thread_that_cannot_start_leaves_the_pool_able_to_run_the_next_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads = Threads("test-no-start", limit=1)
    real_start = threading.Thread.start
    failures = [RuntimeError("can't start new thread")]

    def start(self: threading.Thread) -> None:
        if failures:
            raise failures.pop()
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        threads.submit(lambda: None)

    async def main() -> str:
        return await asyncio.wait_for(threads.run(str.upper, "next"), 5)

    assert asyncio.run(main()) == "NEXT", "the failed start gave its place in the limit back"
    threads.shutdown()
