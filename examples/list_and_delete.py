"""List and delete runs (ported from alpineagents' "List and delete").

``store.list()`` returns a RunInfo for each run, most recently updated first; ``store.delete(id)`` deletes
one (a run a live process holds is refused).
"""

from __future__ import annotations

import os

from tether import Agent, FileStore
from tether.testing import ScriptedModel

if __name__ == "__main__":
    store = FileStore(".agent-runs")
    agent = Agent(
        os.environ.get("TETHER_MODEL")
        or ScriptedModel(["Done: PR 42 looks good.", "Done: PR 43 needs tests."]),
        store=store,
        name="reviewer",
    )
    agent.run("Review PR 42", id="review-pr-42")
    agent.run("Review PR 43", id="review-pr-43")

    for saved in store.list():
        print(saved.id, saved.status, repr(saved.first_message), saved.updated_at)

    top_level = [saved for saved in store.list() if saved.parent_id is None]
    print("top-level runs:", len(top_level))

    store.delete("review-pr-42")
    print("after delete:", [saved.id for saved in store.list()])
