"""The run inspector's ASGI app (DESIGN 17): the runs list, the run page, its actions and its live feed.

Every store call runs off the event loop (the store's async twins when it has them, else ``run_io``).
Every action is a POST carrying the CSRF token, goes through the inbox as the CLI's do (``state.approve`` +
``store.save``: post, then one more try to take the run), and is attributed to the user.
"""

from __future__ import annotations

import getpass
import hmac
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import journal as j
from .._timeline import display_status, format_args, format_time, next_step, summarize
from ..errors import RunBusyError, RunNotFoundError
from ..state import State
from ..stores import RunInfo, Store

__all__ = ["COOKIE", "CSP", "create_app"]

HERE = Path(__file__).parent
COOKIE = "tether_token"
"""The cookie that keeps the access token (HttpOnly, SameSite=Strict)."""
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""The Content-Security-Policy of every response: no inline script, nothing from another origin."""
PAGE_SIZE = 50
TIMELINE_WINDOW = 300
"""How many entries the run page shows at once, newest first (older ones behind a link)."""
REFRESH_KINDS = frozenset(
    {
        "approval_requested",
        "approval_decided",
        "child_waiting",
        "tool_started",
        "tool_finished",
        "run_stopped",
        "run_resumed",
        "run_released",
        "cancel_requested",
        "model_replied",
    }
)
"""Entries after which the run page's panels (status, approvals, calls) are fetched again."""


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    env.filters["clock"] = format_time
    env.filters["pretty"] = _pretty
    env.filters["short_args"] = lambda args: format_args(args, 80)
    return env


