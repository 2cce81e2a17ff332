"""FileStore: bytes, locks, leases, inbox and crash behaviour, on real files and real processes (no mocks)."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from tether import journal as j
from tether._harness.conformance.support import writer_of
from tether.errors import (
    ConflictError,
    CorruptJournalError,
    LeaseLostError,
    NewerFormatError,
    RunBusyError,
    RunNotFoundError,
)
from tether.messages import Message
from tether.state import State
from tether.stores.base import Lease, Owner
from tether.stores.files import FileStore, _info

SRC = str(Path(__file__).resolve().parents[1] / "src")

# --------------------------------------------------------------------------------------------------
# Helpers


def new_state(run_id: str, *, messages: int = 1, **started: Any) -> State:
    state = State(id=run_id)
    writer_of(state).add(j.RunStarted, root_id=started.pop("root_id", run_id), **started)
    for i in range(messages):
        writer_of(state).add(j.MessageAdded, role="user", content=[{"type": "text", "text": f"hello {i}"}])
    return state


def create(store: FileStore, run_id: str, *, held: bool = True, messages: int = 1, **started: Any):
    state = new_state(run_id, messages=messages, **started)
    lease = store.create(
        run_id,
        writer_of(state).next_batch(),
        state.info(),
        owner=Owner.here(writer_of(state).writer_id) if held else None,
    )
    writer_of(state).batch_saved()
    return state, lease


def queue_messages(state: State, n: int = 1, text: str = "more") -> list[j.Entry]:
    for i in range(n):
        writer_of(state).add(j.MessageAdded, role="user", content=[{"type": "text", "text": f"{text} {i}"}])
    return writer_of(state).next_batch()


def append(
    store: FileStore, state: State, lease: Lease | None, n: int = 1, text: str = "more"
) -> list[j.Entry]:
    batch = queue_messages(state, n, text)
    store.append(
        state.id,
        batch,
        expected_seq=batch[0].seq,
        writer=writer_of(state).writer_id,
        lease_token=lease.token if lease else None,
        info=state.info(),
    )
    writer_of(state).batch_saved()
    return batch


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINT"}
    return {**env, "PYTHONPATH": SRC, **extra}


def py(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run python code in a child process to its end (killed by a failpoint, perhaps)."""
    argv = [sys.executable, "-c", textwrap.dedent(code), *args]
    return subprocess.run(argv, env=child_env(**env), capture_output=True, text=True, timeout=60)


def spawn(code: str, *args: str) -> subprocess.Popen:
    """Start python code in a child process that keeps running; its stdout is a pipe."""
    argv = [sys.executable, "-c", textwrap.dedent(code), *args]
    return subprocess.Popen(argv, env=child_env(), stdout=subprocess.PIPE, text=True)


