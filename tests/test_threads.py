"""Tests for tether._threads: the daemon threads that run store I/O and sync tools for an event loop."""

from __future__ import annotations

import asyncio
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

    async def main() -> set[int]:
        return {await threads.run(threading.get_ident) for _ in range(20)}

    assert len(asyncio.run(main())) == 1
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
