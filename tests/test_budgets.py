"""Budgets: max_turns, max_tokens and max_cost as totals over a whole run, resumes included (DESIGN 7, 10)."""

from __future__ import annotations

from typing import Any

import pytest

from tether import Agent, ModelReply, State, Store, ToolContext, tool
from tether.budgets import Price, PublishedPrice, cost_of, price_for, window_for
from tether.testing import ScriptedModel, call


@tool(effect="read_only")
def ping(ctx: ToolContext) -> str:
    """Ping."""
    return "pong"


def entries(state: State, kind: str) -> list[Any]:
    return [e for e in state.history if e.kind == kind]


def looping(**kw: Any) -> tuple[Agent, ScriptedModel]:
    """An agent whose model calls ping for ever (each reply: 10 input and 5 output tokens)."""
    model = ScriptedModel([call("ping")] * 50, name=kw.pop("model_name", "scripted"))
    return Agent(model, name="budget", tools=[ping], **kw), model


def test_max_turns_stops_the_run_with_the_reason(store: Store) -> None:
    agent, model = looping(store=store, max_turns=3)
    state = agent.run("go", id="r")
    assert state.status == "stopped" and state.turn == 3
    assert state.reason is not None and "max_turns" in state.reason and "3" in state.reason
    assert len(model.requests) == 3
    assert [e.kind for e in state.history][-3:] == ["tool_started", "tool_finished", "run_stopped"]
    assert state.open_calls == []
    (started,) = entries(state, "run_started")
    assert started.budgets == {"max_turns": 3}
    assert store.load("r").status == "stopped" and store.load("r").reason == state.reason


def test_max_tokens_stops_the_run(store: Store) -> None:
    agent, model = looping(store=store, max_tokens=40)
    state = agent.run("go")
    assert state.status == "stopped" and "max_tokens" in (state.reason or "")
    assert state.usage == {"input_tokens": 30, "output_tokens": 15}  # 45 >= 40 after the third reply
    assert len(model.requests) == 3


def test_max_cost_with_a_price_stops_the_run(store: Store) -> None:
    price = Price(input=100_000.0, output=100_000.0)  # $1.50 a reply of 15 tokens
    agent, model = looping(store=store, max_cost=4, price=price)
    state = agent.run("go")
    assert state.status == "stopped" and "max_cost" in (state.reason or "")
    assert len(model.requests) == 3  # $4.50 >= $4 after the third reply
    assert cost_of(state.usage, price) == pytest.approx(4.5)


def test_max_cost_below_a_dollar_is_allowed(store: Store) -> None:
    agent, model = looping(store=store, max_cost=0.0002, price=Price(input=3.0, output=15.0))
    state = agent.run("go")
    assert state.status == "stopped" and "max_cost" in (state.reason or "")
    assert len(model.requests) == 2  # (10 * 3 + 5 * 15) / 1e6 = $0.000105 a reply; $0.00021 >= $0.0002


@pytest.mark.parametrize("name", ["max_turns", "max_tokens", "max_cost"])
@pytest.mark.parametrize("value", [0, -1])
def test_a_budget_that_is_not_positive_is_refused(name: str, value: int) -> None:
    with pytest.raises(ValueError, match="Fix"):
        Agent(ScriptedModel([]), price=Price(1.0, 1.0), **{name: value})


def test_max_cost_without_a_known_price_is_refused_when_the_agent_is_built() -> None:
    with pytest.raises(ValueError) as info:
        Agent(ScriptedModel([], name="my-local-model"), max_cost=5)
    assert "no price for model my-local-model. Fix: pass price=" in str(info.value)
    Agent(ScriptedModel([], name="my-local-model"), max_cost=5, price=Price(1.0, 2.0))


def test_known_model_prices() -> None:
    from genai_prices import Usage, calc_price

    sonnet = price_for("claude-sonnet-4-5")
    assert sonnet is not None and (sonnet.input, sonnet.output) == (3.0, 15.0)
    assert (sonnet.cache_read, sonnet.cache_write) == (0.3, 3.75)
    assert price_for("claude-sonnet-4-5-20250929") == sonnet, "a dated name is the same model"
    assert price_for("gpt-4.1-mini") != price_for("gpt-4.1")
    assert price_for("no-such-model") is None
    assert price_for("llama3") is None, "another provider's list price is not a local server's"
    # the price is genai-prices': Anthropic bills 1,000 uncached input tokens, 2,000 cache reads, 500 cache
    # writes and 300 output tokens at 1000 x 3 + 2000 x 0.3 + 500 x 3.75 + 300 x 15 = $9,975 per million
    usage = {
        "input_tokens": 1000,
        "cache_read_input_tokens": 2000,
        "cache_creation_input_tokens": 500,
        "output_tokens": 300,
    }
    # genai-prices counts input_tokens as all input, cache reads and writes included
    published = calc_price(
        Usage(input_tokens=3500, cache_read_tokens=2000, cache_write_tokens=500, output_tokens=300),
        "claude-sonnet-4-5",
        provider_id="anthropic",
    )
    assert cost_of(usage, sonnet) == pytest.approx(float(published.total_price)) == pytest.approx(0.009975)
    # a model tether knows needs no price= for max_cost
    agent = Agent(ScriptedModel([], name="claude-sonnet-4-5"), max_cost=5)
    assert agent.price == sonnet
    assert cost_of({"input_tokens": 1_000_000, "output_tokens": 1_000_000}, sonnet) == pytest.approx(18.0)


