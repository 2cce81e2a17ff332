"""Structured output: the model answers by calling an output tool whose arguments are validated (issue 5).

``Agent(output_type=T)`` (or ``agent.run(..., output_type=T)``) adds a tool named ``final_result`` whose
schema is T's. A valid call ends the run: the call gets a synthetic ``done`` result, ``state.output`` is
the typed value and ``state.answer`` its JSON text. An invalid one is an ``input_error`` the model sees
and fixes, a bounded number of times. T is a pydantic model, a dataclass, a TypedDict or any type
pydantic validates; a non-object type is wrapped as ``{"result": T}``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from .errors import TetherError

__all__ = [
    "OUTPUT_TOOL",
    "OutputSpec",
    "OutputValidationError",
    "imported_type",
    "output_spec",
    "typed_output",
]

OUTPUT_TOOL = "final_result"


class OutputValidationError(TetherError, ValueError):
    """The model's final result did not validate against ``output_type`` after the allowed retries."""


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """How to ask for, check and keep one output type."""

    type: Any
    adapter: Any  # pydantic.TypeAdapter
    wrapped: bool
    schema: dict[str, Any]
    type_path: str | None

    def validate(self, args: Any) -> Any:
        """The typed value of the output tool's arguments.

        Raises:
            ValueError: the arguments do not match (the message is for the model).
        """
        from pydantic import ValidationError

        try:
            if self.wrapped:
                if not isinstance(args, dict) or set(args) != {"result"}:
                    raise ValueError("the arguments must be an object with one key, 'result'")
                args = args["result"]
            return self.adapter.validate_python(args)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'value'}: {err['msg']}" for err in exc.errors()[:8]
            )
            raise ValueError(
                f"invalid final result: {problems}. Fix: call {OUTPUT_TOOL} again with arguments matching its "
                "schema"
            ) from None

    def dump(self, value: Any) -> Any:
        """The JSON form journaled in ``run_stopped``."""
        return self.adapter.dump_python(value, mode="json")


def output_spec(output_type: Any) -> OutputSpec:
    """The OutputSpec of a type.

    Raises:
        TypeError: pydantic cannot build a schema for it.
    """
    from pydantic import TypeAdapter

    try:
        adapter: Any = TypeAdapter(output_type)
        schema = adapter.json_schema()
    except Exception as exc:
        raise TypeError(
            f"output_type {output_type!r} cannot be validated ({exc}). Fix: use a pydantic model, a dataclass, "
            "a TypedDict or a plain type"
        ) from None
    wrapped = schema.get("type") != "object"
    if wrapped:
        schema = {"type": "object", "properties": {"result": schema}, "required": ["result"]}
    name = getattr(output_type, "__name__", str(output_type))
    tool_schema = {
        "name": OUTPUT_TOOL,
        "description": f"Give the final result ({name}). Call it once, when the task is done.",
        "parameters": schema,
    }
    module, qualname = getattr(output_type, "__module__", None), getattr(output_type, "__qualname__", None)
    type_path = f"{module}:{qualname}" if module and qualname and "<" not in qualname else None
    return OutputSpec(output_type, adapter, wrapped, tool_schema, type_path)


def imported_type(type_path: str) -> Any:
    """The type ``module:qualname`` names, when its module is already imported; else None.

    Nothing is imported because a journal names it: a journal is data, never code to load.
    """
    module_name, _, qualname = type_path.partition(":")
    target: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        if target is None:
            return None
        target = getattr(target, part, None)
    return target


def typed_output(type_path: str | None, value: Any, spec: OutputSpec | None = None) -> Any:
    """The journaled output as a typed value; else as JSON.

    With ``spec`` (the driving agent's output type) the value is validated as that type whatever the
    journal names (a run started from a script's ``__main__`` or a file loaded by ``tether run`` names a
    module no other process has). Otherwise the type the journal names is used, only when its module is
    already imported.
    """
    if value is None:
        return value
    if spec is not None:
        try:
            return spec.adapter.validate_python(value)
        except Exception:  # another type than the run's: the journal's own may still fit
            pass
    if type_path is None:
        return value
    target = imported_type(type_path)
    if target is None:
        return value
    try:
        return output_spec(target).adapter.validate_python(value)
    except Exception:  # a changed type: the JSON is still the answer
        return value
