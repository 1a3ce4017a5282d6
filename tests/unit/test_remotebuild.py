"""What `gpuhost build` uploads to a build host (gpuhost/build/remote.py): the five modules are all
the build needs (standard library only), and its answers are one JSON line. The real build over
SSH is tests/build/test_build_host.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from gpuhost.build import host as buildhost
from gpuhost.build import remote as remotebuild

PACKAGE = Path(remotebuild.__file__).parents[1]  # gpuhost/


def uploaded(tmp_path: Path) -> Path:
    """A directory holding what upload_builder() puts on a build host, and nothing else."""
    (tmp_path / "gpuhost").mkdir()
    for name in remotebuild.MODULES:
        (tmp_path / "gpuhost" / name).parent.mkdir(exist_ok=True)
        shutil.copy(PACKAGE / name, tmp_path / "gpuhost" / name)
    return tmp_path


def run_there(base: Path, request: dict) -> subprocess.CompletedProcess:
    # -I: isolated, as on a build host with no gpuhost installed (no site-packages, no cwd
    # from PYTHONPATH); the uploaded directory is the only place gpuhost can come from.
    code = "import sys; sys.path.insert(0, sys.argv.pop(1)); import runpy; "
    code += "runpy.run_module('gpuhost.build.remote', run_name='__main__')"
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(base), remotebuild.encode(request)],
        capture_output=True,
        text=True,
        cwd=base,
    )


def test_the_uploaded_modules_need_only_the_standard_library(tmp_path):
    base = uploaded(tmp_path)
    tree = tmp_path / "not-a-kernel"
    tree.mkdir()
    request = {
        "repo": str(tree),
        "ref": "master",
        "recipe": {"base_config": "tinyconfig", "release": "6.1.1-1-pve", "localversion": "-1-pve"},
        "store": str(tmp_path / "store"),
        "work": str(tmp_path),
        "jobs": 1,
    }
    done = run_there(base, request)
    assert done.returncode == 1, done.stderr
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer == {
        "ok": False,
        "error": f"{tree}: no top-level Makefile; kernel.build.repo must be a kernel source tree",
    }
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("gpuhost-build-")) == []


def test_requests_travel_as_one_shell_safe_word():
    request = {"repo": "/srv/linux $(reboot)", "recipe": {"fragment": {"CONFIG_X": 'a"b'}}}
    word = remotebuild.encode(request)
    assert set(word) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")
    assert remotebuild.decode(word) == request


def test_the_code_version_changes_with_any_uploaded_module(tmp_path, monkeypatch):
    before = buildhost.code_version()
    copy = uploaded(tmp_path) / "gpuhost"
    grammar = copy / "spec" / "grammar.py"
    grammar.write_text(grammar.read_text() + "\n# changed\n")
    monkeypatch.setattr(buildhost, "PACKAGE_DIR", copy)
    assert buildhost.code_version() != before
