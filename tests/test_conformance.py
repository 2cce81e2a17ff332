"""The store conformance suite (``tether.testing.StoreConformance``) on MemoryStore, FileStore and SQLiteStore."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

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


# --------------------------------------------------------------------------------------------------
# The lapsed-lease case catches a store whose append skips the fence


class _SkipsExpiry(SQLiteStore):
    """Broken on purpose: its fence checks the token but not the expiry (an append revives a lapsed lease)."""

    def append(self, run_id: str, entries: Any, *, lease_token: int | None, **kwargs: Any) -> None:
        with self._write(run_id) as conn:
            conn.execute(
                "UPDATE runs SET lease_expires_at = ?, lease_owner = COALESCE(lease_owner, '{}') "
                "WHERE id = ? AND lease_token = ?",
                (time.time() + 30, run_id, lease_token),
            )
        super().append(run_id, entries, lease_token=lease_token, **kwargs)


class _SkipsFence(SQLiteStore):
    """Broken on purpose: no fence at all (any token's append is taken, as the run's current one)."""

    def append(self, run_id: str, entries: Any, *, lease_token: int | None, **kwargs: Any) -> None:
        with self._write(run_id) as conn:
            (token,) = conn.execute("SELECT lease_token FROM runs WHERE id = ?", (run_id,)).fetchone()
            conn.execute(
                "UPDATE runs SET lease_expires_at = ?, lease_owner = COALESCE(lease_owner, '{}') WHERE id = ?",
                (time.time() + 30, run_id),
            )
        super().append(run_id, entries, lease_token=token, **kwargs)


@pytest.mark.parametrize("broken", [_SkipsExpiry, _SkipsFence])
def test_the_lapsed_lease_case_fails_on_a_store_whose_append_skips_the_fence(
    tmp_path: Path, broken: type[SQLiteStore]
) -> None:
    case = TestSQLiteStore()
    store, other = broken(tmp_path / "runs.db"), SQLiteStore(tmp_path / "runs.db")
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        case.test_an_append_after_the_lease_lapsed_is_refused_with_the_lease_error(store, other)
    fine = tmp_path / "fine.db"
    case.test_an_append_after_the_lease_lapsed_is_refused_with_the_lease_error(
        SQLiteStore(fine), SQLiteStore(fine)
    )
