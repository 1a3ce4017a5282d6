"""`gpuhost rehearse` refuses bad input before anything connects or any twin starts; what it
writes for the twin names the twin alone. The whole rehearsal on a twin: tests/e2e/test_rehearse.py."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from gpuhost.spec.host import HostSpec
from gpuhost.spec.inventory import load_inventory
from twin import lifecycle, node, rehearse, rehearse_setup
from twin.rehearse_setup import RehearseError

ROOT = Path(__file__).parents[2]
KPRO6 = ROOT / "inventory/kpro6.py"
FACTS = ROOT / "examples/kpro6-facts"


@pytest.fixture
def nothing_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty twin state root; reading a host, starting a twin or checking the machine fails."""

    def forbidden(*_: object, **__: object) -> None:
        raise AssertionError("the rehearsal went on past bad input")

    monkeypatch.setattr(node, "STATE_ROOT", tmp_path)
    monkeypatch.setattr(rehearse_setup, "read_live", forbidden)
    monkeypatch.setattr(lifecycle, "start_fleet", forbidden)
    monkeypatch.setattr(lifecycle, "check_machine", forbidden)
    monkeypatch.delenv(rehearse_setup.INDEX_ENV, raising=False)
    return tmp_path


def refused(inventory: Path | str, host: str | None = None, facts: str | None = None) -> str:
    with pytest.raises(RehearseError) as caught:
        rehearse.Rehearsal(str(inventory), host, facts, None).run()
    return str(caught.value)


def test_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    args = argparse.Namespace(inventory=str(KPRO6), host=None, facts=None, index=None)
    with pytest.raises(RehearseError, match="twins need root"):
        rehearse.run(args)


def test_unknown_host_is_named_with_the_hosts(nothing_starts: Path) -> None:
    assert refused(KPRO6, host="kpro7") == f"{KPRO6}: no host 'kpro7' (hosts: kpro6)"
    assert not (nothing_starts / rehearse_setup.REHEARSALS).exists()


def test_several_hosts_need_host(nothing_starts: Path, tmp_path: Path) -> None:
    two = tmp_path / "two.py"
    two.write_text(
        "from gpuhost.spec.inventory import gpu_host\n"
        "SPEC = {'kernel': {'version': '6.8.12-9-pve'}, 'driver': {'version': '580.95.05'}}\n"
        "hosts = [gpu_host('a', SPEC, ssh_hostname='192.0.2.1'), "
        "gpu_host('b', SPEC, ssh_hostname='192.0.2.2')]\n"
    )
    assert refused(two) == f"{two} has 2 hosts (a, b): choose one with --host"


def test_facts_that_are_not_a_snapshot(nothing_starts: Path, tmp_path: Path) -> None:
    assert "not a directory" in refused(KPRO6, facts=str(tmp_path / "none"))
    (tmp_path / "empty").mkdir()
    said = refused(KPRO6, facts=str(tmp_path / "empty"))
    assert said.startswith(f"--facts {tmp_path / 'empty'} is not a fact snapshot")
    assert "gpuhost capture" in said
    assert not (nothing_starts / rehearse_setup.REHEARSALS).exists()


def test_taken_index_is_refused(nothing_starts: Path) -> None:
    (nothing_starts / "twin199").mkdir()
    assert rehearse_setup.pick_index(None) == 198  # the highest free developer index
    with pytest.raises(RehearseError, match="twin199 exists already"):
        rehearse_setup.pick_index(199)
    with pytest.raises(RehearseError, match="a twin index is 1-254"):
        rehearse_setup.pick_index(255)


def test_twin_inventory_names_the_twin_alone(tmp_path: Path) -> None:
    """The spec keeps what the user wrote; every connection in it is the twin's."""
    spec, _ = load_inventory(KPRO6)["kpro6"]
    data = spec.model_dump(mode="json")
    data["proxmox"] = {"address": "192.0.2.1", "token_env": "REAL_TOKEN"}
    data["guests"][1]["access"] = {"ssh_hostname": "192.0.2.2"}
    twin = node.Twin("twin245", 245, None, "/")
    data["guests"][1]["cuda_repo"] = {"url": "https://192.0.2.3/repo/", "keyring": "/k.asc"}
    made = rehearse_setup.twin_spec(HostSpec.model_validate(data), twin, set())
    assert made["proxmox"] == {"token_file": str(twin.dir / "api-token")}
    assert made["guests"][1]["access"] == {}  # not on the twin: reached by pct exec there
    assert made["guests"][1]["cuda_repo"] is None
    assert made["kernel"] == data["kernel"] and made["driver"] == data["driver"]
    path = rehearse_setup.write_inventory(tmp_path / "inventory.py", "kpro6", made, twin)
    assert "192.0.2" not in path.read_text()
    ((name, (loaded, host_data)),) = load_inventory(path).items()
    assert name == "kpro6" and host_data["ssh_hostname"] == twin.address
    assert loaded.model_dump() == HostSpec.model_validate(made).model_dump()
