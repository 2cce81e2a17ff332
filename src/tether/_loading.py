"""Loading an Agent named by ``module:attribute`` or ``path/file.py:attribute``: the one loader.

The command line (its AGENT argument) and the crash harness (``tether._harness.crash.crash_test``, its agent
factory) both load agents here; each says how through a ``Wording`` (its error texts and how strict it is).
This module imports nothing of the CLI (no typer, no rich), so ``tether.testing`` may use it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["CLI", "FACTORY", "Wording", "load_agent"]


@dataclass(frozen=True, slots=True)
class Wording:
    """How a caller of ``load_agent`` words its errors, and how it treats what the spec names.

    The texts are ``str.format`` templates over ``spec``, ``where`` (the part before the last ``:``),
    ``attribute`` (the part after it), ``path`` (the resolved file), ``exc`` (the import error) and
    ``kind`` (the type name of what was found).
    """

    module_prefix: str
    """The name a file is loaded under: the prefix, then a hash of its resolved path."""
    malformed: str
    no_file: str
    cannot_load: str
    no_module: str
    no_attribute: str
    not_agent: str
    cwd_on_path: bool
    """Put the current folder on ``sys.path`` before importing a module, and turn only a missing module
    named by the spec itself into a ValueError (a module it imports that is missing raises as it is)."""
    strict: bool
    """Call only functions taking no arguments (never a Tool), and check that they return an Agent."""
    returned: str = ""
    """A strict load's function returned something else."""


CLI = Wording(
    module_prefix="_tether_agent_",
    malformed=(
        "agent {spec!r} is not MODULE:ATTRIBUTE or PATH/FILE.py:ATTRIBUTE. Fix: e.g. "
        "myapp.agents:support, or agents.py:support"
    ),
    no_file="agent file {where} does not exist. Fix: check the path before ':{attribute}'",
    cannot_load="agent file {where} cannot be loaded. Fix: pass a .py file",
    no_module=(
        "module {where} cannot be imported ({exc}). Fix: run tether from the folder that holds it, or "
        "pass PATH/FILE.py:ATTRIBUTE"
    ),
    no_attribute="{where} has no attribute {attribute}. Fix: name the Agent after the ':'",
    not_agent=(
        "{spec} is a {kind}, not an Agent. Fix: name an Agent, or a function taking no arguments that returns one"
    ),
    cwd_on_path=True,
    strict=False,
)
"""The command line's AGENT argument."""

FACTORY = Wording(
    module_prefix="_tether_crashtest_",
    malformed=(
        "agent factory {spec!r} is not module:attribute or path/file.py:attribute. Fix: for example "
        "myapp.agents:build_agent or agents.py:support"
    ),
    no_file="agent factory {spec!r}: no file {path}. Fix: check the path",
    cannot_load="agent factory {spec!r}: {path} cannot be imported. Fix: name a .py file",
    no_module=(
        "agent factory {spec!r}: module {where} not found ({exc}). Fix: run from the folder that "
        "holds it, set PYTHONPATH, or pass path/file.py:attribute"
    ),
    no_attribute="agent factory {spec!r}: {where} has no attribute {attribute}. Fix: check the name",
    not_agent=(
        "agent factory {spec!r} is a {kind}, not an Agent or a function without "
        "arguments. Fix: name an Agent or a zero-argument function returning one"
    ),
    cwd_on_path=False,
    strict=True,
    returned="agent factory {spec!r} returned a {kind}, not an Agent. Fix: return an Agent",
)
"""The crash harness's agent factory."""


def load_agent(spec: str, wording: Wording) -> Agent:
    """The Agent that ``spec`` names: ``module:attribute`` or ``path/file.py:attribute``.

    The attribute (dots allowed) is an Agent, or a callable taking no arguments that returns one. A module
    is imported by name; a file is loaded as a module of its own, with its folder on ``sys.path`` so it can
    import its neighbours (and loaded once per process).

    Raises:
        ValueError: the spec is malformed, the module or file cannot be found, the attribute is missing, or
            it is not an Agent (each worded by ``wording``).
    """
    from .agent import Agent
    from .tools import Tool

    where, sep, attribute = spec.rpartition(":")

    def error(template: str, **more: Any) -> ValueError:
        return ValueError(template.format(spec=spec, where=where, attribute=attribute, **more))

    if not sep or not where or not attribute:
        raise error(wording.malformed)
    if where.endswith(".py") or "/" in where or os.sep in where:
        module = _load_file(where, wording, error)
    else:
        module = _import_module(where, wording, error)
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise error(wording.no_attribute) from None
    if isinstance(target, Agent):
        return target
    if not wording.strict:
        if callable(target):
            target = target()
        if not isinstance(target, Agent):
            raise error(wording.not_agent, kind=type(target).__name__)
        return target
    if isinstance(target, Tool) or not callable(target) or not _takes_no_arguments(target):
        raise error(wording.not_agent, kind=type(target).__name__)
    target = target()
    if not isinstance(target, Agent):
        raise error(wording.returned, kind=type(target).__name__)
    return target


def _load_file(where: str, wording: Wording, error: Callable[..., ValueError]) -> ModuleType:
    """The module of the file ``where``, loaded once under a name of its own."""
    path = Path(where).expanduser().resolve()
    if not path.is_file():
        raise error(wording.no_file, path=path)
    name = wording.module_prefix + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    module = sys.modules.get(name)
    if module is not None:
        return module
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise error(wording.cannot_load, path=path)
    module = importlib.util.module_from_spec(loader_spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import_module(where: str, wording: Wording, error: Callable[..., ValueError]) -> ModuleType:
    """The module named ``where``."""
    if wording.cwd_on_path and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as exc:
        if not wording.cwd_on_path:
            raise error(wording.no_module, exc=exc) from exc
        if exc.name is None or not (where == exc.name or where.startswith(exc.name + ".")):
            raise
        raise error(wording.no_module, exc=exc) from None


def _takes_no_arguments(fn: Callable[..., Any]) -> bool:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return True  # cannot tell: let the call say
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in signature.parameters.values()
    )
