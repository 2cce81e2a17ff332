"""Tools defined inside functions, under ``from __future__ import annotations`` (every annotation a string):
tether's own names, the function's locals and its closure resolve; what cannot is refused naming the
parameter and the fix (issue 13, item 4)."""

from __future__ import annotations

from typing import Any

import pytest

from tether.tools import Tool

CTX_FIELDS = {"run_id": "r1", "call_id": "c1", "attempt": 1, "idempotency_key": "k", "tool": "t"}


def test_a_tool_in_a_function_with_a_locally_imported_tool_context_is_accepted() -> None:
    from tether import ToolContext, tool

    @tool
    def where(city: str, ctx: ToolContext) -> str:
        """Where the call runs."""
        return f"{city} in {ctx.run_id}"

    assert where.parameters["required"] == ["city"]
    assert where.invoke_sync({"city": "Paris"}, ToolContext(**CTX_FIELDS)) == "Paris in r1"


def test_tether_names_resolve_even_when_the_function_never_imported_them() -> None:
    import tether

    def report(count: int, ctx: ToolContext) -> str:  # type: ignore[name-defined]  # noqa: F821
        """ToolContext is tether's own name: it resolves without an import."""
        return f"{count} {ctx.call_id}"

    made = tether.tool(report)
    assert made.invoke_sync({"count": 2}, tether.ToolContext(**CTX_FIELDS)) == "2 c1"


def test_local_types_in_every_shape_resolve() -> None:
    import dataclasses
    from typing import Annotated, Optional

    from pydantic import BaseModel, Field

    from tether import ToolContext, tool

    class Deps:
        units = "C"

    class Item(BaseModel):
        name: str

    @dataclasses.dataclass
    class Point:
        x: int

    @tool
    def place(
        item: Item,
        where: Point,
        near: Optional[Point],  # noqa: UP045  # the shape issue 13 names
        points: list[Point],
        size: Annotated[int, Field(ge=1)],
        ctx: ToolContext[Deps],
    ) -> str:
        """Every shape of annotation, each naming a type defined in this function."""
        return f"{item.name} {where.x} {near} {[p.x for p in points]} {size}{ctx.deps.units}"

    properties = place.parameters["properties"]
    assert set(properties) == {"item", "where", "near", "points", "size"}
    assert properties["size"]["minimum"] == 1
    kwargs = place.validate(
        {"item": {"name": "box"}, "where": {"x": 1}, "near": None, "points": [], "size": 2}
    )
    assert place.invoke_sync(kwargs, ToolContext(**CTX_FIELDS, deps=Deps())) == "box 1 None [] 2C"


def test_the_locals_of_enclosing_functions_resolve() -> None:
    from tether import ToolContext, tool

    class Unit:
        pass

    def outer() -> Tool:
        def inner() -> Tool:
            @tool
            def measure(ctx: ToolContext[Unit], amount: int = 1) -> str:
                """Unit and ToolContext are locals of the test, two functions out."""
                return f"{amount} {ctx.tool}"

            return measure

        return inner()

    assert outer().invoke_sync({}, ToolContext(**CTX_FIELDS)) == "1 t"


def test_a_closure_resolves_after_the_defining_function_returned() -> None:
    import dataclasses

    from tether import ToolContext, tool

    def factory() -> Any:
        @dataclasses.dataclass
        class Unit:
            n: int

        def measure(unit: Unit | None, ctx: ToolContext) -> str:
            """Unit is reachable only through the closure: its body uses it."""
            return f"{unit.n if unit else None} {isinstance(unit, Unit)}"

        return measure

    made = tool(factory())  # factory's frame is gone
    assert made.invoke_sync(made.validate({"unit": {"n": 2}}), ToolContext(**CTX_FIELDS)) == "2 True"


def test_a_tool_context_whose_deps_type_is_only_imported_for_type_checkers_is_still_the_context() -> None:
    from tether import ToolContext, tool

    @tool
    def greet(name: str, ctx: ToolContext[OnlyForTypeCheckers]) -> str:  # type: ignore[name-defined]  # noqa: F821
        """The deps type is never imported at run time (``if TYPE_CHECKING:``)."""
        return f"hi {name} from {ctx.tool}"

    assert greet.parameters["required"] == ["name"]
    assert greet.invoke_sync({"name": "ann"}, ToolContext(**CTX_FIELDS)) == "hi ann from t"


def test_a_name_that_cannot_be_resolved_is_refused_naming_the_parameter_and_the_fix() -> None:
    from tether import tool

    def late(when: Later, count: int) -> None:  # type: ignore[name-defined]  # noqa: F821
        """Later is defined after the tool is made."""

    with pytest.raises(ValueError) as caught:
        tool(late)
    message = str(caught.value)
    assert message.startswith("cannot read the type of parameter when of tool late ('Later'): ")
    assert "name 'Later' is not defined" in message
    assert "Fix: define or import Later before the tool is made" in message


def test_an_unresolvable_return_annotation_does_not_matter() -> None:
    from tether import tool

    def count(n: int) -> Unknowable:  # type: ignore[name-defined]  # noqa: F821
        """Only the parameters are the model's business."""
        return n  # type: ignore[no-any-return]

    assert tool(count).parameters["required"] == ["n"]


def test_a_module_global_is_not_shadowed_by_the_locals_of_an_unrelated_caller() -> None:
    from tether import tool

    Any = int  # noqa: F841  # a local of the decorating frame, not of the tool's scope

    made = tool(_module_level_tool)
    assert made.validate({"value": "text"}) == {"value": "text"}  # typing.Any, as the module says


def _module_level_tool(value: Any) -> str:
    """A tool whose annotation names a module global."""
    return str(value)


def test_agent_tool_inside_a_function_resolves_its_locals() -> None:
    from dataclasses import dataclass

    from tether import Agent, ToolContext
    from tether.testing import ScriptedModel, call

    @dataclass
    class Deps:
        units: str

    agent = Agent(ScriptedModel([call("weather", city="Oslo"), "done"]), name="w", deps_type=Deps)

    @agent.tool(effect="read_only")
    def weather(city: str, ctx: ToolContext[Deps]) -> str:
        """The weather, in the run's units."""
        return f"{city}: 3{ctx.deps.units}"

    state = agent.run("weather?", deps=Deps(units="C"))
    (result,) = [e for e in state.history if e.kind == "tool_finished"]
    assert (result.outcome, result.content[0]["text"]) == ("done", "Oslo: 3C")
