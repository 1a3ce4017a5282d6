"""The layout is the flow, and stays so: the import-linter contracts in pyproject.toml (layers,
the planner without pyinfra, no import cycles in any package) hold, the planner loads no pyinfra
when imported, and no module grows past what one reader takes in at once."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
MAX_LINES = 400
HEAVY = ("pyinfra", "pyinfra_cli", "gevent", "paramiko", "testinfra", "facts", "deploys")


def test_import_contracts_hold() -> None:
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_importing_the_planner_loads_no_pyinfra() -> None:
    """What `python -X importtime -c "import gpuhost.plan.make"` shows, as a check."""
    probe = (
        "import sys, gpuhost.plan.make, gpuhost.plan.render, gpuhost.observe.hostfacts; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_no_module_of_the_product_is_over_400_lines() -> None:
    modules = [
        path
        for package in ("gpuhost", "facts", "deploys")
        for path in sorted((ROOT / package).rglob("*.py"))
    ]
    assert len(modules) > 100
    long = {
        str(p.relative_to(ROOT)): n
        for p in modules
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
