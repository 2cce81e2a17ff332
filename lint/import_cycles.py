"""The ``no_cycles`` import-linter contract: no import cycles among a package's modules, at any depth.

Registered in pyproject.toml (``contract_types``) and run by ``lint-imports`` (``make lint``), which puts the
repository's root on ``sys.path``. It checks the graph import-linter builds with grimp: every import
statement counts, at module level, inside a function (a lazy import) or under ``if TYPE_CHECKING:`` (as long
as the session keeps ``exclude_type_checking_imports = false``).

Why not import-linter's ``acyclic_siblings``: it looks for cycles between the children of each package, so
it cannot see a cycle between a package's ``__init__`` and one of its own modules, or one through the root
package (``tether.x`` doing ``from tether import State``); and it names the imports to remove, not the
cycles. This contract finds the strongly connected modules (Tarjan) and, for every import inside such a
group, prints the shortest cycle that import closes, as a chain of modules with line numbers: every import
that takes part in a cycle is shown, each in one chain.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Set

import grimp
from importlinter import Contract, ContractCheck, output

__all__ = ["NoImportCycles"]

Cycle = tuple[str, ...]
"""Modules ``m0, m1, ..., mk``: each imports the next, and ``mk`` imports ``m0``."""


class NoImportCycles(Contract):
    """No module of the root packages reaches itself through imports (no options)."""

    type_name = "no_cycles"

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        internal = {m for m in graph.modules if not graph.is_module_squashed(m)}  # external ones are squashed
        imports = {m: graph.find_modules_directly_imported_by(m) & internal for m in internal}
        groups = [g for g in strongly_connected(imports) if len(g) > 1]
        output.verbose_print(verbose, f"{len(groups)} groups of modules import each other.")
        found = []
        for group in sorted(groups, key=sorted):
            cycles = sorted(shortest_cycles(imports, group), key=lambda c: (len(c), c))
            found.append(
                {
                    "modules": sorted(group),
                    "cycles": [
                        [_link(graph, c[i], c[(i + 1) % len(c)]) for i in range(len(c))] for c in cycles
                    ],
                }
            )
        return ContractCheck(kept=not found, metadata={"groups": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for group in check.metadata["groups"]:
            modules, cycles = group["modules"], group["cycles"]
            output.print_error(f"{len(modules)} modules import each other: {', '.join(modules)}.", bold=False)
            output.print_error(
                f"Each import in a cycle, in the shortest cycle it closes ({len(cycles)}; l.N is the line of "
                "the module before the arrow that imports the next):",
                bold=False,
            )
            output.new_line()
            for links in cycles:
                chain = links[0]["importer"] + "".join(
                    f" -> {link['imported']} (l.{', '.join(map(str, link['line_numbers']))})"
                    for link in links
                )
                output.print_error(f"- {chain}", bold=False)
            output.new_line()
        output.print_error(
            "Fix: remove one import of each cycle: move what both modules need into a lower module, or pass it "
            "in. A function-level or TYPE_CHECKING import is an import too.",
            bold=False,
        )


def strongly_connected(imports: Mapping[str, Set[str]]) -> list[set[str]]:
    """The strongly connected groups of the import graph ``imports`` (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(imports[root])))]
        while work:
            module, todo = work[-1]
            for imported in todo:
                if imported not in index:
                    index[imported] = low[imported] = len(index)
                    stack.append(imported)
                    on_stack.add(imported)
                    work.append((imported, iter(sorted(imports[imported]))))
                    break
                if imported in on_stack:
                    low[module] = min(low[module], index[imported])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == module:
                            break
                    groups.append(group)
    return groups


def shortest_cycles(imports: Mapping[str, Set[str]], group: Set[str]) -> set[Cycle]:
    """For each import ``a -> b`` inside ``group``, the shortest cycle through it (each cycle once)."""
    cycles = set()
    for importer in sorted(group):
        for imported in sorted(imports[importer] & group):
            path = _shortest_path(imports, group, imported, importer)
            cycles.add(_rotated((importer, *path[:-1])))
    return cycles


def _shortest_path(imports: Mapping[str, Set[str]], group: Set[str], start: str, end: str) -> list[str]:
    """The modules from ``start`` to ``end`` (both included) by the fewest imports, within ``group``."""
    before: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        if module == end:
            break
        for imported in sorted(imports[module] & group):
            if imported not in before:
                before[imported] = module
                queue.append(imported)
    path = [end]
    while (previous := before[path[-1]]) is not None:
        path.append(previous)
    return path[::-1]


def _rotated(cycle: Iterable[str]) -> Cycle:
    """The cycle starting at its first module in name order, so that each cycle is kept once."""
    modules = tuple(cycle)
    first = modules.index(min(modules))
    return modules[first:] + modules[:first]


def _link(graph: grimp.ImportGraph, importer: str, imported: str) -> dict[str, object]:
    lines = sorted({d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)})
    return {"importer": importer, "imported": imported, "line_numbers": lines}
