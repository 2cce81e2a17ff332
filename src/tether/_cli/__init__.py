"""The ``tether`` command (typer and rich, imported only by the command line)."""
