"""The model's context, built from a State: the only place that decides what a model sees (DESIGN 5.5)."""

from __future__ import annotations

from typing import Any

from .models.base import ModelRequest
from .state import State

__all__ = ["build_request"]


def build_request(state: State, instructions: str, tools: list[dict[str, Any]]) -> ModelRequest:
    """The next model request of ``state``.

    Raises:
        ValueError: a call of the last reply has no ``tool_finished`` (a model never sees a call without
            its result).
    """
    open_ids = [call.call_id for call in state.open_calls]
    if open_ids:
        raise ValueError(
            f"run {state.id} cannot ask the model while calls {', '.join(open_ids)} have no result. Fix: "
            "finish, abort or deny those calls first (agent.resume does)"
        )
    return ModelRequest(
        index=state.requests,
        instructions=instructions,
        messages=state.context_messages,
        tools=tools,
        run_id=state.id,
    )
