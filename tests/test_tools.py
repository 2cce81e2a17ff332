"""Tests for tether.tools: schemas, validation, context injection, decoration errors and result blocks."""

import asyncio
import dataclasses
import datetime
import enum
import inspect
import sys
from typing import Annotated, Any, Literal, Optional

import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from tether.tools import Tool, ToolContext, ToolInputError, result_to_blocks, tool

CTX = ToolContext(run_id="r1", call_id="c1", attempt=1, idempotency_key="tether:r1:c1", tool="t")


@dataclasses.dataclass
class Point:
    x: int
    y: int = 0


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Size(enum.IntEnum):
    SMALL = 1
    LARGE = 2


class Address(TypedDict):
    street: str
    zip_code: int


class Person(BaseModel):
    """A person."""

    name: str
    age: int = Field(default=0, description="Age in years.")


class Team(BaseModel):
    lead: Person
    members: list[Person] = []


class Node(BaseModel):
    value: int
    children: list["Node"] = []


@tool
def get_weather(city: str) -> str:
    """Get the current weather for a city.

    Look it up in the weather service.

    Args:
        city: The city to look up.
    """
    return f"sunny in {city}"


def props(t: Tool) -> dict[str, Any]:
    return t.parameters["properties"]


# --- decoration and attributes ---


def test_bare_decorator_builds_tool_with_defaults() -> None:
    assert isinstance(get_weather, Tool)
    assert get_weather.name == "get_weather"
    assert (
        get_weather.description == "Get the current weather for a city.\n\nLook it up in the weather service."
    )
    assert get_weather.effect == "unsafe"
    assert get_weather.approval is False
    assert get_weather.timeout is None
    assert get_weather.max_attempts == 3
    assert get_weather.is_async is False
    assert get_weather.fn.__name__ == "get_weather"
    assert get_weather("London") == "sunny in London"
    assert get_weather.parameters == {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city to look up."}},
        "required": ["city"],
        "additionalProperties": False,
    }
    assert get_weather.schema == {
        "name": "get_weather",
        "description": get_weather.description,
        "parameters": get_weather.parameters,
    }


def test_schema_is_cached() -> None:
    assert get_weather.schema is get_weather.schema
    assert get_weather.schema["parameters"] is get_weather.parameters


def test_decorator_with_options() -> None:
    @tool(
        name="lookup",
        description="Look things up.",
        effect="idempotent",
        approval=True,
        timeout=5,
        max_attempts=4,
    )
    def f(q: str) -> str:
        """Ignored description."""
        return q

    assert (f.name, f.description, f.effect, f.approval, f.timeout, f.max_attempts) == (
        "lookup",
        "Look things up.",
        "idempotent",
        True,
        5.0,
        4,
    )
    assert isinstance(f.timeout, float)
    assert f.schema["name"] == "lookup"
    assert f.schema["description"] == "Look things up."
    assert f("x") == "x"


def test_no_docstring_gives_empty_description() -> None:
    @tool
    def f(a: int) -> int:
        return a

    assert f.description == ""
    assert props(f) == {"a": {"type": "integer"}}


def test_no_parameters() -> None:
    @tool(effect="read_only")
    def now() -> str:
        """Tell the time."""
        return "noon"

    assert now.parameters == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }
    assert now.validate({}) == {}
    assert now.invoke_sync({}, CTX) == "noon"


# --- schema generation per type ---


def test_scalar_types_and_descriptions() -> None:
    @tool
    def f(s: str, i: int, x: float, b: bool) -> None:
        """Scalars.

        Args:
            s: A string.
            i (int): An int.
            x: A float
                spanning two lines.
            b: A flag.
        """

    assert props(f) == {
        "s": {"type": "string", "description": "A string."},
        "i": {"type": "integer", "description": "An int."},
        "x": {"type": "number", "description": "A float\nspanning two lines."},
        "b": {"type": "boolean", "description": "A flag."},
    }
    assert f.parameters["required"] == ["s", "i", "x", "b"]
    assert f.description == "Scalars."


def test_literal_and_enums() -> None:
    @tool
    def f(mode: Literal["fast", "slow"], color: Color, size: Size) -> None:
        """Enums.

        Args:
            color: The color.
        """

    p = props(f)
    assert p["mode"] == {"type": "string", "enum": ["fast", "slow"]}
    assert p["color"]["enum"] == ["red", "blue"]
    assert p["color"]["type"] == "string"
    assert p["color"]["description"] == "The color."
    assert p["size"]["enum"] == [1, 2]
    assert p["size"]["type"] == "integer"
    assert "$defs" not in f.parameters


