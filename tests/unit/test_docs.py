"""The docs tell the truth about the code: generated references are current, relative links
resolve, and no file cites a design note that lives outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuhost.docs import PAGES, REFERENCE, stale_pages

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# The project's design notes, by their old names; a citation is fine only as a docs/ path.
NOTES = "domain|design|formats|pve-api|trial-boot|feasibility"
CITATION = re.compile(rf"[\w./-]*\b(?:{NOTES})\.md")
CODE_DIRS = ("gpuhost", "facts", "deploys", "gpuhost-twin", "tests", "benchmarks", "tools")
CODE_DIRS += ("inventory", "templates", "files", "examples", ".ci")
SKIP_PARTS = {".venv", "__pycache__", ".git", ".pytest_cache", ".ruff_cache"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def _text_files() -> list[Path]:
    found = [ROOT / "README.md"]
    for top in CODE_DIRS:
        for path in (ROOT / top).rglob("*"):
            if SKIP_PARTS.isdisjoint(path.parts) and path.is_file() and "egg-info" not in str(path):
                found.append(path)
    return found + DOCS


@pytest.mark.parametrize("name", sorted(PAGES))
def test_generated_reference_is_current(name: str) -> None:
    assert (REFERENCE / name).is_file(), "run: python -m gpuhost.docs"
    assert name not in stale_pages(), "run: python -m gpuhost.docs"


def test_relative_links_resolve() -> None:
    broken = []
    for page in DOCS:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_no_file_cites_a_note_outside_the_repository() -> None:
    outside = []
    for path in _text_files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary fixtures
        in_docs = path in DOCS
        for number, line in enumerate(text.splitlines(), 1):
            if in_docs:  # a page's links are checked by test_relative_links_resolve
                line = LINK.sub("", line)
            for cited in CITATION.findall(line):
                if "docs/" not in cited:
                    outside.append(f"{path.relative_to(ROOT)}:{number}: {cited}")
    assert not outside, "cite the docs/ page instead:\n" + "\n".join(outside)


def test_readme_is_for_users() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 210, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_gives_the_test_command_ci_runs() -> None:
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line.strip()]
    command = ci[-1].strip()  # .ci/run's last line runs the tests
    quick_start = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ")[0]
    assert f"    {command} " in quick_start, f"README's quick start must show {command!r}"