def _pretty(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, indent=2, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _blocks_text(blocks: Any) -> str:
    parts: list[str] = []
    for block in blocks or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text") or ""))
        elif kind == "tool_call":
            parts.append(f"→ {block.get('name')}({format_args(block.get('args'), 200)})")
        elif kind == "tool_result":
            inner = _blocks_text(block.get("content"))
            parts.append(
                f"← {block.get('call_id') or block.get('id') or ''} {block.get('outcome') or ''}: {inner}"
            )
        else:
            parts.append(f"[{kind}]")
    return "\n".join(p for p in parts if p)


class _Security:
    """The access-token check and the security headers, as ASGI middleware around the whole app."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"content-security-policy", CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        if self.token is not None:
            request = Request(scope)
            given = request.query_params.get("token")
            if given is not None and hmac.compare_digest(given, self.token):
                # The token leaves the URL at once: kept in the cookie, the address bar shows none.
                query = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
                target = request.url.path + ("?" + urlencode(query) if query else "")
                response: Response = RedirectResponse(target, status_code=303)
                response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict", path="/")
                await response(scope, receive, send_with_headers)
                return
            cookie = request.cookies.get(COOKIE)
            if cookie is None or not hmac.compare_digest(cookie, self.token):
                response = HTMLResponse(
                    "<!doctype html><title>tether</title><p>Open the URL that <code>tether ui</code> "
                    "printed (it carries the access token).</p>",
                    status_code=401,
                )
                await response(scope, receive, send_with_headers)
                return
        await self.app(scope, receive, send_with_headers)


class _Inspector:
    """The routes, over one store."""

    def __init__(self, store: Store, user: str | None, user_header: str | None) -> None:
        self.store = store
        self.user = user
        self.user_header = user_header
        self.csrf = secrets.token_urlsafe(32)
        self.env = _environment()

    # -- plumbing

    async def io(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``store.<name>(...)`` off the event loop: its async twin ``a<name>`` when the store has one."""
        twin = getattr(self.store, "a" + name, None)
        if twin is not None:
            result = twin(*args, **kwargs)
            return await result if isinstance(result, Awaitable) else result
        method: Callable[..., Any] = getattr(self.store, name)
        return await self.store.run_io(lambda: method(*args, **kwargs))

    def who(self, request: Request) -> str | None:
        """Who acts: the proxy's header when one is named, else ``user``, else the OS user."""
        if self.user_header is not None:
            return request.headers.get(self.user_header) or None
        if self.user is not None:
            return self.user
        try:
            return getpass.getuser()
        except (KeyError, OSError):
            return None

    def render(self, request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        template = self.env.get_template(name)
        base = str(request.scope.get("root_path", "")).rstrip("/")  # mounted under a prefix: links keep it
        text = template.render(
            csrf_token=self.csrf,
            base=base,
            user=self.who(request),
            static=base + "/static/",
            **context,
        )
        return HTMLResponse(text, status_code=status_code)

    async def form(self, request: Request) -> dict[str, str] | Response:
        """The POST's form, or a 403 when its CSRF token is missing or wrong."""
        data = await request.form()
        given = request.headers.get("x-csrf-token") or data.get("csrf_token")
        if not isinstance(given, str) or not hmac.compare_digest(given, self.csrf):
            return HTMLResponse(
                "<!doctype html><p>Refused: a missing or wrong CSRF token.</p>", status_code=403
            )
        if self.user_header is not None and not request.headers.get(self.user_header):
            return HTMLResponse(
                f"<!doctype html><p>Refused: no user in the {self.user_header} header.</p>", status_code=403
            )
        return {k: v for k, v in data.items() if isinstance(v, str)}

    async def load(self, run_id: str) -> State | None:
        try:
            j.validate_run_id(run_id)
            state: State = await self.io("load", run_id)
        except (RunNotFoundError, ValueError):
            return None
        return state

    def not_found(self, request: Request, run_id: str) -> HTMLResponse:
        return self.render(request, "missing.html", status_code=404, run_id=run_id)

    # -- the runs list

    async def runs(self, request: Request) -> Response:
        q = request.query_params
        run_id = (q.get("id") or "").strip()
        if run_id:
            if await self.load(run_id) is not None:
                return RedirectResponse(str(request.url_for("run", run_id=run_id)), status_code=303)
            return self.not_found(request, run_id)
        filters: dict[str, Any] = {}
        status = q.get("status") or None
        agent = (q.get("agent") or "").strip() or None
        meta_text = (q.get("meta") or "").strip()
        error = None
        metadata: dict[str, str] = {}
        for pair in meta_text.replace(",", " ").split():
            key, sep, value = pair.partition("=")
            if not sep or not key:
                error = f"metadata filter {pair!r} is not KEY=VALUE. Fix: write e.g. user=u42"
                break
            metadata[key] = value
        if status:
            filters["status"] = status
        if agent:
            filters["agent"] = agent
        if metadata:
            filters["metadata"] = metadata
        runs: list[RunInfo] = []
        following = None
        waiting: list[RunInfo] = []
        if error is None:
            try:
                runs, following = await self.io(
                    "list_page", **filters, limit=PAGE_SIZE, cursor=q.get("cursor") or None
                )
                if status != "waiting":
                    waiting = await self.io("list", status="waiting", limit=PAGE_SIZE)
            except ValueError as exc:
                error = str(exc)
        groups = _fold(runs)
        keep = {k: v for k, v in (("status", status), ("agent", agent), ("meta", meta_text)) if v}
        next_url = None
        if following is not None:
            next_url = "?" + urlencode({**keep, "cursor": following})
        return self.render(
            request,
            "runs.html",
            groups=groups,
            count=len(runs),
            next_url=next_url,
            waiting=[w for w in waiting if not w.parent_id],
            status=status or "",
            agent=agent or "",
            meta=meta_text,
            error=error,
            paged=bool(q.get("cursor")),
            statuses=["running", "waiting", "completed", "failed", "cancelled", "stopped"],
        )

    # -- the run page

    async def run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        state = await self.load(run_id)
        if state is None:
            return self.not_found(request, run_id)
        context = await self.run_context(state, request)
        return self.render(request, "run.html", **context)

    async def panels(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        state = await self.load(run_id)
        if state is None:
            return self.not_found(request, run_id)
        context = await self.run_context(state, request)
        return self.render(request, "panels.html", **context)

    async def run_context(self, state: State, request: Request) -> dict[str, Any]:
        history = state.history
        before = request.query_params.get("before")
        end = len(history)
        if before is not None and before.isdigit():
            end = max(0, min(end, int(before) - (history[0].seq if history else 0)))
        start = max(0, end - TIMELINE_WINDOW)
        calls: dict[str, str] = {}
        for entry in history[:start]:
            if isinstance(entry, j.ModelReplied):
                summarize(entry, calls)
        rows = [_row(e, calls) for e in history[start:end]]
        rows.reverse()
        holder = await self.io("holder", state.root_id or state.id)
        children: list[RunInfo] = await self.io("list", parent_id=state.id, limit=PAGE_SIZE)
        started = history[0] if history and isinstance(history[0], j.RunStarted) else None
        return {
            "state": state,
            "run_id": state.id,
            "status": display_status(state.status, holder is not None),
            "raw_status": state.status,
            "holder": holder.describe() if holder is not None else None,
            "agent": state.agent,
            "metadata": (started.metadata if started is not None else None) or {},
            "started": started,
            "root_id": state.root_id if state.root_id and state.root_id != state.id else None,
            "parent_id": state.parent_id,
            "children": children,
            "pending": state.pending_approvals,
            "open_calls": state.open_calls,
            "next_step": next_step(state),
            "calls": _calls(state),
            "messages": [(m.role, _blocks_text(m.content)) for m in state.messages],
            "rows": rows,
            "last_seq": history[-1].seq if history else -1,
            "earlier": (history[start].seq if start > 0 else None),
            "answer": state.answer,
            "reason": state.reason,
            "final": state.status in j.FINAL_STATUSES,
            "flash": request.query_params.get("done"),
        }

    # -- live

    async def events(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        if await self.load(run_id) is None:
            return self.not_found(request, run_id)
        after = request.query_params.get("after", "-1")
        last = request.headers.get("last-event-id")
        try:
            after_seq = max(int(after), int(last) if last is not None else -1)
        except ValueError:
            after_seq = -1
        template = self.env.get_template("row.html")

        async def stream() -> AsyncIterator[str]:
            yield "retry: 2000\n\n"
            calls: dict[str, str] = {}
            async for entry in self.store.follow(run_id, after_seq):
                row = _row(entry, calls)
                html = template.render(row=row)
                data = json.dumps({"seq": entry.seq, "kind": entry.kind, "html": html})
                yield f"id: {entry.seq}\nevent: entry\ndata: {data}\n\n"
                if entry.kind in REFRESH_KINDS:
                    yield "event: refresh\ndata: {}\n\n"
            yield "event: end\ndata: {}\n\n"

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    # -- actions (POST only)

    def back(self, request: Request, run_id: str, done: str) -> Response:
        url = str(request.url_for("run", run_id=run_id)) + "?" + urlencode({"done": done})
        return RedirectResponse(url, status_code=303)

    async def approve(self, request: Request) -> Response:
        return await self.decide(request, True)

    async def deny(self, request: Request) -> Response:
        return await self.decide(request, False)

    async def decide(self, request: Request, approved: bool) -> Response:
        form = await self.form(request)
        if isinstance(form, Response):
            return form
        run_id = request.path_params["run_id"]
        state = await self.load(run_id)
        if state is None:
            return self.not_found(request, run_id)
        call_id = form.get("call_id", "")
        target = form.get("run_id") or state.id
        reason = form.get("reason", "").strip() or None
        by = self.who(request)
        edited: dict[str, Any] | None = None
        problem = None
        pending = next(
            (p for p in state.pending_approvals if p.call_id == call_id and p.run_id == target), None
        )
        args_text = form.get("args", "").strip()
        if approved and args_text:
            try:
                parsed = json.loads(args_text)
            except ValueError as exc:
                parsed, problem = None, f"the edited arguments are not JSON ({exc})"
            if problem is None and not isinstance(parsed, dict):
                problem = "the edited arguments are not a JSON object"
            elif problem is None and (pending is None or parsed != pending.args):
                edited = parsed
        if problem is None:
            try:
                if approved:
                    state.approve(call_id, by=by, reason=reason, run_id=target, args=edited)
                else:
                    state.deny(call_id, by=by, reason=reason, run_id=target)
                await self.io("save", state)
            except (ValueError, RunBusyError) as exc:
                problem = str(exc)
        if problem is not None:
            context = await self.run_context(state, request)
            return self.render(request, "run.html", status_code=400, problem=problem, **context)
        verb = "approved" if approved else "denied"
        return self.back(request, run_id, f"call {call_id} {verb} by {by or 'someone'}")

    async def cancel(self, request: Request) -> Response:
        form = await self.form(request)
        if isinstance(form, Response):
            return form
        run_id = request.path_params["run_id"]
        if await self.load(run_id) is None:
            return self.not_found(request, run_id)
        by = self.who(request)
        try:
            after = await self.io("cancel", run_id, by=by)
        except RunBusyError:
            after = None
        done = f"cancelled by {by or 'someone'}" if after is not None else "cancel posted to the run's inbox"
        return self.back(request, run_id, done)

    async def fork(self, request: Request) -> Response:
        form = await self.form(request)
        if isinstance(form, Response):
            return form
        run_id = request.path_params["run_id"]
        state = await self.load(run_id)
        if state is None:
            return self.not_found(request, run_id)
        at_text = form.get("at_seq", "").strip()
        try:
            at = int(at_text) if at_text else None
            made: str = await self.io("fork", run_id, at_seq=at)
        except ValueError as exc:
            context = await self.run_context(state, request)
            return self.render(request, "run.html", status_code=400, problem=str(exc), **context)
        return self.back(request, made, f"forked from {run_id}")


def _row(entry: j.Entry, calls: dict[str, str]) -> dict[str, Any]:
    kind = entry.kind
    tone = "plain"
    if kind in ("approval_requested", "child_waiting"):
        tone = "waiting"
    elif kind == "approval_decided":
        tone = "ok" if getattr(entry, "approved", False) else "bad"
    elif kind in ("model_failed", "inbox_skipped"):
        tone = "bad"
    elif kind == "run_stopped":
        tone = "ok" if getattr(entry, "status", "") == "completed" else "bad"
    elif kind == "tool_finished":
        tone = "ok" if getattr(entry, "outcome", "") == "done" else "bad"
    return {
        "seq": entry.seq,
        "at": format_time(entry.at),
        "kind": kind,
        "summary": summarize(entry, calls),
        "tone": tone,
    }


def _calls(state: State) -> list[dict[str, Any]]:
    """Each tool call of the run, in order: arguments, effect, attempts, decision, outcome and result."""
    results: dict[str, str] = {}
    for entry in state.history:
        if isinstance(entry, j.ToolFinished):
            results[entry.call_id] = _blocks_text(entry.content) or _pretty(entry.content)
    out = []
    seen: set[str] = set()
    for entry in state.history:
        if not isinstance(entry, j.ModelReplied):
            continue
        for block in entry.content:
            if block.get("type") != "tool_call":
                continue
            call_id = str(block.get("id"))
            if call_id in seen:
                continue
            seen.add(call_id)
            record = state.call(call_id)
            decision = record.decision if record is not None else None
            out.append(
                {
                    "id": call_id,
                    "tool": block.get("name"),
                    "args": block.get("args"),
                    "edited": record.edited_args if record is not None else None,
                    "effect": record.effect if record is not None else None,
                    "attempts": record.attempt if record is not None else 0,
                    "outcome": (record.outcome if record is not None else None)
                    or ("open" if state.is_open(call_id) else None),
                    "result": results.get(call_id),
                    "decision": decision,
                }
            )
    return out


def _fold(runs: list[RunInfo]) -> list[dict[str, Any]]:
    """The page's runs grouped by root, in page order: each root, then its subagent runs under it."""
    groups: dict[str, dict[str, Any]] = {}
    for info in runs:
        root = info.root_id or info.id
        group = groups.setdefault(root, {"root_id": root, "root": None, "children": []})
        if root == info.id:
            group["root"] = info
        else:
            group["children"].append(info)
    return list(groups.values())


def create_app(
    store: Store, *, user: str | None = None, token: str | None = None, user_header: str | None = None
) -> Starlette:
    """The run inspector as an ASGI app, over ``store``.

    Args:
        store: the runs to show and act on.
        user: who the actions are attributed to (default: the OS user).
        token: the access token a browser must bring (``?token=`` once, then an HttpOnly SameSite=Strict
            cookie); None checks no token (the mounting application's own authentication applies).
        user_header: take the acting user from this request header (behind an authenticating proxy);
            a POST without it is refused.
    """
    inspector = _Inspector(store, user, user_header)
    routes = [
        Route("/", inspector.runs, name="runs"),
        Route("/runs/{run_id}", inspector.run, name="run"),
        Route("/runs/{run_id}/panels", inspector.panels, name="panels"),
        Route("/runs/{run_id}/events", inspector.events, name="events"),
        Route("/runs/{run_id}/approve", inspector.approve, methods=["POST"], name="approve"),
        Route("/runs/{run_id}/deny", inspector.deny, methods=["POST"], name="deny"),
        Route("/runs/{run_id}/cancel", inspector.cancel, methods=["POST"], name="cancel"),
        Route("/runs/{run_id}/fork", inspector.fork, methods=["POST"], name="fork"),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.inspector = inspector
    app.add_middleware(_Security, token=token)
    return app
