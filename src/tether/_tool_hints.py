"""A tool's parameter types, from annotations that may be strings (``from __future__ import annotations``).

``typing.get_type_hints`` resolves a string annotation in the function's module globals only, so a tool
defined inside a function, naming a ``ToolContext`` imported there or a model defined beside it, could not
be read. Here each parameter's annotation is resolved with Python's own scoping, innermost first: the
function's closure, the locals of the functions that define it while they run (the frames on the stack
whose code holds the tool's code), the module's globals, the builtins; and last tether's public names, so
``ToolContext`` resolves without an import. The return annotation is never read (only the parameters are
the model's business). A ``ToolContext[Deps]`` whose ``Deps`` cannot be resolved (imported only under ``if
TYPE_CHECKING:``) is still the context. What cannot be resolved is refused, naming the parameter and the fix.
"""

from __future__ import annotations

import builtins
import inspect
import re
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["parameter_hints"]

_CONTEXT = re.compile(r"\s*(?:[A-Za-z_]\w*\.)*ToolContext\s*(?:\[.*\])?\s*", re.DOTALL)
_MAX_FRAMES = 200


def parameter_hints(
    fn: Any, tool: str, parameters: Iterable[str], *, context: type, fallback: Mapping[str, Any]
) -> dict[str, Any]:
    """The type of each annotated parameter of ``fn`` (``Annotated`` kept), its strings resolved.

    Args:
        fn: the tool's function.
        tool: the tool's name, for error messages.
        parameters: the names of the parameters to resolve.
        context: the ``ToolContext`` class, for an annotation naming it whose argument cannot be resolved.
        fallback: tether's public names, used where no scope of the function defines the name.

    Raises:
        ValueError: an annotation cannot be resolved (the message names the parameter and the fix).
    """
    target = inspect.unwrap(fn)
    target = getattr(target, "__func__", target)
    raw = getattr(target, "__annotations__", None)
    if not isinstance(raw, Mapping):
        return typing.get_type_hints(fn, include_extras=True)  # not a function: raises as it always did
    globalns: dict[str, Any] = getattr(target, "__globals__", None) or {}
    localns = _namespace(target, globalns, fallback, sys._getframe(1))
    hints: dict[str, Any] = {}
    for name in parameters:
        if name not in raw:
            continue
        annotation = raw[name]
        holder = types.SimpleNamespace(__annotations__={name: annotation})
        try:
            hints[name] = typing.get_type_hints(holder, globalns, localns, include_extras=True)[name]
        except Exception as exc:
            if isinstance(annotation, str) and _CONTEXT.fullmatch(annotation):
                hints[name] = context
                continue
            raise ValueError(_unresolved(tool, name, annotation, exc)) from exc
    return hints


def _namespace(
    target: Any, globalns: Mapping[str, Any], fallback: Mapping[str, Any], frame: types.FrameType | None
) -> dict[str, Any]:
    """The names a string annotation of ``target`` may use beyond its globals, innermost scope winning."""
    namespace = {k: v for k, v in fallback.items() if k not in globalns and k not in builtins.__dict__}
    code = getattr(target, "__code__", None)
    if code is None:
        return namespace
    for scope in reversed(_enclosing_locals(code, frame)):  # outermost first: inner ones override
        namespace.update(scope)
    cells = getattr(target, "__closure__", None) or ()
    for var, cell in zip(code.co_freevars, cells, strict=False):
        try:
            namespace[var] = cell.cell_contents
        except ValueError:  # an empty cell: the name is assigned after the tool is made
            pass
    return namespace


def _enclosing_locals(code: types.CodeType, frame: types.FrameType | None) -> list[dict[str, Any]]:
    """The locals of the running frames that lexically enclose ``code``, innermost first.

    A frame encloses a function when its code holds the function's code among its constants; a module's
    frame is left out (its locals are the globals).
    """
    scopes: list[dict[str, Any]] = []
    inner = code
    for _ in range(_MAX_FRAMES):
        if frame is None:
            break
        if inner in frame.f_code.co_consts:
            if frame.f_code.co_name == "<module>":
                break
            scopes.append(dict(frame.f_locals))
            inner = frame.f_code
        frame = frame.f_back
    return scopes


def _unresolved(tool: str, name: str, annotation: Any, exc: Exception) -> str:
    problem = str(exc).strip().split("\n", 1)[0].rstrip(".")
    missing = getattr(exc, "name", None) if isinstance(exc, NameError) else None
    if missing:
        fix = (
            f"define or import {missing} before the tool is made (at module level, or above the tool in the "
            "function that defines it)"
        )
    else:
        fix = "annotate it with a type the tool's module can import"
    return f"cannot read the type of parameter {name} of tool {tool} ({annotation!r}): {problem}. Fix: {fix}"