def test_a_price_is_looked_up_only_when_a_cost_needs_it() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from tether import Agent; from tether.testing import ScriptedModel; "
        "a = Agent(ScriptedModel([], name='claude-sonnet-4-5')); print('genai_prices' in sys.modules); "
        "print(a.price.input, 'genai_prices' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "3.0", "True"]
    lazy = Agent(ScriptedModel([], name="my-local-model")).price
    assert isinstance(lazy, PublishedPrice) and not lazy.known and lazy.input == 0.0


def test_an_inherited_max_cost_prices_a_subagent_that_has_none_of_its_own() -> None:
    from tether import budgets

    price = Agent(ScriptedModel([], name="gpt-4o-mini")).price
    assert price is not None
    usage = {"input_tokens": 1_000_000, "output_tokens": 0}
    assert (
        budgets.exceeded({"max_cost": 0.1}, 1, usage, price) == "max_cost: $0.1500 reached the limit of 0.1"
    )


def test_context_windows() -> None:
    assert window_for("claude-sonnet-4-5") == 200_000
    assert window_for("gpt-4o-mini") == 128_000
    assert window_for("claude-x") == 200_000, "a name genai-prices does not know: the prefix table"
    assert window_for("no-such-model") is None


def test_max_tokens_counts_every_token_once(store: Store) -> None:
    cached = ModelReply(
        [{"type": "tool_call", "name": "ping", "args": {}, "provider_call_id": "t1"}],
        "tool_use",
        {"input_tokens": 100, "cache_read_input_tokens": 800, "output_tokens": 100},
    )
    model = ScriptedModel([cached, cached, cached])
    state = Agent(model, name="budget", tools=[ping], store=store, max_tokens=1500).run("go")
    assert state.status == "stopped" and len(model.requests) == 2  # 1,000 tokens a reply; 2,000 >= 1,500


def test_totals_survive_resumes_and_the_resuming_agents_limits_apply(store: Store) -> None:
    first, _ = looping(store=store, max_turns=2)
    state = first.run("go", id="r")
    assert state.status == "stopped" and state.turn == 2
    length = len(store.read("r"))

    # the same limit: stays stopped, no model request, nothing written
    same, same_model = looping(store=store, max_turns=2)
    again = same.resume("r")
    assert again.status == "stopped" and again.turn == 2
    assert same_model.requests == []
    assert len(store.read("r")) == length

    # a raised limit: budgets_changed first, then it continues to the new total (turns count from the start)
    raised, raised_model = looping(store=store, max_turns=5)
    more = raised.resume("r")
    new = more.history[length:]
    assert [e.kind for e in new][:2] == ["run_resumed", "budgets_changed"]
    (changed,) = entries(more, "budgets_changed")
    assert (changed.old, changed.new) == ({"max_turns": 2}, {"max_turns": 5})
    assert more.status == "stopped" and more.turn == 5 and "max_turns" in (more.reason or "")
    assert [r.index for r in raised_model.requests] == [2, 3, 4]
    assert more.usage == {"input_tokens": 50, "output_tokens": 25}
    assert store.load("r").budgets == {"max_turns": 5}


def test_a_lower_limit_on_resume_stops_an_unfinished_run(store: Store) -> None:
    @tool(approval=True)
    def gated(ctx: ToolContext) -> str:
        """Needs approval."""
        return "gated done"

    model = ScriptedModel([call("gated"), call("gated"), "never"])
    agent = Agent(model, name="budget", tools=[gated], store=store, max_turns=5)
    state = agent.run("go", id="r")
    assert state.status == "waiting" and state.turn == 1
    state.approve("c3_0")
    store.save(state)
    lower = Agent(model, name="budget", tools=[gated], store=store, max_turns=1)
    done = lower.resume("r")
    assert done.status == "stopped" and "max_turns" in (done.reason or "")
    assert [e.kind for e in done.history].count("budgets_changed") == 1
    assert len(model.requests) == 1, "the approved call ran, then the lower limit allowed no request"
    assert [e.outcome for e in entries(done, "tool_finished")] == ["done"]


def test_max_tokens_counts_the_usage_the_provider_reports(store: Store) -> None:
    big = ModelReply(
        [{"type": "tool_call", "name": "ping", "args": {}, "provider_id": "t1"}],
        "tool_use",
        {"input_tokens": 700, "output_tokens": 100},
    )
    model = ScriptedModel([big, big, big])
    agent = Agent(model, name="budget", tools=[ping], store=store, max_tokens=1000)
    state = agent.run("go", id="r")
    assert state.status == "stopped" and state.usage == {"input_tokens": 1400, "output_tokens": 200}
    assert len(model.requests) == 2
    (stopped,) = entries(state, "run_stopped")
    assert stopped.usage == {"input_tokens": 1400, "output_tokens": 200}
