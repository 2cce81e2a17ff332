"""The run inspector (DESIGN 17): a local web page to watch runs and approve calls (the ``web`` extra).

``create_app(store, *, user=None, token=None)`` returns an ASGI app to mount in any Starlette or FastAPI
application; ``tether ui --store URL`` serves it on 127.0.0.1. Importing this module imports starlette and
jinja2; ``import tether`` never imports it.
"""

from __future__ import annotations

from .app import COOKIE, CSP, create_app

__all__ = ["COOKIE", "CSP", "create_app"]
