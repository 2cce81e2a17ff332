"""The store conformance suite (``tether.testing.StoreConformance``) on MemoryStore, FileStore and SQLiteStore."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.register_assert_rewrite("tether._harness.conformance.suite")

from tether._harness.conformance.suite import StoreConformance  # noqa: E402
from tether.stores import FileStore, MemoryStore, Store  # noqa: E402
from tether.stores.sqlite import SQLiteStore  # noqa: E402


class TestMemoryStore(StoreConformance):
    multiprocess_skip_reason = "a MemoryStore lives in one process: other processes cannot open it"

    def make_store(self, tmp_path: Path) -> Store:
        return MemoryStore()

    def reopen(self, store: Store, tmp_path: Path) -> Store:
        return store  # the same object is the only way to reach the same runs


class TestFileStore(StoreConformance):
    def make_store(self, tmp_path: Path) -> Store:
        return FileStore(tmp_path / "runs")

    def store_url(self, tmp_path: Path) -> str:
        return f"file:{tmp_path / 'runs'}"


class TestSQLiteStore(StoreConformance):
    def make_store(self, tmp_path: Path) -> Store:
        return SQLiteStore(tmp_path / "runs.db")

    def store_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'runs.db'}"
