"""The simulator is not part of the product: gpuhost, facts and deploys never import twin, and
the product's distribution does not ship it (it is gpuhost-twin/, a project of its own)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from gpuhost import cli

ROOT = Path(__file__).parents[2]
PRODUCT = ("gpuhost", "facts", "deploys")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_product_never_imports_the_simulator() -> None:
    files = [f for package in PRODUCT for f in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 10
    offenders = {
        str(f.relative_to(ROOT)): sorted(
            m for m in imported_modules(f) if m.split(".")[0] == "twin"
        )
        for f in files
    }
    assert {f: m for f, m in offenders.items() if m} == {}


def test_the_product_distribution_ships_gpuhost_alone() -> None:
    """facts/ and deploys/ are the checkout's pyinfra deploy directory, not top-level packages of
    the distribution: installed as "facts" and "deploys" they would clash with other projects'."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.split(".")[0] for p in packages} == {"gpuhost"}
    assert not any(p == "twin" or p.startswith("twin.") for p in packages)
    assert not (ROOT / "twin").exists()
    dependencies = " ".join(project["project"]["dependencies"])
    assert "gpuhost-twin" not in dependencies
    assert "gpuhost-twin" in project["project"]["optional-dependencies"]["dev"]


def test_the_twin_is_its_own_distribution_with_its_plugins() -> None:
    project = tomllib.loads((ROOT / "gpuhost-twin/pyproject.toml").read_text())
    assert project["project"]["name"] == "gpuhost-twin"
    entry_points = project["project"]["entry-points"]
    assert entry_points["pytest11"] == {"twin": "twin.pytest_plugin"}
    assert entry_points[cli.COMMANDS_GROUP] == {
        "twin": "twin.demo:add_command",
        "rehearse": "twin.rehearse:add_command",
    }


def test_gpuhost_twin_without_the_simulator_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    assert cli.main(["twin", "--dry"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install -e ./gpuhost-twin" in err
