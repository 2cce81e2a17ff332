"""The store conformance suite: subclass ``StoreConformance`` in a pytest module to check a Store.

```python
from tether.testing import StoreConformance

class TestMyStore(StoreConformance):
    def make_store(self, tmp_path):
        return MyStore(dsn_for(tmp_path))

    def store_url(self, tmp_path):
        return dsn_for(tmp_path)  # what tether.open_store opens to reach the same storage
```

Each test gets a fresh store from ``make_store(tmp_path)`` and runs twice: through the store's sync methods,
and through their ``a``-prefixed twins (each sync call of the case awaits the twin; ``faces.py``), so a
store implementing either face, or both, is checked to the same contract. Concurrency cases run real
processes (spawned, not forked) that open the store with ``tether.open_store(self.store_url(tmp_path))``; a
store of your own package gets there through its URL scheme (``tether.stores.register_scheme("myscheme",
factory)`` in the test module, registered again in each child process, or an entry point in the group
``tether.stores``); a store that lives in one process sets ``multiprocess_skip_reason``. Lease-expiry cases
run when a claim with a ttl returns a
Lease with ``expires_at`` (a ttl store); lock stores skip them. The cases follow the ``Store`` docstrings
(``tether.stores.base``), DESIGN 8 and DURABILITY 2-6. This module imports pytest: import it only in tests (and for pytest's detailed assertion messages, call
``pytest.register_assert_rewrite("tether._harness.conformance.suite")`` in your ``conftest.py``).
"""

from __future__ import annotations

import sys

import pytest

_PARTS = ("_conformance_support", "_conformance_journal", "_conformance_leases", "_conformance_listing")
# The cases live in those modules: have pytest rewrite their asserts as it does this module's.
pytest.register_assert_rewrite(
    *(f"{__package__}.{part}" for part in _PARTS if f"{__package__}.{part}" not in sys.modules)
)

from .journal import JournalCases  # noqa: E402
from .leases import LeaseCases  # noqa: E402
from .listing import ListingCases  # noqa: E402

__all__ = ["StoreConformance"]


class StoreConformance(JournalCases, LeaseCases, ListingCases):
    """The store contract as pytest tests. Subclass it (as ``Test...``) and implement ``make_store``."""
