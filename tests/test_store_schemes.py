"""Store URL schemes of other packages (issue 13, item 7): ``tether.stores.register_scheme`` and the entry
point group ``tether.stores``, read by ``open_store``; the conformance suite reopening such a store in its
child processes; and what ``open_store`` says for URLs it cannot open (a bare word, ``memory:x``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.register_assert_rewrite("tether._harness.conformance.suite")

from _ledger_store import LedgerStore, open_ledger  # noqa: E402
from tether import Agent, FileStore, MemoryStore, open_store  # noqa: E402
from tether._cli.app import app  # noqa: E402
from tether._harness.conformance.suite import StoreConformance  # noqa: E402
from tether.stores import Store, _schemes, register_scheme  # noqa: E402
from tether.testing import ScriptedModel  # noqa: E402

register_scheme("ledger", open_ledger)


class TestRegisteredSchemeConformance(StoreConformance):
    """The whole suite on a store only its package can open; its child processes open ``ledger:///...``."""

    def make_store(self, tmp_path: Path) -> Store:
        return LedgerStore(tmp_path / "ledger.db")

    def store_url(self, tmp_path: Path) -> str:
        return f"ledger://{tmp_path / 'ledger.db'}"


# --------------------------------------------------------------------------------------------------
# register_scheme


def test_a_registered_scheme_opens_its_store_and_its_identity_opens_it_again(tmp_path: Path) -> None:
    store = open_store(f"ledger://{tmp_path / 'l.db'}")
    assert isinstance(store, LedgerStore) and store.identity == f"ledger://{tmp_path / 'l.db'}"
    Agent(ScriptedModel(["hi"]), name="a", store=store).run("hello", id="r")
    again = open_store(store.identity)
    assert again == store and again.load("r").status == "completed"


@pytest.fixture
def scratch_schemes() -> Iterator[None]:
    """Schemes a test registers are gone after it (the registry is the process's)."""
    before = dict(_schemes._registered)
    yield
    _schemes._registered.clear()
    _schemes._registered.update(before)


def test_register_scheme_refuses_tethers_own_names_bad_names_and_a_second_factory(
    scratch_schemes: None,
) -> None:
    for own in ("file", "sqlite", "postgresql", "postgres", "memory"):
        with pytest.raises(ValueError, match=f"store URL scheme '{own}' is tether's own. Fix: "):
            register_scheme(own, open_ledger)
    for bad in ("", "x", "Redis", "2db", "re dis", "redis:"):
        with pytest.raises(ValueError, match=r"is not a scheme name\. Fix: lower-case letters"):
            register_scheme(bad, open_ledger)
    with pytest.raises(TypeError, match="Fix: pass a callable taking the URL"):
        register_scheme("ledger2", "open_ledger")  # type: ignore[arg-type]
    register_scheme("ledger", open_ledger)  # the same factory again: nothing changes
    with pytest.raises(ValueError, match=r"'ledger' is registered already \(to _ledger_store.open_ledger\)"):
        register_scheme("ledger", LedgerStore)


def test_a_factory_that_returns_no_store_and_an_unknown_scheme_are_clear_errors(
    scratch_schemes: None,
) -> None:
    register_scheme("notastore", lambda url: object())
    with pytest.raises(TypeError, match=r"returned <object .*>, not a tether Store\. Fix: return"):
        open_store("notastore://x")
    with pytest.raises(ValueError) as caught:
        open_store("redis://localhost/0")
    text = str(caught.value)
    assert "unknown scheme 'redis'" in text and "'ledger:...'" in text, "registered schemes are offered"
    assert "register_scheme or an entry point in the group tether.stores" in text


def test_the_suite_names_a_factory_its_child_processes_cannot_import(scratch_schemes: None) -> None:
    from tether._harness.conformance.support import child_schemes

    register_scheme("local-only", lambda url: MemoryStore())
    with pytest.raises(TypeError, match=r"'local-only' is registered to <function .*a child process cannot"):
        child_schemes("local-only://x")
    assert child_schemes("ledger:///x.db") == {"ledger": open_ledger}, "others' local factories are left out"


# --------------------------------------------------------------------------------------------------
# The entry point group, in a process that has a store package installed (a dist-info on sys.path)

PACKAGE = """
from tether.stores.sqlite import SQLiteStore

class VaultStore(SQLiteStore):
    @property
    def identity(self):
        return f"vault://{self.path}"

def open_vault(url):
    return VaultStore(url.partition("://")[2])
"""