def test_containers() -> None:
    @tool
    def f(tags: list[str], scores: dict[str, float], grid: list[list[int]]) -> None:
        """Containers."""

    p = props(f)
    assert p["tags"] == {"type": "array", "items": {"type": "string"}}
    assert p["scores"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert p["grid"] == {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}


def test_optional_and_defaults() -> None:
    @tool
    def f(
        a: Optional[int],  # noqa: UP045 - Optional spelling is part of what is tested
        b: str | None = None,
        c: int = 3,
        d: list[int] = [1, 2],  # noqa: B006
        e: Color = Color.BLUE,
        f: object = object(),
    ) -> None:
        """Defaults."""

    p = props(f)
    assert p["a"] == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert p["b"] == {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    assert p["c"] == {"type": "integer", "default": 3}
    assert p["d"] == {"type": "array", "items": {"type": "integer"}, "default": [1, 2]}
    assert p["e"]["default"] == "blue"
    assert p["e"]["enum"] == ["red", "blue"]
    assert "default" not in p["f"]  # not JSON-serializable: left out, still optional
    assert f.parameters["required"] == ["a"]


def test_untyped_parameter_is_any() -> None:
    @tool
    def f(x, y=2) -> None:  # type: ignore[no-untyped-def]
        """Untyped."""

    assert props(f) == {"x": {}, "y": {"default": 2}}
    assert f.parameters["required"] == ["x"]
    assert f.validate({"x": [1, {"a": None}]}) == {"x": [1, {"a": None}]}


def test_dataclass_parameter() -> None:
    @tool
    def f(point: Point) -> None:
        """Dataclass.

        Args:
            point: Where.
        """

    assert props(f)["point"] == {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer", "default": 0}},
        "required": ["x"],
        "additionalProperties": False,
        "description": "Where.",
    }


def test_typeddict_parameter() -> None:
    @tool
    def f(address: Address) -> None:
        """TypedDict."""

    p = props(f)["address"]
    assert p["type"] == "object"
    assert p["properties"] == {"street": {"type": "string"}, "zip_code": {"type": "integer"}}
    assert p["required"] == ["street", "zip_code"]


def test_pydantic_parameter_nested() -> None:
    @tool
    def f(team: Team) -> None:
        """Pydantic.

        Args:
            team: The team.
        """

    team = props(f)["team"]
    assert "$defs" not in f.parameters
    assert team["type"] == "object"
    assert team["description"] == "The team."
    assert team["required"] == ["lead"]
    lead = team["properties"]["lead"]
    assert lead["type"] == "object"
    assert lead["description"] == "A person."
    assert lead["properties"] == {
        "name": {"type": "string"},
        "age": {"type": "integer", "default": 0, "description": "Age in years."},
    }
    assert team["properties"]["members"]["items"]["properties"]["name"] == {"type": "string"}
    assert team["properties"]["members"]["default"] == []


def test_nested_combination() -> None:
    @tool
    def f(points: dict[str, list[Point]] | None = None) -> None:
        """Nested."""

    p = props(f)["points"]
    assert p["default"] is None
    obj, null = p["anyOf"]
    assert null == {"type": "null"}
    assert obj["type"] == "object"
    assert obj["additionalProperties"]["type"] == "array"
    assert obj["additionalProperties"]["items"]["properties"]["x"] == {"type": "integer"}


def test_recursive_model_keeps_defs() -> None:
    @tool
    def f(tree: Node) -> None:
        """Recursive."""

    assert props(f)["tree"] == {"$ref": "#/$defs/Node"}
    node = f.parameters["$defs"]["Node"]
    assert node["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert "title" not in node
    assert f.validate({"tree": {"value": 1, "children": [{"value": 2}]}})["tree"].children[0].value == 2


def test_titles_removed_but_properties_named_title_kept() -> None:
    @tool
    def f(title: str, default: Person, enum: int = 1) -> None:
        """Names that are also schema keywords."""

    p = props(f)
    assert p["title"] == {"type": "string"}
    assert p["default"]["properties"]["name"] == {"type": "string"}
    assert "title" not in p["default"]
    assert p["enum"] == {"type": "integer", "default": 1}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "title":
                    assert path.endswith("properties"), path
                walk(value, key)
        elif isinstance(node, list):
            for item in node:
                walk(item, path)

    walk(f.parameters, "")


def test_annotated_field_description() -> None:
    @tool
    def f(n: Annotated[int, Field(ge=1, le=10)]) -> None:
        """Annotated."""

    assert props(f)["n"] == {"type": "integer", "minimum": 1, "maximum": 10}
    with pytest.raises(ToolInputError, match="n: Input should be less than or equal to 10"):
        f.validate({"n": 11})


def test_parameter_names_shadowing_basemodel_attributes() -> None:
    @tool
    def f(schema: str, json: int, model_config: str = "x") -> tuple[str, int, str]:
        """Shadowing names."""
        return schema, json, model_config

    assert sorted(props(f)) == ["json", "model_config", "schema"]
    kwargs = f.validate({"schema": "s", "json": 1, "model_config": "m"})
    assert f.invoke_sync(kwargs, CTX) == ("s", 1, "m")


# --- ToolContext ---


def test_context_excluded_from_schema_and_injected() -> None:
    seen: list[ToolContext] = []

    @tool(effect="idempotent")
    def pay(amount: int, ctx: ToolContext) -> str:
        """Pay.

        Args:
            amount: Cents.
            ctx: Injected.
        """
        seen.append(ctx)
        return ctx.idempotency_key

    assert list(props(pay)) == ["amount"]
    assert pay.parameters["required"] == ["amount"]
    with pytest.raises(ToolInputError, match="ctx"):
        pay.validate({"amount": 1, "ctx": {}})
    assert pay.invoke_sync(pay.validate({"amount": 5}), CTX) == "tether:r1:c1"
    assert seen == [CTX]


def test_context_with_any_parameter_name_and_optional() -> None:
    @tool
    def f(context: ToolContext | None = None, q: str = "") -> str:
        """Context named differently."""
        return context.call_id if context else "none"

    assert list(props(f)) == ["q"]
    assert f.invoke_sync({}, CTX) == "c1"
    assert f() == "none"


def test_context_not_injected_when_not_asked() -> None:
    assert get_weather.invoke_sync({"city": "Oslo"}, CTX) == "sunny in Oslo"


def test_tool_context_is_frozen_and_slotted() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        CTX.attempt = 2  # type: ignore[misc]
    assert not hasattr(CTX, "__dict__")
    assert [f.name for f in dataclasses.fields(ToolContext)] == [
        "run_id",
        "call_id",
        "attempt",
        "idempotency_key",
        "tool",
        "deps",
        "metadata",
    ]


# --- validation ---


@tool
def book(person: Person, where: Point, color: Color, address: Address, nights: int = 1) -> str:
    """Book a room."""
    return f"{person.name} {where.x} {color.value} {address['street']} {nights}"


def test_validate_constructs_objects() -> None:
    kwargs = book.validate(
        {
            "person": {"name": "Ann"},
            "where": {"x": 1, "y": 2},
            "color": "red",
            "address": {"street": "Main", "zip_code": 123},
        }
    )
    assert kwargs["person"] == Person(name="Ann", age=0)
    assert isinstance(kwargs["person"], Person)
    assert kwargs["where"] == Point(1, 2)
    assert isinstance(kwargs["where"], Point)
    assert kwargs["color"] is Color.RED
    assert kwargs["address"] == {"street": "Main", "zip_code": 123}
    assert "nights" not in kwargs  # left out: the function's own default applies
    assert book.invoke_sync(kwargs, CTX) == "Ann 1 red Main 1"


def test_validate_keeps_explicit_default_valued_arguments() -> None:
    assert get_weather.validate({"city": "Rome"}) == {"city": "Rome"}
    kwargs = book.validate(
        {
            "person": {"name": "B"},
            "where": {"x": 0},
            "color": "blue",
            "address": {"street": "S", "zip_code": 1},
            "nights": 1,
        }
    )
    assert kwargs["nights"] == 1


def test_validate_wrong_type() -> None:
    with pytest.raises(ToolInputError) as err:
        get_weather.validate({"city": 3})
    assert str(err.value) == (
        "invalid arguments for get_weather: city: Input should be a valid string (got 3). "
        "Fix: call get_weather again with arguments matching its schema"
    )
    assert isinstance(err.value, ValueError)


def test_validate_missing_required() -> None:
    with pytest.raises(ToolInputError) as err:
        get_weather.validate({})
    message = str(err.value)
    assert message.startswith("invalid arguments for get_weather: city: Field required")
    assert "Fix:" in message


def test_validate_extra_argument() -> None:
    with pytest.raises(ToolInputError) as err:
        get_weather.validate({"city": "Paris", "country": "FR"})
    message = str(err.value)
    assert "get_weather" in message
    assert "country: unknown argument (the arguments are: city)" in message
    assert "Fix:" in message


def test_validate_nested_error_location_and_enum() -> None:
    with pytest.raises(ToolInputError) as err:
        book.validate(
            {
                "person": {"name": 1},
                "where": {"x": "a"},
                "color": "green",
                "address": {"street": "S", "zip_code": 1},
            }
        )
    message = str(err.value)
    assert "person.name: Input should be a valid string (got 1)" in message
    assert "where.x: Input should be a valid integer" in message
    assert "color: Input should be 'red' or 'blue' (got \"green\")" in message
    assert message.endswith("Fix: call book again with arguments matching its schema")


@pytest.mark.parametrize("args", [None, [1], "city=London", 3])
def test_validate_non_dict(args: Any) -> None:
    with pytest.raises(ToolInputError) as err:
        get_weather.validate(args)
    assert str(err.value).startswith("invalid arguments for get_weather: expected a JSON object, got ")
    assert "Fix: call get_weather again" in str(err.value)


def test_validate_long_bad_value_is_truncated() -> None:
    with pytest.raises(ToolInputError) as err:
        get_weather.validate({"city": list(range(1000))})
    assert len(str(err.value)) < 300
    assert "..." in str(err.value)


# --- decoration errors ---


@pytest.mark.parametrize("effect", ["resumable", "dangerous", ""])
def test_bad_effect(effect: str) -> None:
    with pytest.raises(ValueError, match=r"effect .* Fix: use one of read_only, idempotent, unsafe"):
        tool(effect=effect)  # type: ignore[call-overload]


def test_resumable_is_accepted_by_the_tool_constructor() -> None:
    def child(task: str) -> str:
        """Run a subagent."""
        return task

    t = Tool(child, effect="resumable")
    assert t.effect == "resumable"
    assert t.schema["parameters"]["required"] == ["task"]


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"max_attempts": 0}, "max_attempts=0"),
        ({"max_attempts": 1.5}, "max_attempts=1.5"),
        ({"timeout": 0}, "timeout=0"),
        ({"timeout": -1.0}, "timeout=-1.0"),
        ({"timeout": "5"}, "timeout='5'"),
        ({"approval": "yes"}, "approval='yes'"),
        ({"name": "has space"}, "tool name 'has space' is invalid"),
        ({"name": "x" * 65}, "is invalid"),
    ],
)
def test_bad_options(options: dict[str, Any], fragment: str) -> None:
    def f(a: int) -> int:
        return a

    with pytest.raises(ValueError) as err:
        tool(**options)(f)
    assert fragment in str(err.value)
    assert ". Fix: " in str(err.value)


