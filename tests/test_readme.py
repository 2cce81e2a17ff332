"""README.md's quick start runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_opens_with_make_demo_and_make_test() -> None:
    text = README.read_text()
    first_block = text.split("```")[1]
    assert "make demo" in first_block and "make test" in first_block


def test_quick_start_runs_as_written(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python block"
    script = tmp_path / "quick_start.py"
    script.write_text(blocks[0])
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    run_id, status, answer = out.stdout.split(" ", 2)
    assert status == "completed"
    assert answer.strip() == "It is sunny and 22C in London."
    assert (tmp_path / "runs" / f"{run_id}.jsonl").exists()


def test_the_async_handler_runs_as_written(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from tether import SQLiteStore, State

    block = next(
        b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S) if "store.aload(" in b
    )
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    code = block.replace('"postgresql://app@db/app?schema=tether"', repr(url))  # the same handler, on SQLite
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    SQLiteStore(tmp_path / "runs.db").save(State(id="r1", messages=["hello"]))
    with TestClient(namespace["app"]) as client:  # type: ignore[arg-type]
        assert client.get("/runs/r1").json() == {"status": "running", "answer": None, "turn": 0}
        assert client.post("/runs/r1/cancel").json() == {"cancelled": True}
        assert client.get("/runs/r1").json()["status"] == "cancelled"