def rchar() -> int:
    """Bytes this process has read through read()/pread() so far (Linux /proc)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise AssertionError("no rchar")


CHILD_PRELUDE = """
import sys, time
from tether import journal as j
from tether.stores.base import Owner
from tether.stores.files import FileStore
from tether.writing import JournalWriter
store = FileStore(sys.argv[1])
"""


# --------------------------------------------------------------------------------------------------
# Create and read


def test_create_read_round_trip_with_private_modes(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    old = os.umask(0)
    try:
        store = FileStore(folder)
        state, lease = create(store, "r1", held=False, messages=2)
    finally:
        os.umask(old)
    assert lease is None
    assert store.identity == "file:" + str(folder.resolve())
    assert store == FileStore(str(folder) + "/")
    assert mode(folder) == 0o700
    assert sorted(p.name for p in folder.iterdir()) == ["r1.inbox.jsonl", "r1.jsonl", "r1.lock"]
    for name in ("r1.jsonl", "r1.inbox.jsonl", "r1.lock"):
        assert mode(folder / name) == 0o600
    assert store.read("r1") == state.history
    assert store.read("r1", after_seq=1) == state.history[2:]
    assert store.length("r1") == 3
    assert store.inbox_length("r1") == 0 and store.read_inbox("r1") == []
    assert FileStore(folder).read("r1") == state.history  # another object, cold caches
    lines = (folder / "r1.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and orjson.loads(lines[-2])["info"]["length"] == 3
    assert [orjson.loads(line).get("b", 0) for line in lines[:3]] == [2, 1, 0]  # 0 is left out


def test_folder_is_created_on_first_write_not_by_looking(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "a" / "b")
    assert store.list() == []
    assert not (tmp_path / "a").exists()
    create(store, "r1", held=False)
    assert mode(tmp_path / "a" / "b") == 0o700


def test_a_store_path_that_is_a_file_is_refused_with_a_fix(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"is a file\. Fix: "):
        FileStore(tmp_path / "f").list()


def test_existing_id_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    create(store, "r1", held=False)
    store.post("r1", {"type": "message", "role": "user", "content": []})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    other = new_state("r1")
    for s in (store, FileStore(tmp_path)):
        with pytest.raises(ValueError, match=r"run r1 already exists\. Fix: "):
            s.create("r1", writer_of(other).next_batch(), other.info(), owner=Owner.here())
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_bad_run_ids_touch_no_path(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs")
    for bad in ("../x", "a/b", "", ".hidden", "x" * 129):
        with pytest.raises(ValueError, match="is not valid"):
            store.read(bad)
        with pytest.raises(ValueError, match="is not valid"):
            store.post(bad, {"type": "cancel"})
    assert not any(tmp_path.rglob("*.jsonl"))


def test_missing_runs(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    for call in (
        lambda: store.read("nope"),
        lambda: store.length("nope"),
        lambda: store.post("nope", {"type": "cancel"}),
        lambda: store.read_inbox("nope"),
        lambda: store.inbox_length("nope"),
        lambda: store.claim("nope", Owner.here()),
        lambda: store.holder("nope"),
        lambda: store.delete("nope"),
    ):
        with pytest.raises(RunNotFoundError):
            call()
    assert not store.exists("nope")
    assert list(tmp_path.iterdir()) == []  # no lock or inbox left behind


# --------------------------------------------------------------------------------------------------
# Leases


def test_created_held_then_another_store_is_busy(tmp_path: Path) -> None:
    a, b = FileStore(tmp_path), FileStore(tmp_path)
    state, lease = create(a, "r1")
    assert lease is not None and lease.token == 1 and lease.expires_at is None and a.ttl is None
    with pytest.raises(RunBusyError, match=rf"driven by pid {os.getpid()} on host .* is alive\)\. Fix: "):
        b.claim("r1", Owner.here())
    with pytest.raises(RunBusyError):
        a.claim("r1", Owner.here())  # one holder, even in the same store object
    holder = b.holder("r1")
    assert holder is not None and holder.pid == os.getpid() and holder.writer == writer_of(state).writer_id
    assert a.renew(lease) == lease
    assert a.release(lease, at_seq=2, inbox_len=0)
    assert b.holder("r1") is None
    with pytest.raises(LeaseLostError):
        a.renew(lease)
    lease2 = b.claim("r1", Owner.here())
    assert lease2.token == 2
    content = orjson.loads((tmp_path / "r1.lock").read_bytes())
    assert (
        content["token"] == 2
        and content["pid"] == os.getpid()
        and {"host", "since", "writer"} <= set(content)
    )


def test_tokens_increase_across_claims_and_store_objects(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state, lease = create(store, "r1", held=False)
    tokens = []
    for i in range(5):
        s = FileStore(tmp_path) if i % 2 else store
        lease = s.claim("r1", Owner.here(writer_of(state).writer_id))
        tokens.append(lease.token)
        append(s, state, lease)
        s.abandon(lease)
        s.abandon(lease)  # twice is harmless
    assert tokens == [1, 2, 3, 4, 5]
    last = orjson.loads((tmp_path / "r1.jsonl").read_bytes().split(b"\n")[-2])["i"]  # a short listing line
    assert last["token"] == 5 and store.list()[0].length == 7
    (tmp_path / "r1.lock").write_bytes(b"")  # a lost lock content: the journal's last token still counts
    assert store.claim("r1", Owner.here()).token == 6


def test_claim_after_holder_process_is_killed(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    create(store, "r1", held=False)
    child = spawn(
        CHILD_PRELUDE
        + """
lease = store.claim("r1", Owner.here())
print(lease.token, flush=True)
time.sleep(60)
""",
        str(tmp_path),
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "1"
        with pytest.raises(RunBusyError, match=rf"pid {child.pid} .*that process is alive") as err:
            store.claim("r1", Owner.here())
        assert err.value.owner["pid"] == child.pid
        assert store.holder("r1").pid == child.pid  # type: ignore[union-attr]
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        assert store.holder("r1") is None
        lease = store.claim("r1", Owner.here())
        assert lease.token == 2
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_forked_child_does_not_keep_the_lease(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state, lease = create(store, "r1")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a tool that forked while its driver held the run
        try:
            try:
                append(store, state, lease)
                os.write(write_end, b"appended")
            except LeaseLostError:
                os.write(write_end, b"refused")
            time.sleep(30)
        finally:
            os._exit(0)
    try:
        os.close(write_end)
        assert os.read(read_end, 100) == b"refused"
        store.abandon(lease)  # the parent (the driver) lets go while the child still lives
        lease2 = FileStore(tmp_path).claim("r1", Owner.here())
        assert lease2.token == 2
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_end)


def test_holder_probes_never_make_a_take_fail(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    create(store, "r1", held=False)
    prober = spawn(
        CHILD_PRELUDE
        + """
