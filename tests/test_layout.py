"""The shape of tools/: commands (``python -m tools.NAME``) share helpers from ``tools.lib`` and
never import each other; tests import helpers, not commands (they run commands as a user does)."""

from __future__ import annotations

import ast
from pathlib import Path

from .conftest import ROOT


def tools_imported(path: Path) -> set[str]:
    """The ``tools.*`` modules a file imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tools"):
            found.add(node.module if node.module != "tools" else f"tools.{node.names[0].name}")
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("tools.")}
    return found


def package_of(path: Path) -> str:
    """``tools.compare`` for a module of the compare command's package, else the module itself."""
    relative = path.relative_to(ROOT).with_suffix("")
    return ".".join(relative.parts[:2])


def test_commands_import_only_helpers():
    commands = [p for p in (ROOT / "tools").rglob("*.py") if "lib" not in p.relative_to(ROOT / "tools").parts]
    wrong = {}
    for path in commands:
        own = package_of(path)
        bad = {m for m in tools_imported(path) if not m.startswith("tools.lib") and not m.startswith(own)}
        if bad:
            wrong[str(path.relative_to(ROOT))] = bad
    assert not wrong, f"commands importing other commands: {wrong}"


def test_helpers_import_no_command_and_tests_import_helpers():
    for folder, what in ((ROOT / "tools" / "lib", "helpers"), (ROOT / "tests", "tests")):
        wrong = {str(p.relative_to(ROOT)): bad for p in folder.rglob("*.py")
                 if (bad := {m for m in tools_imported(p) if not m.startswith("tools.lib")})}
        assert not wrong, f"{what} importing commands: {wrong}"