def test_var_args_refused() -> None:
    def f(*items: str) -> None: ...

    def g(a: int, **extra: Any) -> None: ...

    with pytest.raises(
        ValueError, match=r"tool f has \*items.*Fix: replace it with explicit named parameters"
    ):
        tool(f)
    with pytest.raises(ValueError, match=r"tool g has \*\*extra.*Fix:"):
        tool(g)


def test_positional_only_refused() -> None:
    def f(a: int, /) -> None: ...

    with pytest.raises(ValueError, match=r"positional-only.*Fix:"):
        tool(f)


def test_unsupported_type_refused() -> None:
    class Opaque:
        pass

    def f(thing: Opaque) -> None: ...

    with pytest.raises(ValueError) as err:
        tool(f)
    message = str(err.value)
    assert message.startswith(
        "cannot build the argument schema of tool f: Unable to generate pydantic-core schema"
    )
    assert message.endswith("typing_extensions.TypedDict, pydantic model)")
    assert "\n" not in message
    assert "arbitrary_types_allowed" not in message


def test_typing_typeddict_on_311_gets_a_fix() -> None:
    import typing

    class Legacy(typing.TypedDict):
        a: int

    def f(x: Legacy) -> None: ...

    if sys.version_info >= (3, 12):
        assert tool(f).parameters["required"] == ["x"]
    else:
        with pytest.raises(ValueError, match=r"typing_extensions\.TypedDict.*\. Fix: "):
            tool(f)


