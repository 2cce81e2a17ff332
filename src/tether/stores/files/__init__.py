"""FileStore: one journal, one inbox and one lock file per run in a folder (DURABILITY 4, 5).

``store.py`` is the store; ``_lock.py`` the byte-level appends and the lock file, ``_tail.py`` the
parsing of journal and inbox tails, ``_listing.py`` the listing over the folder.
"""

from .store import FileStore

__all__ = ["FileStore"]
