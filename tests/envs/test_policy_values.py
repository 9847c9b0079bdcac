"""Policies are values past the edge: a policy's text becomes a
:class:`~atoll.envs.vocabulary.PolicySpec` (``parse_policy``) only where the text arrives, and every
library function that takes a policy takes the value (a name is ``str(spec)``). This test reads the
library's source and fails on a use of ``parse_policy`` anywhere else."""

from __future__ import annotations

import ast
from pathlib import Path

from atoll.envs.vocabulary import parse_policy

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("control", "envs", "forecast", "solvers", "training")

# Where text may become a policy (a module, or a module's functions), and why each is an edge.
ALLOWED: dict[str, frozenset[str] | None] = {
    # the `atoll` command: each command module parses its own options (--policy, --policies,
    # --learned, --bootstrap-rule) and calls the library with the values
    "control/cli/": None,
    # the reader of an `atoll tune` policy file: the YAML's `policy` text becomes the file's spec
    "training/tuning.py": frozenset({"read_tuned"}),
    # the reader of a preset bandit file: its arms' and reference's text become options
    "training/preset_bandit.py": frozenset({"load"}),
}


def _uses(tree: ast.AST) -> list[tuple[int, tuple[str, ...]]]:
    """Each use of the name ``parse_policy`` (a call, or the function passed on): its line and
    the functions it is inside, outermost first."""
    found: list[tuple[int, tuple[str, ...]]] = []

    def visit(node: ast.AST, inside: tuple[str, ...]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inside = (*inside, node.name)
        if isinstance(node, ast.Name) and node.id == "parse_policy" or \
                isinstance(node, ast.Attribute) and node.attr == "parse_policy":
            found.append((getattr(node, "lineno", 0), inside))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, ())
    return found


def _allowed(path: str, inside: tuple[str, ...]) -> bool:
    for where, functions in ALLOWED.items():
        if path == where or where.endswith("/") and path.startswith(where):
            return functions is None or any(f in functions for f in inside)
    return False


def test_parse_policy_is_called_only_at_the_edges() -> None:
    outside, at_edges = [], []
    for folder in LIBRARY:
        for file in sorted((ROOT / folder).rglob("*.py")):
            path = file.relative_to(ROOT).as_posix()
            for line, inside in _uses(ast.parse(file.read_text(), filename=path)):
                (at_edges if _allowed(path, inside) else outside).append(f"{path}:{line}")
    assert not outside, ("parse_policy past the edge (take a PolicySpec there; parse in control/cli, "
                         f"a file reader or a benchmark script): {', '.join(outside)}")
    # the scan sees the edges' own calls (a scan that finds nothing proves nothing)
    assert any(p.startswith("control/cli/") for p in at_edges)
    assert any(p.startswith("training/tuning.py:") for p in at_edges)


def test_a_spec_prints_back_to_itself() -> None:
    for text in ("fixed:3@0.95+h0.7", "per-model:1@0.9+h0.85,f0.3,6@0.95", "learned:file:x", "never"):
        spec = parse_policy(text)
        assert parse_policy(str(spec)) == spec and str(spec) == text