def test_unresolvable_annotation_refused() -> None:
    def f(x: "Missing") -> None: ...  # type: ignore[name-defined] # noqa: F821

    with pytest.raises(
        ValueError,
        match=r"cannot read the type of parameter x of tool f \('Missing'\): name 'Missing' is not defined\. Fix:",
    ):
        tool(f)


def test_generator_refused() -> None:
    def gen() -> Any:
        yield 1

    with pytest.raises(ValueError, match=r"generator.*Fix:"):
        tool(gen)


def test_not_a_function_refused() -> None:
    with pytest.raises(TypeError, match=r"Fix:"):
        tool(42)  # type: ignore[call-overload]


# --- async tools ---


@tool(effect="idempotent", timeout=2.5)
async def fetch(url: str, ctx: ToolContext, retries: int = 2) -> dict[str, Any]:
    """Fetch a URL.

    Args:
        url: What to fetch.
        retries: How often to retry.
    """
    await asyncio.sleep(0)
    return {"url": url, "retries": retries, "attempt": ctx.attempt}


def test_async_tool_schema_and_invoke() -> None:
    assert fetch.is_async is True
    assert inspect.iscoroutinefunction(fetch.fn)
    assert props(fetch) == {
        "url": {"type": "string", "description": "What to fetch."},
        "retries": {"type": "integer", "default": 2, "description": "How often to retry."},
    }
    assert fetch.parameters["required"] == ["url"]
    result = asyncio.run(fetch.invoke_async(fetch.validate({"url": "http://x"}), CTX))
    assert result == {"url": "http://x", "retries": 2, "attempt": 1}


