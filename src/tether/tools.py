"""Tools: the ``@tool`` decorator, the ``Tool`` object and the ``ToolContext`` a running tool receives.

A tool is a plain function (sync or async). ``@tool`` turns it into a :class:`Tool` that is still callable
like the function and carries what the driver needs: a provider-neutral JSON schema built once from the
type hints and the docstring, the tool's effect (how a started-but-unfinished call is recovered), whether
it needs approval, its timeout and its attempt limit. The model's arguments go through :meth:`Tool.validate`
(pydantic) and the result through :func:`result_to_blocks`.

pydantic and docstring_parser are imported on first use, so ``import tether`` stays cheap.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Generic,
    Literal,
    Protocol,
    TypeVar,
    overload,
    runtime_checkable,
)

from ._encodable import clean
from ._tool_hints import parameter_hints
from ._tool_schema import first_sentence as _first_sentence
from ._tool_schema import parameters_schema
from .journal import EFFECTS, Effect
from .messages import text_block

if TYPE_CHECKING:
    import typing_extensions
    from pydantic import BaseModel, ValidationError

__all__ = [
    "ApprovalCondition",
    "DepsT",
    "Effect",
    "Tool",
    "ToolContext",
    "ToolCutOff",
    "ToolInputError",
    "ToolSource",
    "result_to_blocks",
    "tool",
]

if TYPE_CHECKING:  # a default (PEP 696) for type checkers: Agent(...) without deps_type is Agent[Any]
    DepsT = typing_extensions.TypeVar("DepsT", default=Any)
else:  # at run time the default changes nothing, and typing_extensions is not imported for it
    DepsT = TypeVar("DepsT")
"""The type of a run's dependencies (``agent.run(..., deps=...)``), as tools see them in ``ctx.deps``."""

ApprovalCondition = Callable[[dict[str, Any]], Any]
"""Whether a call needs a person's approval, from its validated arguments (a dict): truthy asks."""

_DECORATOR_EFFECTS: tuple[str, ...] = ("read_only", "idempotent", "unsafe")
_EFFECT_NAMES = ", ".join(_DECORATOR_EFFECTS)
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_MAX_ERRORS = 8


class ToolInputError(ValueError):
    """The model's arguments for a tool are invalid; the message is written for the model to fix its call."""


class ToolCutOff(Exception):
    """A call was cut off mid-way (a lost connection): it may or may not have taken effect.

    A tool raises it to have the driver treat the attempt like an interrupted one, by its effect: a
    ``read_only`` or ``idempotent`` call is started again (attempt + 1, the same key) until
    ``max_attempts``; an ``unsafe`` one is closed ``aborted``. The message says what was cut off.
    """


@runtime_checkable
class ToolSource(Protocol):
    """Something that gives an agent tools only while a drive holds it open (``tether.mcp.MCPTools``).

    ``Agent(tools=[...])`` accepts one beside plain tools. Each drive enters ``open_tools()`` before it
    takes its run and exits it when the run is released; the tools it yields are the agent's for that
    drive (offered to the model, in the fingerprint, invoked by the driver).
    """

    def open_tools(self) -> AbstractAsyncContextManager[Sequence[Tool]]:
        """Connect and yield this drive's tools; exiting closes what was opened.

        Raises:
            TetherError: the source cannot be opened (the drive fails before any model request).
        """
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class ToolContext(Generic[DepsT]):
    """What a running tool may know about its call; injected into a parameter annotated ``ToolContext``
    (or ``ToolContext[MyDeps]``, for type checkers).

    ``idempotency_key`` is the same for every attempt of one call (``tether:{run_id}:{call_id}``): pass it
    to external services so that a retried call takes effect once. ``deps`` is what the driving call was
    given (``agent.run(..., deps=...)``, ``Worker(deps=factory)``; None when nothing was), never journaled;
    ``metadata`` is the run's metadata (``agent.run(..., metadata=...)``), as journaled.
    """

    run_id: str
    call_id: str
    attempt: int
    idempotency_key: str
    tool: str
    deps: DepsT = None  # type: ignore[assignment]  # None when the driving call was given no deps
    metadata: Mapping[str, str] = dataclasses.field(default_factory=dict)

    if not TYPE_CHECKING:

        def __class_getitem__(cls, item: Any) -> type:
            """``ToolContext[Deps]`` is ``ToolContext`` at run time: the parameter is for type checkers.

            (A generic alias would set ``__orig_class__`` on each instance, which a slotted frozen
            dataclass refuses.)
            """
            return cls


