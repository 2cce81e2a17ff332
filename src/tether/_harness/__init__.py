"""The store conformance suite and the crash-injection harness, public through ``tether.testing``."""
