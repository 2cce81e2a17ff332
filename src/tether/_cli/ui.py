"""``tether ui``: serve the run inspector (DESIGN 17) on 127.0.0.1, behind a random access token."""

from __future__ import annotations

import secrets
from typing import Annotated

import typer
from rich.text import Text

from .common import DEFAULT_STORE, StoreOption, app, console, fail, friendly_errors, require_store, whoami

__all__ = ["ui"]


@app.command()
@friendly_errors
def ui(
    store: StoreOption = DEFAULT_STORE,
    host: Annotated[
        str, typer.Option("--host", help="The address to bind (another than 127.0.0.1 exposes it).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="The port.")] = 8765,
    user: Annotated[
        str | None,
        typer.Option(
            "--user",
            metavar="NAME",
            help="Who the page's actions are attributed to (default: your user name).",
        ),
    ] = None,
    user_header: Annotated[
        str | None,
        typer.Option(
            "--user-header",
            metavar="NAME",
            help="Behind an authenticating proxy: take the user from this request header (no access token).",
        ),
    ] = None,
) -> None:
    """Serve the run inspector: the runs, each run's timeline, and Approve/Deny/Cancel/Fork.

    Prints a URL carrying a random access token (kept in an HttpOnly cookie once opened). Every action
    posts to the run's inbox, as tether approve/deny/cancel do, attributed to --user.
    """
    try:
        import uvicorn

        from ..web import create_app
    except ImportError as exc:
        fail(f"the run inspector needs the web extra ({exc.name} is missing)", "pip install 'tether[web]'")
    runs = require_store(store)
    token = None if user_header is not None else secrets.token_urlsafe(24)
    web_app = create_app(
        runs, user=user if user is not None else whoami(), token=token, user_header=user_header
    )
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
    out = console()
    out.print(Text(f"tether run inspector for {store}"), overflow="ignore", crop=False)
    out.print(Text(url, style="bold"), overflow="ignore", crop=False, soft_wrap=True)
    if host not in ("127.0.0.1", "localhost", "::1"):
        out.print(Text(f"warning: bound to {host}, reachable from other machines", style="bold red"))
    uvicorn.run(web_app, host=host, port=port, log_level="warning")
