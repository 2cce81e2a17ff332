"""Runs for the run inspector's tests: a waiting run, a finished one with HTML in a tool result."""

from __future__ import annotations

from tether import Agent, tool
from tether.stores.base import Store
from tether.testing import ScriptedModel, call

EVIL = "<script>alert('x')</script><b>bold</b>"


@tool(approval=True)
def refund(amount: int, note: str = "none") -> str:
    """Refund an amount (needs a person's approval)."""
    return f"refunded {amount} ({note})"


@tool(effect="read_only")
def fetch_page(url: str) -> str:
    """Fetch a page: its text is untrusted."""
    return EVIL


def refund_agent(store: Store, replies: list[object] | None = None) -> Agent[None]:
    replies = replies if replies is not None else [call("refund", amount=500, note="damaged"), "refund done"]
    return Agent(ScriptedModel(replies), name="shop", tools=[refund], store=store, poll_interval=0.05)


def seed(store: Store) -> dict[str, str]:
    """Three runs: ``w1`` waits for approval of a refund, ``page1`` completed with HTML in its tool result,
    ``m1`` completed with metadata ``user=u42``. Returns run id -> the waiting call id (for ``w1``)."""
    waiting = refund_agent(store).run("Refund order 17, it arrived broken", id="w1")
    fetcher = Agent(
        ScriptedModel([call("fetch_page", url="http://example.com"), "the page says hello"]),
        name="reader",
        tools=[fetch_page],
        store=store,
    )
    fetcher.run("Read example.com", id="page1")
    Agent(ScriptedModel(["hi"]), name="greeter", store=store).run("hello", id="m1", metadata={"user": "u42"})
    return {"w1": waiting.pending_approvals[0].call_id}
