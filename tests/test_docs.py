"""The README and the docs pages: every relative link reaches a file of the repository and
every anchor a heading; the MkDocs site builds with ``--strict`` (CI builds it too)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's and MkDocs' anchors of a page's headings (outside code fences)."""
    found: set[str] = set()
    fence = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"#{1,6} (.*)", line)
        if m:
            title = re.sub(r"[`*_\[\]()<>:,./'\"!?&+=;]", "", m.group(1).strip().lower())
            found.add(re.sub(r"\s", "-", title))
    return found


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        unanchored = anchor and dest.suffix == ".md" and anchor not in anchors(dest)
        if not dest.exists() or unanchored:
            broken.append(target)
    assert broken == []


def test_the_readme_stays_an_introduction() -> None:
    readme = (REPO / "README.md").read_text()
    titles = re.findall(r"^## (.*)$", readme, flags=re.M)
    assert titles[:3] == ["Set-up", "Try it without an API key", "Quick start"]
    assert "Read on" in titles
    assert len(readme.splitlines()) < 300


def test_the_docs_site_builds_strict(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    assert mkdocs, "mkdocs comes with the dev extra"
    done = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_every_design_reference_names_a_heading_of_the_design_page() -> None:
    """The code cites docs/design.md by its headings' anchors, and only so."""
    headings = anchors(REPO / "docs" / "design.md")
    cited: dict[str, list[str]] = {}
    stale = []
    for path in sorted([*REPO.glob("proxy/**/*.py"), *REPO.glob("tests/**/*.py"),
                        *REPO.glob("bench/*.py"), *REPO.glob("docs/*.md")]):  # fmt: skip
        text = path.read_text()
        where = path.relative_to(REPO).as_posix()
        for anchor in re.findall(r"design\.md#([a-z0-9-]+)", text):
            cited.setdefault(anchor, []).append(where)
        if re.search(r"DESIGN (invariant|section)", text):
            stale.append(where)
    assert len(cited) >= 10, cited
    assert {a: w for a, w in cited.items() if a not in headings} == {}
    assert stale == [], "cite the design page by a heading, not a numbered invariant or section"