CHILD = """
import sys
import tether
assert "tether_vault" not in sys.modules, "import tether reads no entry point"
from tether import Agent, open_store
from tether.testing import ScriptedModel
store = open_store(sys.argv[1])
print(type(store).__name__, store.identity)
Agent(ScriptedModel(["hi"]), name="a", store=store).run("hello", id="r")
print(open_store(store.identity).load("r").status)
try:
    open_store("broken://x")
except ValueError as exc:
    print(exc)
"""


def _installed(site: Path) -> dict[str, str]:
    """A store package "installed" in ``site``: its module and a dist-info listing two entry points."""
    site.mkdir()
    (site / "tether_vault.py").write_text(PACKAGE)
    info = site / "tether_vault-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tether-vault\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[tether.stores]\nvault = tether_vault:open_vault\nbroken = tether_vault_missing:open\n"
    )
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}


def test_an_entry_point_scheme_is_read_on_first_use_and_a_broken_one_is_named(tmp_path: Path) -> None:
    env = _installed(tmp_path / "site")
    url = f"vault://{tmp_path / 'vault.db'}"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, url], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"VaultStore {url}"
    assert lines[1] == "completed"
    assert lines[2].startswith(
        "store URL scheme 'broken' comes from entry point 'tether_vault_missing:open' of tether-vault "
        "(group tether.stores), which cannot be loaded: ModuleNotFoundError"
    )
    assert lines[2].endswith("Fix: reinstall that package, or uninstall it")


SUITE = """
from pathlib import Path
from tether.stores import Store
from tether._harness.conformance.suite import StoreConformance
from tether_vault import VaultStore

class TestVault(StoreConformance):
    def make_store(self, tmp_path: Path) -> Store:
        return VaultStore(tmp_path / "vault.db")

    def store_url(self, tmp_path: Path) -> str:
        return f"vault://{tmp_path / 'vault.db'}"
"""


def test_the_suites_child_processes_open_an_entry_point_scheme(tmp_path: Path) -> None:
    env = _installed(tmp_path / "site")
    (tmp_path / "test_vault.py").write_text(SUITE)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "process or concurrent",
         str(tmp_path / "test_vault.py")],
        capture_output=True, text=True, env=env, timeout=300, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    # the 5 cross-process cases, each through the sync face and the async one
    assert summary.startswith("10 passed") and "skipped" not in summary, done.stdout[-2000:]


# --------------------------------------------------------------------------------------------------
# URLs open_store cannot open, and the CLI's documented forms


@pytest.mark.parametrize("url", ["memory:x", "memory:runs", "memory:///tmp/x"])
def test_a_memory_url_with_a_name_is_refused_with_the_fix(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        open_store(url)
    assert str(caught.value).startswith(f"store URL {url!r} names a memory store, but a memory store has no")
    assert "Fix: 'memory:'" in str(caught.value)
    assert isinstance(open_store("memory:"), MemoryStore) and isinstance(open_store("memory://"), MemoryStore)


@pytest.mark.parametrize(
    ("word", "fix"),
    [
        ("runs", "Fix: 'file:runs' (or './runs') for a folder of runs, or 'sqlite:///runs.db' for a SQLite file"),
        ("runs.db", "Fix: 'sqlite:///runs.db' for a SQLite file here (or 'file:runs.db' for a folder of that name)"),
        ("memory", "Fix: 'memory:' for a store in this process"),
    ],
)  # fmt: skip
def test_a_bare_word_is_refused_with_what_it_likely_meant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, word: str, fix: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as caught:
        open_store(word)
    assert str(caught.value) == f"store URL {word!r} has no scheme, so it may be a folder or a file. {fix}"
    assert list(tmp_path.iterdir()) == [], "nothing was created"


def test_paths_with_a_slash_and_the_clis_plain_forms_still_open_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert isinstance(open_store("./runs"), FileStore) and isinstance(
        open_store(str(tmp_path / "b")), FileStore
    )
    Agent(ScriptedModel(["hi"]), name="a", store=FileStore("runs")).run("hello", id="in-folder")
    from tether import SQLiteStore

    Agent(ScriptedModel(["hi"]), name="a", store=SQLiteStore("runs.db")).run("hello", id="in-file")
    runner = CliRunner()
    for flag, run_id in (("runs", "in-folder"), ("runs.db", "in-file")):  # docs/cli.md: a plain path
        result = runner.invoke(app, ["ls", "--store", flag, "--json"])
        assert result.exit_code == 0, result.output
        assert run_id in result.output