@dataclasses.dataclass(init=False, repr=False, eq=False, slots=True)
class Tool:
    """A function the model may call, with its schema and its execution policy.

    Built by :func:`tool`; calling it (``tool_obj(...)``) calls the original function directly. The
    constructor also accepts ``effect="resumable"`` (used internally for subagents), which ``@tool`` refuses.
    ``schema`` and ``parameters`` are computed once and shared: do not mutate them.
    """

    name: str
    description: str
    effect: Effect
    approval: bool | ApprovalCondition
    timeout: float | None
    max_attempts: int
    fn: Callable[..., Any]
    is_async: bool
    parameters: dict[str, Any]
    schema: dict[str, Any]
    _model: type[BaseModel]
    _fields: dict[str, str]
    _ctx_param: str | None
    _defaults: dict[str, Callable[[], Any]]

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        effect: Effect = "unsafe",
        approval: bool | ApprovalCondition = False,
        timeout: float | None = None,
        max_attempts: int = 3,
    ) -> None:
        """Build a tool from ``fn``; raises ValueError (message ending in a Fix) for any invalid option."""
        fn = fn.fn if isinstance(fn, Tool) else fn
        if not callable(fn):
            raise TypeError(f"@tool needs a function, got {type(fn).__name__}. Fix: decorate a def")
        name = name if name is not None else getattr(fn, "__name__", "")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ValueError(
                f"tool name {name!r} is invalid: providers accept 1-64 letters, digits, '_' or '-'. "
                "Fix: pass @tool(name=...) with a valid name"
            )
        problems = [
            (effect not in EFFECTS, f"effect {effect!r} is unknown. Fix: use one of {_EFFECT_NAMES}"),
            (
                not isinstance(approval, bool) and not callable(approval),
                f"approval={approval!r} is neither a bool nor a callable. Fix: pass True, False, or a "
                "function of the arguments, e.g. approval=lambda args: args['amount'] > 100",
            ),
            (
                timeout is not None
                and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0),
                f"timeout={timeout!r} is not a positive number of seconds. Fix: pass None (no limit) or > 0",
            ),
            (
                isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1,
                f"max_attempts={max_attempts!r} is not an int of at least 1. Fix: pass 1 or more",
            ),
            (
                inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn),
                "it is a generator, but a tool returns one result. Fix: return a value (or a list)",
            ),
        ]
        for bad, message in problems:
            if bad:
                raise ValueError(f"tool {name}: {message}")
        doc_description, param_docs = _parse_docstring(fn)
        self.fn = fn
        self.name = name
        self.description = description if description is not None else doc_description
        self.effect = effect
        self.approval = approval
        self.timeout = float(timeout) if timeout is not None else None
        self.max_attempts = max_attempts
        self.is_async = inspect.iscoroutinefunction(fn)
        self._model, self._fields, self._ctx_param = _build_model(fn, name, param_docs)
        self._defaults = _defaults(fn, self._ctx_param)
        self.parameters = parameters_schema(self._model, name)
        self.schema = {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
        }

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the original function directly (no validation, no context injection)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        approval = "<condition>" if callable(self.approval) else self.approval
        return f"Tool(name={self.name!r}, effect={self.effect!r}, approval={approval})"

    def arguments(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Validated ``kwargs`` with the function's defaults filled in: what an approval condition sees."""
        out = {name: value() for name, value in self._defaults.items() if name not in kwargs}
        return {**out, **kwargs}

    def validate(self, args: Any) -> dict[str, Any]:
        """Validate the model's JSON arguments and return keyword arguments for the function.

        Nested values are constructed (dataclass, pydantic model, Enum member). Arguments the model left out
        are not returned, so the function's own defaults apply. Raises ToolInputError (message for the model)
        on a non-dict, a wrong type, a missing required argument or an unknown argument.
        """
        from pydantic import ValidationError

        if not isinstance(args, dict):
            raise ToolInputError(
                f"invalid arguments for {self.name}: expected a JSON object, got {_short(args)}. "
                f"Fix: call {self.name} again with an object of arguments matching its schema"
            )
        try:
            validated = self._model.model_validate(args)
        except ValidationError as exc:
            raise ToolInputError(
                f"invalid arguments for {self.name}: {_describe_errors(exc, self._fields.values())}. "
                f"Fix: call {self.name} again with arguments matching its schema"
            ) from None
        return {self._fields[field]: getattr(validated, field) for field in validated.model_fields_set}

    def invoke_sync(self, kwargs: dict[str, Any], ctx: ToolContext) -> Any:
        """Run a sync tool with validated ``kwargs``, injecting ``ctx`` if the function asked for it."""
        if self.is_async:
            raise TypeError(f"tool {self.name} is async. Fix: await tool.invoke_async(kwargs, ctx)")
        return self.fn(**self._with_context(kwargs, ctx))

    async def invoke_async(self, kwargs: dict[str, Any], ctx: ToolContext) -> Any:
        """Await an async tool with validated ``kwargs``, injecting ``ctx`` if the function asked for it."""
        if not self.is_async:
            raise TypeError(f"tool {self.name} is not async. Fix: call tool.invoke_sync(kwargs, ctx)")
        return await self.fn(**self._with_context(kwargs, ctx))

    def _with_context(self, kwargs: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        if self._ctx_param is None:
            return kwargs
        return {**kwargs, self._ctx_param: ctx}


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Literal["read_only", "idempotent", "unsafe"] = "unsafe",
    approval: bool | ApprovalCondition = False,
    timeout: float | None = None,
    max_attempts: int = 3,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Literal["read_only", "idempotent", "unsafe"] = "unsafe",
    approval: bool | ApprovalCondition = False,
    timeout: float | None = None,
    max_attempts: int = 3,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a function into a :class:`Tool`; usable bare (``@tool``) or with options (``@tool(...)``).

    Args:
        fn: The function (given when used bare).
        name: The name the model sees; defaults to the function's name.
        description: Overrides the docstring's description.
        effect: ``"read_only"``, ``"idempotent"`` or ``"unsafe"`` (default): an unsafe call cut off by a
            crash is never run again without a decision; the others are retried with the same key.
        approval: Every call waits for a human decision before running; or a function of the call's
            validated arguments (a dict, defaults filled in) saying whether it must wait. The function is
            called once, when the model's reply is planned, and the outcome is journaled: a recovered
            run never calls it again.
        timeout: Seconds a call may take (None: no limit); enforced by the driver.
        max_attempts: Attempts of a read_only or idempotent call (timeouts, crashes) before giving up.
    """
    if effect not in _DECORATOR_EFFECTS:
        raise ValueError(f"effect {effect!r} is not accepted by @tool. Fix: use one of {_EFFECT_NAMES}")

    decorate = functools.partial(
        Tool,
        name=name,
        description=description,
        effect=effect,
        approval=approval,
        timeout=timeout,
        max_attempts=max_attempts,
    )
    return decorate if fn is None else decorate(fn)


def result_to_blocks(value: Any) -> list[dict[str, Any]]:
    """Convert a tool's return value to content blocks; never raises.

    ``str`` becomes one text block, ``None`` an empty text block, a non-empty list of well-formed text
    (``{"type": "text", "text": str}``) and image (``{"type": "image", "media_type": str, "data": base64
    str}``) blocks is kept (shallow-copied); anything else becomes JSON text (dataclasses, pydantic models,
    datetimes...), or its ``repr`` when it cannot be serialized.
    """
    if isinstance(value, str):
        return [text_block(value)]
    if value is None:
        return [text_block("")]
    if isinstance(value, list) and value and all(_is_block(item) for item in value):
        return [dict(item) for item in value]
    return [text_block(_to_text(value))]


def _is_block(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    kind = item.get("type")
    if kind == "text":
        return isinstance(item.get("text"), str)
    if kind == "image":
        return isinstance(item.get("media_type"), str) and isinstance(item.get("data"), str)
    return False


def _to_text(value: Any) -> str:
    """JSON text of a value, else its repr; never raises.

    Strings with lone surrogates (file names from ``os.listdir``) are shown with U+FFFD in their place, as
    the journal keeps them (``tether._encodable``), in dicts, lists, dataclasses and pydantic models.
    """
    import pydantic_core

    try:
        return pydantic_core.to_json(value).decode("utf-8")
    except Exception:
        pass
    try:
        return pydantic_core.to_json(clean(_plain(value))).decode("utf-8")
    except Exception:
        try:
            return repr(value)
        except Exception:
            return f"<{type(value).__name__} object that cannot be shown>"


def _plain(value: Any) -> Any:
    """``value`` with dataclasses and pydantic models made dicts, through dicts, lists, tuples and sets."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(item) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return _plain(dump())
    return value


def _short(value: Any, limit: int = 80) -> str:
    text = _to_text(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe_errors(exc: ValidationError, known: Iterable[str]) -> str:
    """One line per error (``where: what (got value)``), for the model to read."""
    parts: list[str] = []
    errors = exc.errors(include_url=False)
    for err in errors[:_MAX_ERRORS]:
        where = ".".join(str(part) for part in err["loc"]) or "arguments"
        message = err["msg"]
        if err["type"] == "extra_forbidden" and len(err["loc"]) == 1:
            message = f"unknown argument (the arguments are: {', '.join(known) or 'none'})"
        elif err["type"] != "missing":
            message += f" (got {_short(err.get('input'))})"
        parts.append(f"{where}: {message}")
    if len(errors) > _MAX_ERRORS:
        parts.append(f"and {len(errors) - _MAX_ERRORS} more errors")
    return "; ".join(parts)


def _parse_docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """Return (description, {parameter: description}) from the function's docstring."""
    doc = inspect.getdoc(fn)
    if not doc:
        return "", {}
    import docstring_parser

    try:
        parsed = docstring_parser.parse(doc)
    except docstring_parser.ParseError:
        return doc.strip(), {}
    text = "\n\n".join(part for part in (parsed.short_description, parsed.long_description) if part)
    params = {p.arg_name: p.description.strip() for p in parsed.params if p.description}
    return text, params


def _is_context(hint: Any) -> bool:
    """Whether a parameter's annotation is ``ToolContext`` (``ToolContext[Deps]``, optional, annotated)."""
    if typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    if hint is ToolContext or typing.get_origin(hint) is ToolContext:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_is_context(arg) for arg in typing.get_args(hint) if arg is not type(None))
    return False


def _defaults(fn: Callable[..., Any], ctx_param: str | None) -> dict[str, Callable[[], Any]]:
    """Each parameter's default, as a factory (a mutable default is never shared with a condition)."""
    out: dict[str, Callable[[], Any]] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.name != ctx_param and param.default is not param.empty:
            out[param.name] = functools.partial(_fresh, param.default)
    return out


def _fresh(value: Any) -> Any:
    """A deep copy of ``value``, or ``value`` itself when it cannot be copied."""
    import copy

    try:
        return copy.deepcopy(value)
    except Exception:
        return value


def _build_model(
    fn: Callable[..., Any], name: str, param_docs: dict[str, str]
) -> tuple[type[BaseModel], dict[str, str], str | None]:
    """Build the pydantic model of the arguments; returns (model, {field: parameter}, context parameter)."""
    import pydantic_core
    from pydantic import ConfigDict, Field, create_model

    try:
        signature = inspect.signature(fn)
    except Exception as exc:
        raise ValueError(
            f"cannot read the signature of tool {name}: {_first_sentence(exc)} Fix: decorate a function"
        ) from exc
    try:  # raises ValueError naming the parameter whose annotation cannot be resolved
        hints = parameter_hints(fn, name, signature.parameters, context=ToolContext, fallback=_tether_names())
    except (NameError, TypeError) as exc:  # not a function: typing refuses it
        raise ValueError(
            f"cannot read the signature of tool {name}: {_first_sentence(exc)} "
            "Fix: annotate parameters with types defined at module level (importable names)"
        ) from exc
    fields: dict[str, Any] = {}
    names: dict[str, str] = {}
    ctx_param: str | None = None
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ValueError(
                f"tool {name} has {'*' if param.kind is param.VAR_POSITIONAL else '**'}{param.name}; "
                "the model can only pass named arguments. "
                "Fix: replace it with explicit named parameters"
            )
        if param.kind is param.POSITIONAL_ONLY:
            raise ValueError(
                f"parameter {param.name} of tool {name} is positional-only; tools are called by keyword. "
                "Fix: remove the '/' from the signature"
            )
        hint = hints.get(param.name, Any)
        if _is_context(hint):
            if ctx_param is not None:
                raise ValueError(
                    f"tool {name} has two ToolContext parameters ({ctx_param}, {param.name}). Fix: keep one"
                )
            ctx_param = param.name
            continue
        options: dict[str, Any] = {"alias": param.name}
        if param.name in param_docs:
            options["description"] = param_docs[param.name]
        if param.default is not param.empty:
            try:
                pydantic_core.to_jsonable_python(param.default)
                options["default"] = param.default
            except Exception:
                options["default_factory"] = _constant(param.default)
        field = f"f_{len(fields)}"
        fields[field] = (hint, Field(**options))
        names[field] = param.name
    try:
        model = create_model(
            f"{name}_arguments",
            __config__=ConfigDict(extra="forbid"),
            **fields,
        )
    except Exception as exc:
        raise ValueError(
            f"cannot build the argument schema of tool {name}: {_first_sentence(exc)} Fix: annotate "
            "parameters with JSON-friendly types (str, int, float, bool, Literal, Enum, list, dict, "
            "dataclass, typing_extensions.TypedDict, pydantic model)"
        ) from exc
    return model, names, ctx_param


def _tether_names() -> dict[str, Any]:
    """tether's public names already loaded (``tether.__all__``, this module's), for string annotations."""
    names = {name: globals()[name] for name in __all__}
    package = sys.modules.get("tether")  # never imported from here: tether imports this module
    if package is not None:
        loaded = vars(package)
        names.update({name: loaded[name] for name in getattr(package, "__all__", ()) if name in loaded})
    return names


def _constant(value: Any) -> Callable[[], Any]:
    """A default factory returning ``value`` (for defaults that JSON cannot show)."""
    return lambda: value
