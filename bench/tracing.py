"""Per-turn cost of tracing (DESIGN 15): off, on without an SDK, on with the SDK, against off in the same run.

Each turn is one model reply with one sync tool call and its result, on a MemoryStore (no disk: what is
measured is the driver's CPU, where tracing's cost would show). Four ways, interleaved in every repeat so
drift hits all of them alike; the figure is the median over the repeats of the time per turn:

- ``off``: no ``instrument=`` and no ``tether.instrument()`` (the baseline: every other way is compared
  with it);
- ``on, no SDK``: ``Agent(instrument=True)`` with only ``opentelemetry-api`` (no tracer provider set);
- ``on, SDK, no-op exporter``: an SDK ``TracerProvider`` with a ``BatchSpanProcessor`` over an exporter
  that drops every span (what a deployment pays before its exporter's own cost);
- the same with ``include_content=True``.

Off runs the same driver code as on, with a no-op recorder chosen once per drive: what off adds to a turn
is the calls into that recorder. The script counts them (a counting recorder in one extra run), times one
such call, and prints their product per turn beside the turn's time and the spread of the off runs
themselves: "nothing measurable" means that product is far below that spread.

    python bench/tracing.py                  # 300 turns, 9 repeats
    python bench/tracing.py --turns 1000 --repeats 15
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import timeit
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from tether import Agent, MemoryStore, tool
from tether._run import drive as drive_module
from tether._run import spans
from tether.testing import ScriptedModel, call
from tether.tracing import InstrumentSettings


@tool(effect="read_only")
def lookup(n: int) -> str:
    """Look a number up.

    Args:
        n: The number.
    """
    return f"result {n}"


class DropAll(SpanExporter):
    """An exporter that drops every span."""

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def per_turn(turns: int, instrument: bool | InstrumentSettings | None) -> float:
    """Seconds per turn of one run of ``turns`` one-call turns."""
    replies: list[object] = [call("lookup", n=i) for i in range(turns)]
    replies.append("done")
    agent = Agent(
        ScriptedModel(replies),
        name="bench",
        tools=[lookup],
        store=MemoryStore(),
        poll_interval=5.0,
        instrument=instrument,
    )
    gc.collect()
    start = time.perf_counter()
    state = agent.run("go")
    elapsed = time.perf_counter() - start
    assert state.status == "completed", state.status
    return elapsed / turns


class CountingSpan(spans.NoSpan):
    __slots__ = ()

    def task(self, coro: Any) -> Any:
        COUNTS["span"] += 1
        return super().task(coro)

    def wrap(self, fn: Any) -> Any:
        COUNTS["span"] += 1
        return fn

    def run(self, awaitable: Any) -> Any:
        COUNTS["span"] += 1
        return awaitable

    def error(self, exc: BaseException) -> None:
        COUNTS["span"] += 1


class CountingTrace(spans.NoTrace):
    """The off recorder, counting the calls the driver makes into it."""

    __slots__ = ()

    def enter(self) -> None:
        COUNTS["trace"] += 1

    def failed(self, exc: BaseException) -> None:
        COUNTS["trace"] += 1

    def end(self) -> None:
        COUNTS["trace"] += 1

    def chat(self, request: Any, purpose: str | None = None) -> spans.NoSpan:
        COUNTS["trace"] += 1
        return COUNTING_SPAN

    def tool_started(self, entry: Any, args: Any) -> None:
        COUNTS["trace"] += 1

    def tool(self, call_id: str) -> spans.NoSpan:
        COUNTS["trace"] += 1
        return COUNTING_SPAN

    def journaled(self, batch: Any) -> None:
        COUNTS["trace"] += 1

    def recovered(self, calls: Any, agent: Any) -> None:
        COUNTS["trace"] += 1


COUNTS = {"trace": 0, "span": 0}
COUNTING_SPAN = CountingSpan()


def recorder_calls_per_turn(turns: int) -> float:
    """How many calls into the off recorder one turn makes."""
    real = drive_module.drive_trace
    drive_module.drive_trace = lambda agent, state: CountingTrace()  # type: ignore[assignment]
    try:
        per_turn(turns, None)
    finally:
        drive_module.drive_trace = real
    return (COUNTS["trace"] + COUNTS["span"]) / turns


def noop_call_cost() -> float:
    """Seconds of the dearest call into the off recorder (median of 7 timings of 200,000 calls)."""
    trace, span = spans.NO_TRACE, spans.NO_SPAN
    calls: list[Callable[[], object]] = [
        lambda: trace.tool("c1_0"),
        lambda: trace.journaled(()),
        lambda: span.wrap(len),
        lambda: span.run(None),  # type: ignore[arg-type]
        lambda: trace.tool_started(None, None),  # type: ignore[arg-type]
    ]
    empty = min(timeit.repeat(lambda: None, number=200_000, repeat=7)) / 200_000
    return max(min(timeit.repeat(fn, number=200_000, repeat=7)) / 200_000 - empty for fn in calls)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(DropAll()))
    ways: dict[str, bool | InstrumentSettings | None] = {
        "off (baseline)": None,
        "on, no SDK": True,
        "on, SDK, no-op exporter": InstrumentSettings(tracer_provider=provider),
        "on, SDK, no-op exporter, content": InstrumentSettings(
            tracer_provider=provider, include_content=True
        ),
    }
    for setting in ways.values():  # warm-up: imports, threads, code paths
        per_turn(50, setting)
    times: dict[str, list[float]] = {name: [] for name in ways}
    order = list(ways)
    for repeat in range(args.repeats):
        for name in order[repeat % len(order) :] + order[: repeat % len(order)]:  # each way first in turn
            times[name].append(per_turn(args.turns, ways[name]))
    provider.shutdown()
    calls = recorder_calls_per_turn(args.turns)
    call_cost = noop_call_cost()

    print(
        f"python {sys.version.split()[0]}, {args.turns} turns (one sync tool call each), MemoryStore, "
        f"{args.repeats} repeats interleaved"
    )
    base = statistics.median(times["off (baseline)"])
    base_min = min(times["off (baseline)"])
    print(f"{'way':36} {'median us/turn':>14} {'vs off':>7} {'min us/turn':>11} {'vs off':>7}")
    for name, values in times.items():
        median, low = statistics.median(values), min(values)
        print(
            f"{name:36} {median * 1e6:14.1f} {median / base:6.3f}x {low * 1e6:11.1f} {low / base_min:6.3f}x"
        )
    off = sorted(times["off (baseline)"])
    spread = (off[(len(off) * 3) // 4] - off[len(off) // 4]) / base
    off_cost = calls * call_cost
    print(
        f"off: {calls:.1f} calls into the no-op recorder per turn x {call_cost * 1e9:.0f} ns (the dearest) "
        f"= {off_cost * 1e6:.2f} us/turn, {off_cost / base * 100:.3f}% of a turn; the off runs' own "
        f"interquartile spread: {spread * 100:.1f}%"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
