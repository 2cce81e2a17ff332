"""Save a run (ported from Agentor's "Resume an agent run after a crash").

Every step is journaled in runs/<run id>.jsonl as it happens. Run it, kill it partway (or set
TETHER_FAILPOINT=after_append:tool_finished to have tether kill it right after the tool's result is
durable), then continue it from another process with ``python resume.py <run id>``.

The model is scripted so the example runs offline; pass model="anthropic:claude-sonnet-4-5" (with
``pip install 'tether[anthropic]'``) for a real one.
"""

from __future__ import annotations

import os

from tether import Agent, FileStore, tool
from tether.testing import ScriptedModel, call


@tool(effect="read_only")
def get_weather(city: str) -> str:
    """Get the current weather for a city.

    Args:
        city: The city to look up.
    """
    with open("weather-calls.log", "a") as log:  # a side file, to see how often the tool really ran
        log.write(f"{city} pid={os.getpid()}\n")
    return f"The weather in {city} is sunny and 22C."


def build_agent() -> Agent:
    """The same agent in every process: same name, instructions and tools."""
    return Agent(
        model=os.environ.get("TETHER_MODEL")  # e.g. anthropic:claude-sonnet-4-5 with ANTHROPIC_API_KEY set
        or ScriptedModel(
            [call("get_weather", city="London"), "The weather in London is sunny with a temperature of 22°C."]
        ),
        name="weather",
        instructions="You are a helpful weather assistant.",
        tools=[get_weather],
        store=FileStore("runs"),
    )


if __name__ == "__main__":
    agent = build_agent()
    run_id = os.environ.get("RUN_ID", "london-weather")
    print("RUN_ID", run_id, flush=True)
    state = agent.run("What is the weather in London?", id=run_id)
    print("status:", state.status)
    print("answer:", state.answer)
