"""The store conformance suite: ``StoreConformance``, one module a theme (journal, leases, listing)."""
