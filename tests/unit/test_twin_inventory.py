"""inventory/twin.py gives each twin the spec of its own profile, and `gpuhost twin` one twin only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyinfra.api.exceptions import InventoryError

from gpuhost.spec.inventory import load_inventory
from twin import lifecycle, node

INVENTORY = Path(__file__).parents[2] / "inventory/twin.py"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A twin state folder listing developer twins of three profiles and a test session's."""
    monkeypatch.setattr(node, "STATE_ROOT", tmp_path)
    monkeypatch.delenv("GPUHOST_TWIN_TARGET", raising=False)
    for index, profile in ((1, "kpro6"), (2, "h200x2"), (3, "lumped"), (4, None), (201, "kpro6")):
        (tmp_path / f"twin{index}").mkdir()
        twin = {"name": f"twin{index}", "index": index, "profile": profile, "base": "/none"}
        (tmp_path / f"twin{index}/twin.json").write_text(json.dumps(twin))
    return tmp_path


def test_developer_twins_get_their_own_profiles_spec_and_no_other(state: Path) -> None:
    hosts = load_inventory(INVENTORY)
    assert sorted(hosts) == ["twin1", "twin3"]  # no spec for h200x2 or a bare twin; 201 a test's
    assert [g.ctid for g in hosts["twin3"][0].guests] == [300]  # lumped's, not kpro6's
    assert hosts["twin1"][0].boot.acs_override != hosts["twin3"][0].boot.acs_override


def test_a_twins_containers_are_reached_on_its_guest_addresses_with_its_cuda_mirror(
    state: Path,
) -> None:
    hosts = load_inventory(INVENTORY)
    (ct200,) = [g for g in hosts["twin1"][0].guests if g.kind == "lxc"]
    assert ct200.access.ssh_hostname == "127.1.0.200" and ct200.cuda_repo is None  # no mirror yet
    (state / "twin1/cuda-mirror.asc").write_text("a key")  # what twin/demo_guests.py leaves
    (ct200,) = [g for g in load_inventory(INVENTORY)["twin1"][0].guests if g.kind == "lxc"]
    assert ct200.cuda_repo is not None
    assert str(ct200.cuda_repo.url) == "http://127.0.0.2:8008/"
    assert str(ct200.cuda_repo.keyring) == str(state / "twin1/cuda-mirror.asc")


def test_the_target_alone_is_in_the_inventory(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUHOST_TWIN_TARGET", "twin3")
    hosts = load_inventory(INVENTORY)
    assert list(hosts) == ["twin3"] and hosts["twin3"][1]["ssh_hostname"] == "127.0.0.4"


@pytest.mark.parametrize("name,profile", [("twin2", "h200x2"), ("twin4", "bare")])
def test_a_target_without_a_spec_is_refused_with_the_way_out(
    state: Path, monkeypatch: pytest.MonkeyPatch, name: str, profile: str
) -> None:
    monkeypatch.setenv("GPUHOST_TWIN_TARGET", name)
    with pytest.raises(InventoryError) as err:
        load_inventory(INVENTORY)
    message = str(err.value)
    assert f"{name} runs the {profile} profile" in message
    assert f"python -m twin stop {name}" in message and "add a spec" in message


def test_a_missing_target_is_named(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUHOST_TWIN_TARGET", "twin9")
    with pytest.raises(InventoryError, match="GPUHOST_TWIN_TARGET=twin9: no such twin"):
        load_inventory(INVENTORY)


def test_gpuhost_twin_refuses_a_profile_without_a_spec_before_starting_a_twin(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse

    from pyinfra.api.exceptions import PyinfraError

    from twin import demo

    def no_start(*_: object) -> None:
        raise AssertionError("a twin was started")

    monkeypatch.setattr(node, "list_twins", lambda: [])  # none runs: the command would start one
    monkeypatch.setattr(lifecycle, "start_fleet", no_start)
    monkeypatch.setattr(demo.os, "geteuid", lambda: 0)
    assert demo.spec_profiles() == ["kpro6", "lumped"]
    args = argparse.Namespace(profile="h200x2", dry=True, driver=False)
    with pytest.raises(
        PyinfraError, match=r"--profile h200x2: inventory/twin\.py has specs only for"
    ):
        demo.run(args)
