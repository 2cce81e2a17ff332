"""The ``tether`` command: ``python -m tether.cli`` and the console script land here."""

from ._cli.app import app, main

__all__ = ["app", "main"]

if __name__ == "__main__":
    main()
