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
