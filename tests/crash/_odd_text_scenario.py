"""A real process that drives one run whose tools meet a file name that is not UTF-8, for the crash tests.

    python tests/crash/_odd_text_scenario.py start|resume STORE_DIR RUN_ID SIDE_FILE FOLDER

FOLDER holds one file whose name's bytes are not UTF-8, so ``os.listdir`` returns it with a lone surrogate.
The model lists it, asks for details (a dict holding it), opens it (an error naming it) and answers with
it; ``remove`` waits for a person's approval. Tools record each execution in the side file. When the
process ends normally it writes ``SIDE_FILE.out.json``: status, answer, messages, and whether the State it
holds equals what ``store.load`` returns.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import orjson

from tether import Agent, FileStore, ToolContext, tool
from tether.testing import ExecutionLog, ScriptedModel, call


def build_agent(store_dir: str, side: str, folder: str) -> Agent:
    log = ExecutionLog(Path(side))

    def record(ctx: ToolContext) -> None:
        log.record(event="start", tool=ctx.tool, call_id=ctx.call_id, attempt=ctx.attempt, pid=os.getpid())

    @tool(effect="read_only")
    def listing(ctx: ToolContext) -> str:
        """The folder's file name."""
        record(ctx)
        return os.listdir(folder)[0]

    @tool(effect="read_only")
    def details(ctx: ToolContext) -> dict[str, Any]:
        """The name nested in a dict, as a key and in a list."""
        record(ctx)
        names = os.listdir(folder)
        return {"files": names, names[0]: {"size": 3}}

    @tool
    def open_file(name: str, ctx: ToolContext) -> str:
        """Fails, naming the file."""
        record(ctx)
        raise ValueError(f"cannot open {name}")

    @tool(approval=True)
    def remove(name: str, ctx: ToolContext) -> str:
        """Remove the file (after a person approves)."""
        record(ctx)
        return f"removed {name}"

    name = os.listdir(folder)[0]
    script = [
        call("listing"),
        call("details"),
        call("open_file", name=name),
        call("remove", name=name),
        f"found {name}",
    ]
    return Agent(
        ScriptedModel(script),
        name="odd",
        tools=[listing, details, open_file, remove],
        store=FileStore(store_dir),
        poll_interval=0.05,
    )


def main(argv: list[str]) -> int:
    mode, store_dir, run_id, side, folder = argv[:5]
    agent = build_agent(store_dir, side, folder)
    name = os.listdir(folder)[0]
    if mode == "start":
        state = agent.run(f"look at {name}", id=run_id, metadata={"file": name})
    else:
        state = agent.resume(run_id)
    loaded = FileStore(store_dir).load(run_id)
    out = {
        "status": state.status,
        "answer": state.answer,
        "messages": [{"role": m.role, "content": list(m.content)} for m in state.messages],
        "same_as_load": loaded.history == state.history and loaded.messages == state.messages,
    }
    Path(side + ".out.json").write_bytes(orjson.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
