"""Who may still drive a FileStore run whose ``<id>.lock`` was deleted or replaced (DURABILITY 4).

A ``flock`` excludes only takers of the same inode: once ``<id>.lock`` is unlinked (a temp-folder cleaner,
``find -delete``) or replaced, a taker creates or opens a new file and gets its lock while the holder still
holds the old inode. So every holder writes its lock file's own inode into it (``write_lock``), and a taker
whose freshly locked file does not name its own inode (a new file, a replaced one, a copy) looks for a
hidden holder before it takes the run: the pid named in that file and the pid of the journal's last
``run_resumed``. One of them that is alive on this host, is not this process and has the run's journal open
(holders keep it open from their take to their release; Linux's ``/proc`` tells) still drives the run, and
the take fails with ``RunBusyError`` naming it. Without ``/proc`` a live pid counts as a holder unless the
journal shows it released the run.

The holder, for its part, checks before each append and inbox poll that ``<id>.lock`` is still the inode
it locked, and re-creates and locks it when not (``relock``), with a warning, so later takers and ``holder``
probes find the run held again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

from ... import journal as j
from ...errors import RunBusyError
from .._records import Owner, pid_alive
from . import _lock as fl

__all__ = ["hidden_holder", "relock", "trusted"]

log = logging.getLogger("tether")


def trusted(fd: int) -> bool:
    """Whether the locked lock file on ``fd`` names its own inode: a file a holder of this inode wrote."""
    st = os.fstat(fd)
    return fl.read_lock(fd).get("inode") == [st.st_dev, st.st_ino]


def hidden_holder(
    run_id: str, fd: int, jpath: str, read: Callable[[], Sequence[j.Entry]], lpath: str
) -> RunBusyError | None:
    """The RunBusyError for a live process that holds the run through a lock file no longer at ``lpath``.

    Called by a taker holding the flock on ``fd`` (``lpath`` as it is now) when ``trusted(fd)`` is False;
    ``read`` gives the run's journal. None when no such process is found.
    """
    candidates: list[tuple[Owner, bool]] = []  # an owner, and whether the journal shows it released
    content = fl.read_lock(fd)
    if content.get("pid"):
        candidates.append((Owner.from_dict(content), False))
    try:
        entries = read()
    except (OSError, ValueError):
        entries = []
    released = False
    for entry in reversed(entries):
        if isinstance(entry, j.RunReleased | j.RunStopped):
            released = True
        elif isinstance(entry, j.RunResumed):
            candidates.append((Owner(entry.writer, entry.pid, entry.host, entry.at), released))
            break
    try:
        journal = os.stat(jpath)
    except FileNotFoundError:
        return None
    for owner, was_released in candidates:
        if owner.pid == os.getpid() or pid_alive(owner.pid, owner.host) is not True:
            continue  # this process (its store objects are asked apart), a dead pid, or another host
        has_open = _has_open(owner.pid, (journal.st_dev, journal.st_ino))
        if has_open or (has_open is None and not was_released):
            return RunBusyError(
                f"run {run_id} is driven by {owner.describe()} (that process is alive), though its lock file "
                f"{lpath} was deleted or replaced. Fix: wait for it, or stop that process; keep temp-file "
                "cleaners out of the store folder",
                run_id=run_id,
                owner=owner.to_dict(),
            )
    return None


def _has_open(pid: int, inode: tuple[int, int]) -> bool | None:
    """Whether process ``pid`` has the file ``inode`` open; None when ``/proc`` cannot tell."""
    folder = f"/proc/{pid}/fd"
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return None if not os.path.isdir("/proc/self/fd") else False  # no /proc, or the process ended
    except OSError:
        return None  # another user's process
    for name in names:
        try:
            st = os.stat(os.path.join(folder, name))
        except OSError:
            continue  # closed meanwhile, or not a file
        if (st.st_dev, st.st_ino) == inode:
            return True
    return False


def relock(
    run_id: str, inode: tuple[int, int], lpath: str, content: Callable[[], dict[str, object]]
) -> int | None:
    """If ``lpath`` is no longer the lock file the holder locked (``inode``), re-create and lock it.

    ``content()`` is what the new file gets written (called only then). Returns the new lock's fd (the
    caller closes its old one and keeps the new one), or None when ``lpath`` is still that file or another
    process has its new file locked for now (tried again next time).
    """
    if fl.names(lpath, inode):
        return None
    new = fl.take_lock(lpath, wait=0)
    if new is None:
        return None  # a taker holds the new file while it checks; it finds this process and lets go
    try:
        fl.write_lock(new, content())
    except BaseException:
        os.close(new)
        raise
    log.warning(
        "run %s: its lock file %s was deleted or replaced while this process (pid %d) held the run; "
        "re-created and locked it. Fix: keep temp-file cleaners and scripts out of the store folder",
        run_id,
        lpath,
        os.getpid(),
    )
    return new
