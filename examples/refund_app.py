"""A small web app on tether: a Starlette endpoint starts one run per request, and a worker drives the rest.

- ``POST /refunds`` ``{"order": "o1", "amount": 40, "user": "u42"}`` starts run ``refund-o1`` with
  ``if_exists="resume"``: a retried webhook (or a double click) gets the same run back, and no tool runs
  twice. Each request hands the tools its own deps (the orders database and the user) through
  ``ctx.deps``; the user also goes into the run's metadata.
- A refund above 100 waits for a person: ``POST /runs/{id}/approve`` approves it, optionally with edited
  arguments (``{"by": "alice", "args": {"order": "o2", "amount": 200}}``); the model is told who changed
  what.
- ``POST /refunds/later`` only submits the run; a ``Worker`` (``python refund_app.py worker``, or in the
  demo below) drives submitted and approved runs, making each run's deps from its ``RunInfo``.
- ``GET /runs?user=u42`` lists one user's runs by metadata, with each run's typed result.

``python refund_app.py`` runs the whole story offline: it sends the requests with Starlette's test client,
then runs the worker until nothing is left, and prints what happened. Serve it for real with
``uvicorn refund_app:app`` (and ``TETHER_MODEL=anthropic:claude-sonnet-4-5`` for a real model).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tether import Agent, ModelRequest, RunInfo, SQLiteStore, State, ToolContext, Worker
from tether.testing import ScriptedModel, call


@dataclass
class Orders:
    """The app's database (a dict here; a SQLAlchemy session in a real app)."""

    paid: dict[str, int] = field(default_factory=lambda: {"o1": 40, "o2": 250, "o3": 30})
    refunds: list[tuple[str, int, str]] = field(default_factory=list)


@dataclass
class Deps:
    """What each run's tools get as ``ctx.deps``: live objects, never journaled."""

    db: Orders
    user: str


class Refund(BaseModel):
    """The run's typed result (``state.output``)."""

    order: str
    refunded: int


def _order_of(request: ModelRequest) -> tuple[str, int]:
    """The scripted model reads the order and amount from the first message: ``refund 40 on order o1``."""
    words = request.messages[0].text.split()
    return words[-1], int(words[1])


def _scripted() -> ScriptedModel:
    """An offline model: look the order up, refund it, give the typed result (what a real model would do)."""

    def look(request: ModelRequest) -> Any:
        return call("lookup_order", order=_order_of(request)[0])

    def pay(request: ModelRequest) -> Any:
        order, amount = _order_of(request)
        return call("refund", order=order, amount=amount)

    def result(request: ModelRequest) -> Any:
        last = request.messages[-1].content[0]["content"]
        amount = int("".join(b.get("text", "") for b in last).split("refunded ")[-1].split()[0])
        return call("final_result", order=_order_of(request)[0], refunded=amount)

    return ScriptedModel([look, pay, result])


STORE = SQLiteStore(os.environ.get("REFUND_DB", "refund-runs.db"))
DB = Orders()
agent: Agent[Deps] = Agent(
    model=os.environ.get("TETHER_MODEL") or _scripted(),
    name="refunds",
    instructions="You handle refund requests: look the order up, then refund it.",
    store=STORE,
    output_type=Refund,
    deps_type=Deps,
    poll_interval=0.1,
)


@agent.tool(effect="read_only")
def lookup_order(order: str, ctx: ToolContext[Deps]) -> str:
    """Look an order up.

    Args:
        order: The order id.
    """
    return f"order {order} was paid {ctx.deps.db.paid.get(order, 0)} EUR"


@agent.tool(effect="idempotent", approval=lambda args: args["amount"] > 100)
def refund(order: str, amount: int, ctx: ToolContext[Deps]) -> str:
    """Refund part of an order (refunds above 100 need a person's approval).

    Args:
        order: The order id.
        amount: How much to refund, in EUR.
    """
    db = ctx.deps.db
    if not any(key == ctx.idempotency_key for *_, key in db.refunds):  # a retried call refunds once
        db.refunds.append((order, amount, ctx.idempotency_key))
    return f"refunded {amount} EUR on order {order} for {ctx.deps.user}"


