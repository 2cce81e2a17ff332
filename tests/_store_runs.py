"""Entries, listing records and runs made by hand, for the tests of one store's primitives.

One copy: the store conformance suite's helpers (``tether._harness.conformance.support``), by the short names
the store tests use.
"""

from __future__ import annotations

from tether._harness.conformance.support import append_sealed as _append
from tether._harness.conformance.support import first_batch as _first
from tether._harness.conformance.support import make_sealed as _make
from tether._harness.conformance.support import messages as _batch
from tether._harness.conformance.support import record as _info

__all__ = ["_append", "_batch", "_first", "_info", "_make"]
