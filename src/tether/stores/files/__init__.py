"""FileStore: one journal, one inbox and one lock file per run in a folder (DURABILITY 4, 5).

``store.py`` is the store; ``_lock.py`` the byte-level appends, the run files and the lock file,
``_tail.py`` the parsing of journal and inbox tails, ``_tails.py`` the tails a store object keeps between
calls, ``_listing.py`` the listing and removal over the folder (``FileCatalog``), ``_info.py`` the listing
lines, ``_holders.py`` a holder hidden by a deleted lock file.
"""

from .store import FileStore

__all__ = ["FileStore"]