print("go", flush=True)
end = time.monotonic() + 3
while time.monotonic() < end:
    store.holder("r1")
""",
        str(tmp_path),
    )
    try:
        assert prober.stdout is not None and prober.stdout.readline().strip() == "go"
        for _ in range(200):
            lease = store.claim("r1", Owner.here())
            store.abandon(lease)
    finally:
        prober.kill()
        prober.wait()


def test_append_is_fenced_by_the_held_lock(tmp_path: Path) -> None:
    a, b = FileStore(tmp_path), FileStore(tmp_path)
    state, lease = create(a, "r1")
    with pytest.raises(LeaseLostError, match=r"Fix: "):
        append(b, state, lease)  # another store object does not hold it, whatever the token
    state = a.load("r1")
    with pytest.raises(LeaseLostError):
        a.append(
            "r1",
            queue_messages(state),
            expected_seq=2,
            writer=writer_of(state).writer_id,
            lease_token=99,
            info={},
        )
    a.abandon(lease)
    lease2 = b.claim("r1", Owner.here())
    state = b.load("r1")
    with pytest.raises(LeaseLostError):
        a.append(
            "r1",
            queue_messages(state),
            expected_seq=2,
            writer=writer_of(state).writer_id,
            lease_token=lease.token,
            info={},
        )
    b.append(
        "r1",
        writer_of(state).next_batch(),
        expected_seq=2,
        writer=writer_of(state).writer_id,
        lease_token=lease2.token,
        info={},
    )
    assert b.length("r1") == 3


# --------------------------------------------------------------------------------------------------
# Appending


def test_retried_append_is_skipped_and_conflicts_are_refused(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state, lease = create(store, "r1")
    assert lease is not None
    batch = queue_messages(state, 2)
    for _ in range(3):  # a retried append resends byte-identical entries: stored once
        store.append(
            "r1",
            batch,
            expected_seq=2,
            writer=writer_of(state).writer_id,
            lease_token=lease.token,
            info=state.info(),
        )
    writer_of(state).batch_saved()
    assert store.length("r1") == 4 and store.read("r1") == state.history
    size = (tmp_path / "r1.jsonl").stat().st_size

    for s in (store, FileStore(tmp_path)):  # warm cache, then a tail-scan cache
        stale = State.replay("r1", store.read("r1")[:3])  # another writer that saw 3 entries
        other = queue_messages(stale)
        lease_s = lease if s is store else None
        if lease_s is None:
            store.abandon(lease)
            lease_s = s.claim("r1", Owner.here())
        with pytest.raises(ConflictError, match=r"run r1 seq 3 holds a message entry from writer") as err:
            s.append(
                "r1",
                other,
                expected_seq=3,
                writer=writer_of(stale).writer_id,
                lease_token=lease_s.token,
                info={},
            )
        assert err.value.seq == 3
        older = queue_messages(State.replay("r1", store.read("r1")[:1]))  # conflicts with the created batch
        with pytest.raises(ConflictError, match="seq 1 holds a message entry"):
            s.append("r1", older, expected_seq=1, writer="w", lease_token=lease_s.token, info={})
        far = j.seal([j.MessageAdded(seq=5, at=j.now_iso(), role="user", content=[])], "w", run_id="r1")
        with pytest.raises(ConflictError, match="leaves a gap after 4 entries"):
            s.append("r1", far, expected_seq=5, writer="w", lease_token=lease_s.token, info={})
        lease = lease_s
    assert (tmp_path / "r1.jsonl").stat().st_size == size


def test_unsealed_entries_are_refused(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    _, lease = create(store, "r1")
    entry = j.MessageAdded(seq=2, at=j.now_iso(), role="user", content=[])
    with pytest.raises(ValueError, match="sealed batch"):
        store.append("r1", [entry], expected_seq=2, writer="w", lease_token=lease.token, info={})
    store.append("r1", [], expected_seq=2, writer="w", lease_token=lease.token, info={})  # nothing to do
    with pytest.raises(ValueError, match="sealed batch"):
        store.append(
            "r1",
            j.seal([entry], "w", run_id="r1")[::-1] * 2,
            expected_seq=2,
            writer="w",
            lease_token=1,
            info={},
        )
    assert store.length("r1") == 2


def test_torn_tail_is_ignored_by_readers_and_cut_by_the_next_append(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state, lease = create(store, "r1")
    append(store, state, lease)
    path = tmp_path / "r1.jsonl"
    good = path.read_bytes()
    torn_batch = queue_messages(State.replay("r1", state.history), 2, "torn")
    whole = b"".join(j.encode_entry(e) + b"\n" for e in torn_batch)
    for tail in (
        b'{"kind":"message","se',
        whole[: len(whole) - 5],
        whole,
    ):  # cut, cut after a line, no listing
        path.write_bytes(good + tail)
        for s in (store, FileStore(tmp_path)):
            assert s.read("r1") == state.history
            assert s.length("r1") == 3
            assert [i.status for i in s.list()] == ["running"]
    batch = append(store, state, lease, 2, "after")
    data = path.read_bytes()
    assert data.startswith(good) and b"torn" not in data and data.endswith(b"\n")
    assert FileStore(tmp_path).read("r1") == state.history and state.history[-2:] == batch


def test_bit_flip_in_a_middle_line_is_corruption(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state, lease = create(store, "r1", messages=3)
    append(store, state, lease, 2)
    path = tmp_path / "r1.jsonl"
    data = path.read_bytes()
    flipped = data.replace(b"hello 1", b"hellp 1")
    path.write_bytes(flipped)
    with pytest.raises(
        CorruptJournalError,
        match=r"run r1 seq 2 is damaged: (the entry|line \d+ of \S+) fails its checksum \(it is damaged, or of another run\)\. Fix",
    ):
        FileStore(tmp_path).read("r1")
    path.write_bytes(data.replace(b'"hello 1"', b'"hello 1'))  # no longer JSON
    with pytest.raises(
        CorruptJournalError, match=r"run r1 seq 2 is damaged: line 3 of .*r1\.jsonl is not valid JSON"
    ):
        FileStore(tmp_path).read("r1")
    lines = data.split(b"\n")
    path.write_bytes(b"\n".join(lines[:4] + lines[5:]))  # a listing line missing mid-file: not a torn tail
    with pytest.raises(
        CorruptJournalError, match="seq 4 is damaged: the append before this entry has no listing"
    ):
        FileStore(tmp_path).read("r1")
    # a damaged complete line after the last complete append is corruption too: never cut off
    extra = queue_messages(State.replay("r1", state.history), 2, "torn")
    damaged = j.encode_entry(extra[0]).replace(b"torn", b"tore") + b"\n"
    path.write_bytes(data + damaged)
    fresh = FileStore(tmp_path)
    store.abandon(lease)
    lease2 = fresh.claim("r1", Owner.here(writer_of(state).writer_id))
    with pytest.raises(CorruptJournalError, match="seq 6 is damaged"):
        fresh.append(
            "r1", extra, expected_seq=6, writer=writer_of(state).writer_id, lease_token=lease2.token, info={}
        )
    assert path.read_bytes() == data + damaged


def test_newer_format_is_refused(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    create(store, "r1", held=False, version=j.FORMAT_VERSION + 1)
    with pytest.raises(NewerFormatError, match="Fix: upgrade tether"):
        FileStore(tmp_path).read("r1")
    assert [i.status for i in FileStore(tmp_path).list()] == ["newer format"]


def test_appends_read_only_the_tail(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state, _ = create(store, "big", held=False, messages=4000)
    assert (tmp_path / "big.jsonl").stat().st_size > 500_000
    fresh = FileStore(tmp_path)
    before = rchar()
    lease = fresh.claim("big", Owner.here(writer_of(state).writer_id))
    for _ in range(20):
        append(fresh, state, lease)
    assert fresh.length("big") == 4021 and FileStore(tmp_path).length("big") == 4021
    assert len(fresh.list()) == 1
    assert rchar() - before < 100_000
    follower = FileStore(tmp_path)
    assert len(follower.read("big")) == 4021
    append(fresh, state, lease)
    before = rchar()
    assert [e.seq for e in follower.read("big", after_seq=4020)] == [4021]  # only the new bytes are read
    assert rchar() - before < 10_000


# --------------------------------------------------------------------------------------------------
# Failures and failpoints

APPEND_IN_CHILD = (
    CHILD_PRELUDE
    + """
