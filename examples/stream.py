"""Streamed runs are saved too (ported from Agentor's stream_chat example).

``agent.stream(...)`` drives the run and yields each journal entry once its append returned, plus text
deltas as the model produces them. A consumer that stops early leaves the run resumable.
"""

from __future__ import annotations

import asyncio
import os

from tether import Agent, EntryEvent, FileStore, TextDelta, tool
from tether.testing import ScriptedModel, call


@tool(effect="read_only")
def get_weather(city: str) -> str:
    """Get the current weather for a city.

    Args:
        city: The city to look up.
    """
    return f"The weather in {city} is cloudy and 15C."


async def main() -> None:
    model = os.environ.get("TETHER_MODEL") or ScriptedModel(
        [call("get_weather", city="Tokyo"), "It is cloudy and 15C in Tokyo."], stream_chunk=8
    )
    agent = Agent(model, name="weather", tools=[get_weather], store=FileStore("runs"))
    async for event in agent.stream("What is the weather in Tokyo?", id="tokyo-weather"):
        if isinstance(event, EntryEvent):
            print("entry:", event.entry.seq, event.entry.kind)
        elif isinstance(event, TextDelta):
            print("text:", repr(event.text))


if __name__ == "__main__":
    asyncio.run(main())