def _view(state: State) -> dict[str, Any]:
    output = state.output.model_dump() if isinstance(state.output, Refund) else state.output
    pending = [{"call_id": p.call_id, "tool": p.tool, "args": p.args} for p in state.pending_approvals]
    return {"id": state.id, "status": state.status, "result": output, "pending": pending}


async def start_refund(request: Request) -> JSONResponse:
    body = await request.json()
    prompt = f"refund {body['amount']} on order {body['order']}"
    state = await agent.arun(
        prompt,
        id=f"refund-{body['order']}",
        if_exists="resume",  # a retried request gets the same run: created once, then resumed
        deps=Deps(DB, body["user"]),
        metadata={"user": body["user"], "order": body["order"]},
    )
    return JSONResponse(_view(state))


async def refund_later(request: Request) -> JSONResponse:
    body = await request.json()
    run_id = f"refund-{body['order']}"
    if await STORE.aexists(run_id):  # submitted already: a retry changes nothing
        return JSONResponse({"id": run_id, "status": "exists"})
    prompt = f"refund {body['amount']} on order {body['order']}"
    await run_in_threadpool(agent.submit, prompt, id=run_id, metadata={"user": body["user"]})
    return JSONResponse({"id": run_id, "status": "submitted"})


async def approve(request: Request) -> JSONResponse:
    body = await request.json()
    state = await STORE.aload(request.path_params["run_id"])
    if not state.pending_approvals:
        return JSONResponse({"id": state.id, "approved": None, "status": state.status}, status_code=409)
    call_id = state.pending_approvals[0].call_id
    state.approve(call_id, by=body["by"], reason=body.get("reason"), args=body.get("args"))
    await STORE.asave(state)  # journaled now (no one holds the run); a worker runs it
    return JSONResponse({"id": state.id, "approved": call_id})


async def list_runs(request: Request) -> JSONResponse:
    infos = await STORE.alist(metadata={"user": request.query_params["user"]})
    runs = [{"id": i.id, "status": i.status} for i in infos]
    return JSONResponse(sorted(runs, key=lambda r: r["id"]))


app = Starlette(
    routes=[
        Route("/refunds", start_refund, methods=["POST"]),
        Route("/refunds/later", refund_later, methods=["POST"]),
        Route("/runs/{run_id}/approve", approve, methods=["POST"]),
        Route("/runs", list_runs),
    ]
)


def run_worker() -> None:
    """Drive every run that needs work, each with deps made from its RunInfo, until none is left."""

    def deps_for(info: RunInfo) -> Deps:
        return Deps(DB, info.metadata["user"])

    Worker([agent], STORE, deps=deps_for, poll_interval=0.1).run(stop_when_idle=True)


def demo() -> None:
    from starlette.testclient import TestClient

    with TestClient(app) as client:
        first = client.post("/refunds", json={"order": "o1", "amount": 40, "user": "u42"}).json()
        print("POST /refunds o1:", first["status"], first["result"])
        again = client.post("/refunds", json={"order": "o1", "amount": 40, "user": "u42"}).json()
        print("retried o1:", again["id"], again["status"], "refunds made:", len(DB.refunds))
        big = client.post("/refunds", json={"order": "o2", "amount": 250, "user": "u42"}).json()
        print("POST /refunds o2:", big["status"], [p["tool"] for p in big["pending"]])
        edit = {"by": "alice", "reason": "half was store credit", "args": {"order": "o2", "amount": 200}}
        print("approve o2:", client.post(f"/runs/{big['id']}/approve", json=edit).json()["approved"])
        later = client.post("/refunds/later", json={"order": "o3", "amount": 30, "user": "u7"}).json()
        print("submitted o3:", later["status"])
        run_worker()
        for user in ("u42", "u7"):
            print(f"runs of {user}:", client.get("/runs", params={"user": user}).json())
    for run_id in ("refund-o2", "refund-o3"):
        state = agent.resume(run_id, deps=Deps(DB, "-"))  # finished: returned as it is, typed
        print(f"{run_id}:", state.status, type(state.output).__name__, state.output)
    print(
        "refunds:", sorted((order, amount) for order, amount, _ in DB.refunds)
    )  # the worker drives o2 and o3 at once


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        run_worker()
    else:
        demo()
