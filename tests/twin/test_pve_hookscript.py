"""Hookscript volumes as the twin's Proxmox resolves them (twin/pve/hookscript.py, after
pve-guest-common GuestHelpers.pm check_hookscript): the storage's snippets directory, and
Proxmox's own error texts. Running the script is shown on a real twin
(tests/e2e/test_containers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.twin.pve_helpers import make_root, run, write_conf
from twin.pve import hookscript
from twin.pve.schema import PveError

STORAGE = "dir: local\n\tpath /var/lib/vz\n\tcontent iso,vztmpl,backup\n\nnfs: shared\n\tserver x\n"


def root_with(tmp_path: Path) -> Path:
    (tmp_path / "etc/pve").mkdir(parents=True, exist_ok=True)
    (tmp_path / "etc/pve/storage.cfg").write_text(STORAGE)
    snippets = tmp_path / "var/lib/vz/snippets"
    snippets.mkdir(parents=True, exist_ok=True)
    (snippets / "ok.sh").write_text("#!/bin/sh\n")
    (snippets / "ok.sh").chmod(0o755)
    (snippets / "noexec.sh").write_text("#!/bin/sh\n")
    return tmp_path


def test_a_snippet_resolves_to_its_storage_path(tmp_path: Path) -> None:
    root = root_with(tmp_path)
    assert hookscript.resolve(root, "local:snippets/ok.sh") == "/var/lib/vz/snippets/ok.sh"


@pytest.mark.parametrize(
    ("volid", "error"),
    [
        ("local:iso/ok.sh", "'local:iso/ok.sh' is not in the snippets directory"),
        ("local:snippets/gone.sh", "script 'local:snippets/gone.sh' does not exist"),
        ("local:snippets/noexec.sh", "script 'local:snippets/noexec.sh' is not executable"),
        ("shared:snippets/ok.sh", "script 'shared:snippets/ok.sh' does not exist"),
        ("nope:snippets/ok.sh", "storage 'nope' does not exist"),
    ],
)
def test_proxmox_error_texts(tmp_path: Path, volid: str, error: str) -> None:
    with pytest.raises(PveError) as exc:
        hookscript.resolve(root_with(tmp_path), volid)
    assert exc.value.msg == f"{error}\n"


def test_a_failure_aborts_only_with_stop_on_error(tmp_path: Path) -> None:
    root = root_with(tmp_path)
    values = {"hookscript": "local:snippets/gone.sh"}
    with pytest.raises(PveError) as exc:
        hookscript.run(root, values, 200, "pre-start", stop_on_error=True)
    assert exc.value.msg == (
        "hookscript error for 200 on pre-start: script 'local:snippets/gone.sh' does not exist\n"
    )
    warned: list[str] = []
    hookscript.run(root, values, 200, "post-start", warn=warned.append)
    assert warned == [
        "hookscript error for 200 on post-start: script 'local:snippets/gone.sh' does not exist"
    ]
    hookscript.run(root, {}, 200, "pre-start", stop_on_error=True)  # none: nothing runs


def test_setting_a_hookscript_checks_it_as_proxmox_does(tmp_path: Path) -> None:
    """pct set / qm set refuse a hookscript that is no executable snippet (pve-container
    Config.pm update_pct_config, qemu-server API2/Qemu.pm: check_hookscript)."""
    root = make_root(tmp_path)
    root_with(root)
    write_conf(root, "qemu", 129, "name: vm129\nmemory: 1024\n")
    rc, _, err = run(root, "qm", "set", "129", "--hookscript", "local:snippets/noexec.sh")
    assert rc == 255 and "hookscript: script 'local:snippets/noexec.sh' is not executable" in err
    assert run(root, "qm", "set", "129", "--hookscript", "local:snippets/ok.sh")[0] == 0
