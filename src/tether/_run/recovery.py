"""What a taker does with a run it took, from what the journal recorded (DESIGN 7).

``check_agent`` notes a changed model, instructions, tool set or budgets; ``recover`` closes the open calls
the journal says must be closed (denied, cut off ``unsafe`` calls, tools the agent no longer has) and
leaves the calls that can run for the loop. Both only queue entries: they are flushed with the drive's
first start or request, so a decision and its start share an append.
"""

from __future__ import annotations

from typing import Any

from .. import journal as j
from .._calls import ABORTED_UNKNOWN
from .._consume import ArgsCheck, close_denied, close_invalid_edit
from ..messages import text_block
from ..tools import ToolInputError
from .agent_spec import DrivenAgent
from .writer import Writer

__all__ = ["args_check", "check_agent", "recover"]


def args_check(agent: DrivenAgent) -> ArgsCheck:
    """How this agent validates a person's edited arguments: None when valid, else the message."""

    def check(tool_name: str, args: Any) -> str | None:
        tool = agent.tools.get(tool_name)
        if tool is None:
            return None  # recovery closes a call of a tool the agent lacks
        try:
            tool.validate(args)
        except ToolInputError as exc:
            return str(exc)
        return None

    return check


def check_agent(writer: Writer, agent: DrivenAgent) -> None:
    """Queue ``agent_changed`` and ``budgets_changed`` when the resuming agent differs from the journal's.

    Raises:
        ValueError: the agent differs and ``strict_resume`` is set.
    """
    state = writer.journal.state
    if not state.history:
        return
    fingerprint = agent.fingerprint()
    if state.fingerprint is not None and state.fingerprint != fingerprint:
        if agent.strict_resume:
            raise ValueError(
                f"run {state.id} was started with another model, instructions or tool set. Fix: resume it "
                "with the agent it was started with, or pass strict_resume=False"
            )
        writer.act()
        writer.add(j.AgentChanged, old=state.fingerprint, new=fingerprint)
    budgets = agent.budgets()
    if budgets != state.budgets:
        writer.act()
        writer.add(j.BudgetsChanged, old=state.budgets, new=budgets)


def recover(writer: Writer, agent: DrivenAgent) -> None:
    """Close what the journal says must be closed; calls to run stay open for the loop."""
    state = writer.journal.state
    writer.trace.recovered(state.open_calls, agent)
    for call in state.open_calls:
        tool = agent.tools.get(call.tool)
        record = state.call(call.call_id)
        assert record is not None
        if call.action == "wait":
            continue
        edited = record.edited_args
        if call.action == "run" and edited is not None and tool is not None:
            # approved with edited arguments, journaled by a taker without the agent: checked before a start
            check = args_check(agent)
            if check(call.tool, edited) is not None:
                writer.act()
                close_invalid_edit(writer.journal, call.call_id, call.tool, edited, check)
            continue
        if call.action == "deny":
            writer.act()
            decision = record.decision
            assert decision is not None
            close_denied(writer.journal, call.call_id, decision.round, decision.by, decision.reason)
        elif tool is None and call.action in ("run", "retry", "abort") and call.attempt == 0:
            writer.act()
            text = agent.unknown_tool_text(call.tool)
            writer.add(
                j.ToolFinished, call_id=call.call_id, outcome="input_error", content=[text_block(text)]
            )
        elif tool is None and call.action in ("retry", "abort"):
            writer.act()
            text = f"aborted: tool {call.tool} is not in this agent"
            writer.add(j.ToolFinished, call_id=call.call_id, outcome="aborted", content=[text_block(text)])
        elif call.action == "abort":
            writer.act()
            if call.reason == ABORTED_UNKNOWN and agent.on_unknown == "ask":
                writer.add(
                    j.ApprovalRequested,
                    call_id=call.call_id,
                    round=max(record.last_round + 1, 1),  # round 0 is for rules (DURABILITY 2.5)
                    tool=call.tool,
                    args=call.args,
                    question="the run stopped while this call ran: run it again, or report it aborted?",
                )
            else:
                text = call.reason if call.reason.startswith("unknown") else f"aborted: {call.reason}"
                writer.add(
                    j.ToolFinished, call_id=call.call_id, outcome="aborted", content=[text_block(text)]
                )