def test_async_tool_direct_call_returns_coroutine() -> None:
    assert asyncio.run(fetch("u", CTX, retries=0)) == {"url": "u", "retries": 0, "attempt": 1}


def test_invoke_mismatch_raises_type_error() -> None:
    with pytest.raises(TypeError, match=r"not async.*Fix:"):
        asyncio.run(get_weather.invoke_async({"city": "x"}, CTX))
    with pytest.raises(TypeError, match=r"is async.*Fix:"):
        fetch.invoke_sync({"url": "x"}, CTX)


def test_exceptions_from_tools_propagate() -> None:
    @tool
    def boom() -> None:
        """Fail."""
        raise RuntimeError("nope")

    with pytest.raises(RuntimeError, match="nope"):
        boom.invoke_sync({}, CTX)


# --- result_to_blocks ---


def test_result_str_and_none() -> None:
    assert result_to_blocks("hi") == [{"type": "text", "text": "hi"}]
    assert result_to_blocks("") == [{"type": "text", "text": ""}]
    assert result_to_blocks(None) == [{"type": "text", "text": ""}]


def test_result_blocks_kept() -> None:
    blocks = [
        {"type": "text", "text": "a chart"},
        {"type": "image", "media_type": "image/png", "data": "iVBORw0KGgo="},
    ]
    out = result_to_blocks(blocks)
    assert out == blocks
    assert out[0] is not blocks[0]  # copied: a tool mutating its list later changes nothing


def test_result_malformed_blocks_become_json() -> None:
    assert result_to_blocks([{"type": "video", "url": "x"}]) == [
        {"type": "text", "text": '[{"type":"video","url":"x"}]'}
    ]
    assert result_to_blocks([{"type": "image", "data": "x"}])[0]["text"] == '[{"type":"image","data":"x"}]'
    assert result_to_blocks([]) == [{"type": "text", "text": "[]"}]
    assert (
        result_to_blocks([{"type": "text", "text": "a"}, "b"])[0]["text"]
        == '[{"type":"text","text":"a"},"b"]'
    )


def test_result_json_values() -> None:
    assert result_to_blocks({"a": 1, "b": [True, None]}) == [
        {"type": "text", "text": '{"a":1,"b":[true,null]}'}
    ]
    assert result_to_blocks(42) == [{"type": "text", "text": "42"}]
    assert result_to_blocks(Point(1, 2)) == [{"type": "text", "text": '{"x":1,"y":2}'}]
    assert result_to_blocks(Person(name="Ann")) == [{"type": "text", "text": '{"name":"Ann","age":0}'}]
    assert result_to_blocks(datetime.date(2024, 1, 2)) == [{"type": "text", "text": '"2024-01-02"'}]
    assert result_to_blocks(Color.RED) == [{"type": "text", "text": '"red"'}]
    assert result_to_blocks("é") == [{"type": "text", "text": "é"}]
    assert result_to_blocks({"name": "é"}) == [{"type": "text", "text": '{"name":"é"}'}]


def test_result_unserializable_falls_back_to_repr() -> None:
    class Thing:
        def __repr__(self) -> str:
            return "Thing()"

    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    assert result_to_blocks(Thing()) == [{"type": "text", "text": "Thing()"}]
    assert result_to_blocks({"t": Thing()}) == [{"type": "text", "text": "{'t': Thing()}"}]
    assert result_to_blocks(b"\xff") == [{"type": "text", "text": "b'\\xff'"}]
    text = result_to_blocks(Broken())[0]["text"]
    assert "Broken" in text
