"""A lost lease is reported as a lost lease, whatever the drive was doing when the renewer found it.

The renewer (``_run/renewal.py``) cancels the drive when it finds the lease lost. That cancel can reach a
drive that is already closing (its own append was refused, and it is giving the lease up): the outcome must
still be ``LeaseLostError``, never a plain ``CancelledError``, so a Worker logs the lease loss. The order is
forced, not timed: the store's ``abandon`` waits until the renewer has reported the loss.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tether import Agent, tool
from tether._run import drive as drive_module
from tether._run.renewal import Renewer
from tether.errors import LeaseLostError
from tether.stores._records import lease_lost_error
from tether.stores.base import Lease
from tether.stores.memory import MemoryStore
from tether.testing import ScriptedModel, call


class _TakenOverStore(MemoryStore):
    """A ttl store whose run is taken over by another process as soon as ``taken_over`` is set.

    From then on appends are refused; renewals fail only once the drive has begun giving the lease up
    (``closing``), and ``abandon`` returns only once the renewer has reported the loss (``reported``).
    """

    ttl = 0.4

    def __init__(self) -> None:
        super().__init__()
        self.taken_over = threading.Event()
        self.closing = threading.Event()
        self.reported = threading.Event()

    def append(self, run_id: str, entries: Any, **kwargs: Any) -> None:
        if self.taken_over.is_set():
            raise lease_lost_error(run_id, kwargs.get("lease_token"), None)
        super().append(run_id, entries, **kwargs)

    def renew(self, lease: Lease) -> Lease:
        if self.closing.is_set():
            raise lease_lost_error(lease.run_id, lease.token, None)
        return super().renew(lease)

    def abandon(self, lease: Lease) -> None:
        self.closing.set()
        assert self.reported.wait(30), "the renewer never reported the lost lease"
        super().abandon(lease)


def test_a_lease_lost_while_the_drive_closes_is_raised_as_a_lease_loss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = _TakenOverStore()

    class _ReportingRenewer(Renewer):
        def __init__(self, *args: Any) -> None:
            *rest, on_lost = args

            def lost() -> None:
                on_lost()  # schedules the drive's cancel on its loop
                store.reported.set()  # before abandon's result is delivered to that loop

            super().__init__(*rest, lost)

    monkeypatch.setattr(drive_module, "Renewer", _ReportingRenewer)

    @tool(effect="idempotent")
    def step() -> str:
        """Do a step while another process takes the run over."""
        store.taken_over.set()
        return "done"

    agent = Agent(ScriptedModel([call("step"), "Finished."]), tools=[step], store=store, poll_interval=0.05)
    with pytest.raises(LeaseLostError, match=r"lease"):
        agent.run("go", id="lost-while-closing")
    assert store.reported.is_set() and store.closing.is_set()  # the order this test is about happened
    assert Agent(ScriptedModel(["Fine."])).run("next").status == "completed"  # the thread's runner works


class _RenewedWhileReleasing(MemoryStore):
    """A ttl store whose ``release`` returns only once a renewal has run after the lease was let go.

    That renewal finds no lease (it was released), as the renewal thread can at any time while the drive
    releases; it must not be taken for a lost lease.
    """

    ttl = 0.4

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()
        self.renewed_after = threading.Event()
        self.renew_errors: list[BaseException] = []

    def release(self, lease: Lease, *, at_seq: int, inbox_len: int) -> bool:
        done = super().release(lease, at_seq=at_seq, inbox_len=inbox_len)
        if done:
            self.released.set()
            assert self.renewed_after.wait(30), "no renewal ran after the release"
        return done

    def renew(self, lease: Lease) -> Lease:
        after = self.released.is_set()
        try:
            return super().renew(lease)
        except BaseException as exc:
            self.renew_errors.append(exc)
            raise
        finally:
            if after:
                self.renewed_after.set()


def test_a_renewal_that_runs_while_the_drive_releases_is_no_lost_lease() -> None:
    store = _RenewedWhileReleasing()
    agent = Agent(ScriptedModel(["Finished."]), store=store, poll_interval=0.05)
    state = agent.run("go", id="renewed-while-releasing")  # raised LeaseLostError before the fix
    assert state.status == "completed"
    assert store.renewed_after.is_set()
    assert [type(e) for e in store.renew_errors] == [LeaseLostError]  # the renewal found the lease let go
    assert store.holder("renewed-while-releasing") is None
