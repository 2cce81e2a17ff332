"""Shared fixtures and helpers for tether's tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes more than a second or two (real processes, many posts)")
    config.addinivalue_line("markers", "crash: kills real processes and resumes the run in a new one")


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Each in-process test that takes ``store`` runs against MemoryStore and FileStore."""
    from tether import FileStore, MemoryStore

    made = MemoryStore() if request.param == "memory" else FileStore(tmp_path / "runs")
    yield made
    made.close()
