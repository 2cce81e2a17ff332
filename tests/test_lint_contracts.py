"""The ``no_cycles`` import-linter contract of ``make lint`` (``lint/import_cycles.py``), on packages made here."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import grimp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: where lint/ is

from lint.import_cycles import NoImportCycles, strongly_connected


def _package(root: Path, name: str, files: dict[str, str]) -> grimp.ImportGraph:
    for path, text in files.items():
        file = root / name / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(textwrap.dedent(text))
    sys.path.insert(0, str(root))
    try:
        return grimp.build_graph(name, cache_dir=None)
    finally:
        sys.path.remove(str(root))


def _check(graph: grimp.ImportGraph) -> list[dict]:
    check = NoImportCycles("no cycles", {}, {}).check(graph, verbose=False)
    assert check.kept is not bool(check.metadata["groups"])
    return check.metadata["groups"]


def _chains(group: dict) -> list[list[str]]:
    return [[link["importer"] for link in links] for links in group["cycles"]]


def test_lazy_and_type_checking_imports_make_cycles(tmp_path: Path) -> None:
    graph = _package(
        tmp_path,
        "cyc_lazy",
        {
            "__init__.py": "",
            "a.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from .b import B
            """,
            "b.py": """
                class B: ...
                def f():
                    from . import c
            """,
            "c.py": "from .a import *\n",
            "d.py": "from . import a\n",
        },
    )
    (group,) = _check(graph)
    assert group["modules"] == ["cyc_lazy.a", "cyc_lazy.b", "cyc_lazy.c"]  # d imports the cycle, is not in it
    assert _chains(group) == [["cyc_lazy.a", "cyc_lazy.b", "cyc_lazy.c"]]
    lines = {(link["importer"], link["imported"]): link["line_numbers"] for link in group["cycles"][0]}
    assert lines == {
        ("cyc_lazy.a", "cyc_lazy.b"): [4],
        ("cyc_lazy.b", "cyc_lazy.c"): [4],
        ("cyc_lazy.c", "cyc_lazy.a"): [1],
    }


def test_a_package_and_its_own_module_make_a_cycle(tmp_path: Path) -> None:
    """The cycle import-linter's acyclic_siblings cannot see: a package's __init__ and its child."""
    graph = _package(
        tmp_path,
        "cyc_parent",
        {
            "__init__.py": "",
            "sub/__init__.py": "from .a import A\nX = 1\n",
            "sub/a.py": "class A: ...\ndef f():\n    from . import X\n",
        },
    )
    (group,) = _check(graph)
    assert _chains(group) == [["cyc_parent.sub", "cyc_parent.sub.a"]]


def test_every_import_in_a_group_is_shown_in_a_shortest_cycle(tmp_path: Path) -> None:
    graph = _package(
        tmp_path,
        "cyc_many",
        {
            "__init__.py": "",
            "a.py": "from . import b, c\n",
            "b.py": "from . import a\n",
            "c.py": "from . import d\n",
            "d.py": "from . import a\n",
        },
    )
    (group,) = _check(graph)
    assert _chains(group) == [["cyc_many.a", "cyc_many.b"], ["cyc_many.a", "cyc_many.c", "cyc_many.d"]]


def test_no_cycle_keeps_the_contract(tmp_path: Path) -> None:
    graph = _package(
        tmp_path,
        "cyc_none",
        {"__init__.py": "from . import a\n", "a.py": "from . import b\n", "b.py": "import os\n"},
    )
    assert _check(graph) == []


@pytest.mark.parametrize("n", [1, 2, 5000])
def test_strongly_connected_is_iterative(n: int) -> None:
    ring = {f"m{i}": {f"m{(i + 1) % n}"} for i in range(n)}  # a ring deeper than the recursion limit
    chain = {f"m{i}": ({f"m{i + 1}"} if i + 1 < n else set()) for i in range(n)}
    assert [len(g) for g in strongly_connected(ring)] == [n]
    assert sorted(len(g) for g in strongly_connected(chain)) == [1] * n