state = store.load("r1")
writer = JournalWriter(state)
lease = store.claim("r1", Owner.here(writer.writer_id))
for text in ("a" * 300, "b" * 300):
    writer.add(j.MessageAdded, role="user", content=[{"type": "text", "text": text}])
batch = writer.next_batch()
store.append("r1", batch, expected_seq=batch[0].seq, writer=writer.writer_id, lease_token=lease.token, info=state.info())
print("survived", flush=True)
"""
)


def test_failpoint_torn_append_leaves_a_torn_tail_the_next_append_repairs(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state, _ = create(store, "r1", held=False)
    path = tmp_path / "r1.jsonl"
    good = path.read_bytes()
    done = py(APPEND_IN_CHILD, str(tmp_path), TETHER_FAILPOINT="torn_append:3")
    assert done.returncode == -signal.SIGKILL and "survived" not in done.stdout
    torn = path.read_bytes()
    assert torn.startswith(good) and len(torn) > len(good) and not torn.endswith(b"\n")
    assert store.read("r1") == state.history and store.length("r1") == 2
    lease = store.claim("r1", Owner.here(writer_of(state).writer_id))  # the dead child's lock went with it
    assert lease.token == 2
    batch = append(store, state, lease, 1, "repaired")
    data = path.read_bytes()
    assert data.startswith(good) and b"aaaa" not in data and data.endswith(b"\n")
    assert FileStore(tmp_path).read("r1")[-1] == batch[0]


@pytest.mark.parametrize(("point", "stored"), [("after_append", 4), ("before_append", 2)])
def test_failpoints_kill_before_and_after_a_durable_append(tmp_path: Path, point: str, stored: int) -> None:
    store = FileStore(tmp_path)
    create(store, "r1", held=False)
    done = py(APPEND_IN_CHILD, str(tmp_path), TETHER_FAILPOINT=f"{point}:message#2")
    assert done.returncode == -signal.SIGKILL and "survived" not in done.stdout
    assert store.length("r1") == stored and len(store.read("r1")) == stored
    assert store.holder("r1") is None
    assert store.claim("r1", Owner.here()).token == 2


def test_a_failed_write_is_undone(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    create(store, "r1", held=False)
    done = py(
        CHILD_PRELUDE
        + """
