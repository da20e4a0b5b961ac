"""The README and the manual under docs/: every relative link points at something that exists,
and every results folder says how it was made."""

from __future__ import annotations

import re
from pathlib import Path

from .conftest import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs").rglob("README.md"))]


def test_every_relative_link_resolves():
    dead = []
    for page in pages():
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                dead.append(f"{page.relative_to(ROOT)}: {target}")
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_every_results_folder_has_a_readme_with_its_command_and_commit():
    for folder in sorted(p for p in (ROOT / "docs" / "results").iterdir() if p.is_dir()):
        readme = folder / "README.md"
        assert readme.is_file(), f"{folder.name} has no README.md"
        text = readme.read_text()
        assert "python" in text or "bash" in text, f"{folder.name}: no command"
        assert re.search(r"\b[0-9a-f]{7}\b", text), f"{folder.name}: no commit"
        assert re.search(r"2026-\d\d-\d\d", text), f"{folder.name}: no date"
    index = (ROOT / "docs" / "results" / "README.md").read_text()
    for folder in (p for p in (ROOT / "docs" / "results").iterdir() if p.is_dir()):
        assert f"({folder.name}/README.md)" in index, f"docs/results/README.md does not list {folder.name}"
