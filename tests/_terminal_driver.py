"""A real process that drives a run whose approvals are asked on its terminal, for tests/test_humans.py.

    python tests/_terminal_driver.py STORE_DIR RELEASE_FILE SIDE_FILE

The model asks to publish twice; each call waits for approval (``TerminalHuman(by="alice")`` on this
process's stdin and stdout, a pty in the test). The first publish, once approved, waits until RELEASE_FILE
exists. Each execution appends its text to SIDE_FILE. Prints ``STATUS <status>`` when the run returns.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tether import Agent, FileStore, TerminalHuman, tool
from tether.testing import ScriptedModel, call


def main(store_dir: str, release: str, side: str) -> int:
    @tool(approval=True)
    def publish(text: str) -> str:
        """Publish a text."""
        with open(side, "a") as out:
            out.write(text + "\n")
        while text == "first" and not Path(release).exists():
            time.sleep(0.01)
        return f"published {text}"

    model = ScriptedModel([call("publish", text="first"), call("publish", text="second"), "done"])
    agent = Agent(
        model,
        name="publisher",
        tools=[publish],
        store=FileStore(store_dir),
        human=TerminalHuman(by="alice"),
        poll_interval=0.05,
    )
    state = agent.run("publish twice", id="tty")
    print(f"STATUS {state.status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