import os, resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
path = sys.argv[1] + "/r1.jsonl"
state = store.load("r1")
writer = JournalWriter(state)
lease = store.claim("r1", Owner.here(writer.writer_id))
size = os.path.getsize(path)
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 2000, resource.RLIM_INFINITY))
writer.add(j.MessageAdded, role="user", content=[{"type": "text", "text": "x" * 5000}])
batch = writer.next_batch()
try:
    store.append("r1", batch, expected_seq=2, writer=writer.writer_id, lease_token=lease.token, info={})
except OSError as exc:
    print("failed", exc.errno, os.path.getsize(path) == size)
state = store.load("r1")
writer = JournalWriter(state, writer.writer_id)
writer.add(j.MessageAdded, role="user", content=[{"type": "text", "text": "small"}])
store.append("r1", writer.next_batch(), expected_seq=2, writer=writer.writer_id, lease_token=lease.token, info={})
print("length", store.length("r1"))
""",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["failed", "27", "True", "length", "3"]  # EFBIG, then nothing left behind
    assert [e.seq for e in store.read("r1")] == [0, 1, 2]


# --------------------------------------------------------------------------------------------------
# Inbox


def test_inbox_posts_are_idempotent_and_dense(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    create(store, "r1", held=False)
    msg = {"type": "message", "role": "user", "content": [{"type": "text", "text": "hi"}], "seen_seq": 2}
    assert store.post("r1", msg, item_id="a") == 0
    assert store.post("r1", {"type": "cancel", "by": "me"}) == 1
    assert store.post("r1", msg, item_id="a") == 0
    assert FileStore(tmp_path).post("r1", msg, item_id="a") == 0  # a cold cache reads the file
    assert FileStore(tmp_path).post("r1", {**msg, "item_id": "b"}) == 2
    with pytest.raises(ValueError, match="is not known"):
        store.post("r1", {"type": "bogus"})
    assert store.inbox_length("r1") == 3 and FileStore(tmp_path).inbox_length("r1") == 3
    items = store.read_inbox("r1")
    assert [(i.inbox_seq, i.item_id, i.type) for i in items] == [
        (0, "a", "message"),
        (1, items[1].item_id, "cancel"),
        (2, "b", "message"),
    ]
    assert (
        items[0].body == {"role": "user", "content": [{"type": "text", "text": "hi"}]}
        and items[0].seen_seq == 2
    )
    assert [i.inbox_seq for i in store.read_inbox("r1", after_seq=0)] == [1, 2]
    assert store.read_inbox("r1", after_seq=2) == []
    path = tmp_path / "r1.inbox.jsonl"
    path.write_bytes(path.read_bytes() + b'{"inbox_seq": 3, "item_')  # a poster died mid-line
    assert store.inbox_length("r1") == 3 and len(store.read_inbox("r1")) == 3
    assert store.post("r1", {"type": "cancel"}, item_id="c") == 3
    assert path.read_bytes().endswith(b"\n") and len(path.read_bytes().split(b"\n")) == 5
    assert [i.inbox_seq for i in FileStore(tmp_path).read_inbox("r1")] == [0, 1, 2, 3]


def _poster(folder: str, worker: int, count: int) -> None:
    store = FileStore(folder)
    for i in range(count):
        store.post("r1", {"type": "message", "role": "user", "content": []}, item_id=f"{worker}-{i}")


def test_posts_from_four_processes_are_numbered_densely(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state, lease = create(store, "r1")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_poster, args=(str(tmp_path), w, 50)) for w in range(4)]
    for p in procs:
        p.start()
    while any(p.is_alive() for p in procs):  # the holder appends meanwhile
        append(store, state, lease)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    items = FileStore(tmp_path).read_inbox("r1")
    assert [i.inbox_seq for i in items] == list(range(200))
    assert sorted(i.item_id for i in items) == sorted(f"{w}-{i}" for w in range(4) for i in range(50))
    assert store.inbox_length("r1") == 200
    assert FileStore(tmp_path).read("r1") == state.history


def test_posts_from_many_threads_share_one_store(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    create(store, "r1", held=False)
    threads = [threading.Thread(target=_poster, args=(str(tmp_path), w, 25)) for w in range(4)]
    threads += [
        threading.Thread(
            target=lambda w=w: [store.post("r1", {"type": "cancel"}, item_id=f"t{w}-{i}") for i in range(25)]
        )
        for w in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [i.inbox_seq for i in store.read_inbox("r1")] == list(range(200))


def test_release_is_refused_when_the_inbox_or_journal_grew(tmp_path: Path) -> None:
    store, other = FileStore(tmp_path), FileStore(tmp_path)
    state, lease = create(store, "r1")
    other.post("r1", {"type": "cancel"})
    assert store.release(lease, at_seq=2, inbox_len=0) is False
    with pytest.raises(RunBusyError):
        other.claim("r1", Owner.here())  # still held
    assert store.release(lease, at_seq=1, inbox_len=1) is False
    append(store, state, lease)
    assert store.release(lease, at_seq=2, inbox_len=1) is False
    assert store.release(lease, at_seq=3, inbox_len=1) is True
    assert other.claim("r1", Owner.here()).token == 2
    assert store.release(lease, at_seq=3, inbox_len=1) is True  # nothing of ours left to release


# --------------------------------------------------------------------------------------------------
# Delete and list


def test_delete_refuses_a_held_run(tmp_path: Path) -> None:
    store, other = FileStore(tmp_path), FileStore(tmp_path)
    _, lease = create(store, "r1")
    for s in (store, other):
        with pytest.raises(RunBusyError):
            s.delete("r1")
    assert store.release(lease, at_seq=2, inbox_len=0)
    other.delete("r1")
    assert list(tmp_path.iterdir()) == []
    for call in (
        lambda: store.read("r1"),
        lambda: store.post("r1", {"type": "cancel"}),
        lambda: store.length("r1"),
    ):
        with pytest.raises(RunNotFoundError):
            call()
    state2, lease2 = create(store, "r1")  # the id can be used again
    assert lease2 is not None and store.read("r1") == state2.history and store.inbox_length("r1") == 0


def test_list_reads_the_listing_records_and_filters(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    a, lease_a = create(store, "a", agent="writer")
    writer_of(a).add(j.ModelReplied, content=[{"type": "text", "text": "done"}])
    writer_of(a).add(j.RunStopped, status="completed", answer="done")
    store.append(
        "a",
        writer_of(a).next_batch(),
        expected_seq=2,
        writer=writer_of(a).writer_id,
        lease_token=lease_a.token,
        info=a.info(),
    )
    writer_of(a).batch_saved()
    store.release(lease_a, at_seq=4, inbox_len=0)
    time.sleep(0.002)
    child, _ = create(store, "c", held=False, agent="helper", parent_id="a", root_id="a")
    time.sleep(0.002)
    _, lease_b = create(store, "b", agent="writer")
    store.post("b", {"type": "cancel"})
    (tmp_path / "junk.jsonl").write_bytes(b"not json at all\n")
    (tmp_path / ".tmp.x.tmp").write_bytes(b"")

    runs = store.list()
    assert [r.id for r in runs[:3]] == ["b", "c", "a"] and {r.id for r in runs} == {"a", "b", "c", "junk"}
    by_id = {r.id: r for r in runs}
    assert by_id["junk"].status == "damaged"
    ra, rb, rc = by_id["a"], by_id["b"], by_id["c"]
    assert (ra.status, ra.turn, ra.agent, ra.length, ra.lease_owner, ra.first_message) == (
        "completed", 1, "writer", 4, None, "hello 0",
    )  # fmt: skip
    assert (rb.status, rb.inbox_len, rb.lease_owner) == ("running", 1, f"{lease_b.owner.host}:{os.getpid()}")
    assert (rc.parent_id, rc.root_id, rc.agent) == ("a", "a", "helper")
    assert rc.updated_at == child.updated_at and rc.created_at == child.created_at
    assert [r.id for r in store.list(status="completed")] == ["a"]
    assert [r.id for r in store.list(agent="writer")] == ["b", "a"]
    assert [r.id for r in store.list(parent_id="a")] == ["c"]
    assert [r.id for r in store.list(root_id="a")] == ["c", "a"]
    assert [r.id for r in store.list(limit=1)] == ["b"]


def test_list_reads_only_each_journals_tail(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state, lease = create(store, "r1", messages=200)
    append(store, state, lease)
    path = tmp_path / "r1.jsonl"
    data = path.read_bytes()
    assert len(data) > 20_000
    path.write_bytes(data.replace(b"hello 1", b"hellp 1", 1))  # damage far from the tail
    [info] = FileStore(tmp_path).list()
    assert (info.status, info.length) == ("running", 202)
    with pytest.raises(CorruptJournalError):
        FileStore(tmp_path).read("r1")


# --------------------------------------------------------------------------------------------------
# With the Store base class


def test_save_load_and_settle_through_the_base_class(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = State(id="r1", messages=[Message.user("hi")])
    store.save(state)
    assert store.load("r1").history == state.history
    state = store.load("r1")  # as a caller usually has it: loaded from the store
    state.add_message("again")
    store.save(state)  # posted, then settled: no one holds the run
    loaded = FileStore(tmp_path).load("r1")
    assert [e.kind for e in loaded.history] == ["run_started", "message", "message"]
    assert loaded.history[-1].inbox_seq == 0 and loaded.inbox_consumed == 0
    assert store.cancel("r1") is not None
    assert FileStore(tmp_path).load("r1").status == "cancelled"
    assert store.holder("r1") is None


# --------------------------------------------------------------------------------------------------
# Races between processes


def _post_and_settle(folder: str, worker: int, count: int) -> None:
    store = FileStore(folder)
    for i in range(count):
        text = [{"type": "text", "text": f"{worker}-{i}"}]
        store.post("r1", {"type": "message", "role": "user", "content": text}, item_id=f"{worker}-{i}")
        store.settle("r1")  # DURABILITY 2.1: try once more to take the run after posting


def test_posters_that_settle_leave_no_item_unjournaled(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    create(store, "r1", held=False)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_post_and_settle, args=(str(tmp_path), w, 25)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    state = FileStore(tmp_path).load("r1")
    journaled = [
        e.inbox_seq for e in state.history if isinstance(e, j.MessageAdded) and e.inbox_seq is not None
    ]
    assert journaled == list(range(100))  # each item once, in inbox order, none left behind
    assert store.inbox_length("r1") == 100 and store.holder("r1") is None


def test_readers_see_only_complete_appends(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    create(store, "r1", held=False)  # 2 entries, then appends of 3
    writer = spawn(
        CHILD_PRELUDE
        + """
