"""The crash harness: kill a run at every journal boundary in a real process and check it recovers.

``crash_test.py`` is the entry point (``tether.testing.crash_test``), ``runner.py`` runs the cases,
``child.py`` is the process that gets killed, ``checks.py`` judges what the journal and the side file show.
"""
