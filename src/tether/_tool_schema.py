"""The JSON schema of a tool's parameters: pydantic's, without titles, with ``$defs`` inlined where it can be."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["first_sentence", "parameters_schema"]

_DATA_KEYS = frozenset({"default", "enum", "const", "examples"})
_NAME_MAP_KEYS = frozenset({"properties", "patternProperties", "$defs", "definitions"})


def parameters_schema(model: type[BaseModel], name: str) -> dict[str, Any]:
    """The model's JSON schema without titles, with ``$defs`` inlined unless a type is recursive."""
    try:
        raw = model.model_json_schema()
    except Exception as exc:
        raise ValueError(
            f"cannot build the JSON schema of tool {name}: {first_sentence(exc)} "
            "Fix: annotate parameters with JSON-friendly types"
        ) from exc
    defs = raw.pop("$defs", None)
    try:
        clean = _walk(raw, defs or {}, ())
    except _RecursiveRef:
        clean = _walk(raw, None, ())
        clean["$defs"] = {key: _walk(value, None, ()) for key, value in (defs or {}).items()}
    else:
        defs = None
    schema: dict[str, Any] = {
        "type": "object",
        "properties": clean.get("properties", {}),
        "required": clean.get("required", []),
        "additionalProperties": False,
    }
    if defs is not None:
        schema["$defs"] = clean["$defs"]
    return schema


def first_sentence(exc: Exception) -> str:
    """The first sentence of an exception's message, ending in a period (pydantic's run long)."""
    text = str(exc).strip().split("\n", 1)[0]
    text = text.split(". ", 1)[0].rstrip(".")
    return f"{text}."


class _RecursiveRef(Exception):
    """A ``$ref`` that cannot be inlined (the type refers to itself)."""


def _walk(node: Any, defs: dict[str, Any] | None, seen: tuple[str, ...]) -> Any:
    """Copy a JSON schema without ``title`` keys, inlining ``$defs`` refs when ``defs`` is given.

    Raises _RecursiveRef when a type refers to itself (it cannot be inlined).
    """
    if isinstance(node, list):
        return [_walk(item, defs, seen) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if (key == "title" and isinstance(value, str)) or (key == "$ref" and defs is not None):
            continue
        if key in _DATA_KEYS:
            out[key] = value
        elif key in _NAME_MAP_KEYS and isinstance(value, dict):
            out[key] = {k: _walk(v, defs, seen) for k, v in value.items()}
        else:
            out[key] = _walk(value, defs, seen)
    ref = node.get("$ref")
    if defs is not None and isinstance(ref, str):
        target = ref.rsplit("/", 1)[-1]
        if target in seen or target not in defs:
            raise _RecursiveRef(ref)
        out = {**_walk(defs[target], defs, (*seen, target)), **out}
    all_of = out.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], dict):
        out = {**all_of[0], **{k: v for k, v in out.items() if k != "allOf"}}
    return out