state = store.load("r1")
writer = JournalWriter(state)
lease = store.claim("r1", Owner.here(writer.writer_id))
print("go", flush=True)
for i in range(150):
    for k in range(3):
        writer.add(j.MessageAdded, role="user", content=[{"type": "text", "text": f"{i}-{k}" * 50}])
    batch = writer.next_batch()
    store.append("r1", batch, expected_seq=batch[0].seq, writer=writer.writer_id, lease_token=lease.token, info={})
    writer.batch_saved()
""",
        str(tmp_path),
    )
    assert writer.stdout is not None and writer.stdout.readline().strip() == "go"
    reader, lengths = FileStore(tmp_path), set()
    last: list[j.Entry] = []
    while True:
        done = writer.poll() is not None
        last = last + reader.read("r1", after_seq=len(last) - 1)  # tails, as follow() does
        lengths.add(len(last))
        assert (len(last) - 2) % 3 == 0 and FileStore(tmp_path).length("r1") >= len(last)
        if done:
            break
    assert writer.returncode == 0
    assert last == FileStore(tmp_path).read("r1") and len(last) == 452 and len(lengths) > 1


def test_a_follower_reads_across_a_torn_tail_and_its_repair(tmp_path: Path) -> None:
    store, follower = FileStore(tmp_path), FileStore(tmp_path)
    state, lease = create(store, "r1")
    assert follower.read("r1") == state.history
    path = tmp_path / "r1.jsonl"
    path.write_bytes(path.read_bytes() + b'{"kind":"message","seq":2,"a')
    assert follower.read("r1", after_seq=1) == [] and follower.length("r1") == 2
    batch = append(store, state, lease, 2)
    assert follower.read("r1", after_seq=1) == batch and follower.length("r1") == 4
    assert follower.read("r1", after_seq=3) == [] and follower.read("r1", after_seq=2) == batch[1:]


def test_close_gives_up_held_runs(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    create(store, "r1")
    store.close()
    assert FileStore(tmp_path).claim("r1", Owner.here()).token == 2


def test_list_shows_runs_with_missing_or_partial_listing_records(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    create(store, "ok", held=False)
    (tmp_path / "empty.jsonl").write_bytes(b"")
    path = tmp_path / "bare.jsonl"
    create(store, "bare", held=False)
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([*lines[:-2], b'{"info":{"length":2}}', b""]))  # an info without fields
    runs = {r.id: r for r in store.list()}
    assert runs["empty"].status == "damaged"
    assert (runs["bare"].status, runs["bare"].length, runs["bare"].agent) == ("running", 2, None)
    assert runs["ok"].status == "running"
    assert len(store.read("bare")) == 2


# --------------------------------------------------------------------------------------------------
# claim_next and prune read the listing without locks, then check again under the run's lock


def test_prune_keeps_a_run_posted_to_after_the_listing_was_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    for run_id in ("r1", "r2"):
        state, lease = create(store, run_id)
        writer_of(state).add(j.RunStopped, status="completed", answer="done")
        batch = writer_of(state).next_batch()
        store.append(
            run_id,
            batch,
            expected_seq=2,
            writer=writer_of(state).writer_id,
            lease_token=lease.token,
            info=state.info(),
        )
        assert store.release(lease, at_seq=3, inbox_len=0)
    stale = store._catalog.scan()
    store.post("r1", {"type": "message", "role": "user", "content": []})  # after the listing was read
    monkeypatch.setattr(store._catalog, "scan", lambda: stale)
    assert store.prune(timedelta(seconds=-60), dry_run=True) == ["r1", "r2"]  # what the stale listing says
    assert store.prune(timedelta(seconds=-60)) == ["r2"]  # r1 is checked again under its locks: kept
    assert store.exists("r1") and not store.exists("r2") and store.inbox_length("r1") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r1.inbox.jsonl", "r1.jsonl", "r1.lock"]


def test_claim_next_checks_the_run_again_once_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    state, lease = create(store, "r1", held=False)
    stale = store._catalog.scan()  # r1 running, no holder: it needs work
    lease = store.claim("r1", Owner.here(writer_of(state).writer_id))
    writer_of(state).add(j.RunStopped, status="completed", answer="done")
    batch = writer_of(state).next_batch()
    store.append(
        "r1",
        batch,
        expected_seq=2,
        writer=writer_of(state).writer_id,
        lease_token=lease.token,
        info=state.info(),
    )
    assert store.release(lease, at_seq=3, inbox_len=0)  # a driver finished it meanwhile
    monkeypatch.setattr(store._catalog, "scan", lambda: stale)
    assert store.claim_next(Owner.here()) is None  # claimed, found done, released
    assert store.holder("r1") is None
    store.post("r1", {"type": "message", "role": "user", "content": []})
    taken = store.claim_next(Owner.here())  # the stale listing, but the fresh record has an item
    assert taken is not None and taken.run_id == "r1" and store.holder("r1") == taken.owner


def test_a_deleted_lock_file_lets_no_other_store_object_of_this_process_in_and_the_holder_relocks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    holder_store, other = FileStore(tmp_path), FileStore(tmp_path)
    state, lease = create(holder_store, "r1")
    assert lease is not None
    (tmp_path / "r1.lock").unlink()
    with pytest.raises(RunBusyError, match=f"pid {os.getpid()} "):
        other.claim("r1", Owner.here())
    with pytest.raises(RunBusyError):
        other.delete("r1")
    with caplog.at_level("WARNING", logger="tether"):
        append(holder_store, state, lease)  # the holder's next append locks a new lock file
    assert "r1.lock was deleted or replaced" in caplog.text
    assert other.holder("r1") is not None  # a probe sees it held again
    with pytest.raises(RunBusyError):
        other.claim("r1", Owner.here())
    assert holder_store.release(lease, at_seq=len(state.history), inbox_len=0)
    assert other.claim("r1", Owner.here()).token == lease.token + 1  # released: free as before


def test_a_short_listing_line_holds_what_the_general_rule_keeps() -> None:
    """The short line's fast path (a State's info) writes what the rule for any info writes."""
    at = j.now_iso()
    last = [j.MessageAdded(seq=1, at=at)]
    static = {"agent": "a", "created_at": at, "first_message": "m", "parent_id": None, "root_id": "r"}
    values = {
        "status": [None, "running", "waiting"],
        "turn": [None, 0, 3],
        "updated_at": [None, at, "2026-01-01T00:00:00.000000Z"],
        "inbox_consumed": [None, -1, 4],
    }
    missing = object()
    for combo in itertools.product(*([missing, *v] for v in values.values()), [None, 0, 2]):
        *fields, token = combo
        info = {**static, **{k: v for k, v in zip(values, fields, strict=True) if v is not missing}}
        line = _info.listing_line(last, [b'{"h":"x"}'], info, 2, token, _info.static_of(info), 0)
        assert orjson.loads(line) == {"i": _info._short(info, token, at)}, (info, token)
