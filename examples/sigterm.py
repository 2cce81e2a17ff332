"""Stop cleanly on SIGTERM (ported from alpineagents' "Survive crashes and restarts").

``docker stop`` and Kubernetes send SIGTERM before they kill a process. ``tether.handle_sigterm()`` turns
it into cancellation of the run: a call in flight that is ``unsafe`` is closed ``aborted``, the others are
left for a resume, ``run_released`` is written, and the process exits with code 143. Resume it later with
the same id.
"""

from __future__ import annotations

import os
import time

import tether
from tether import Agent, FileStore, Message, State, tool
from tether.testing import ScriptedModel, call


@tool(effect="idempotent")
def collect_figures(day: str) -> str:
    """Collect the figures of a day for the nightly report.

    Args:
        day: The day, as YYYY-MM-DD.
    """
    time.sleep(float(os.environ.get("COLLECT_SECONDS", "0")))
    return f"{day}: 1,204 orders, 3 refunds"


def build_agent() -> Agent:
    """The nightly-report agent."""
    return Agent(
        model=os.environ.get("TETHER_MODEL")
        or ScriptedModel(
            [call("collect_figures", day="2026-11-28"), "Nightly report: 1,204 orders, 3 refunds."]
        ),
        name="reporter",
        tools=[collect_figures],
        store=FileStore(".agent-runs"),
        poll_interval=0.1,
    )


if __name__ == "__main__":
    tether.handle_sigterm()
    agent = build_agent()
    store = agent.store
    assert store is not None
    if store.exists("nightly-report"):
        state = agent.resume("nightly-report")
    else:
        state = agent.run(State(id="nightly-report", messages=[Message.user("Write the nightly report")]))
    print("status:", state.status)
    print("answer:", state.answer)
