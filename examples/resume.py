"""Resume after a crash (ported from Agentor): a new process, knowing only the run's id, finishes the run.

A finished run is returned as it is, with no model call and no tool run; a run cut off mid-way continues
from its journal, and the weather tool, whose result was saved, does not run again.

    python resume.py london-weather
"""

from __future__ import annotations

import sys

from weather import build_agent

if __name__ == "__main__":
    state = build_agent().resume(sys.argv[1])
    print("status:", state.status)
    print("answer:", state.answer)
