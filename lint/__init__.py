"""Lint checks of tether's own that the linters do not have (run by ``make lint``; not part of the package)."""
