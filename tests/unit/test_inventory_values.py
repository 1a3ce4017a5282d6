"""Inventory values are untrusted text: the corpus of invalid inventories under
tests/fixtures/inventories/bad is refused at load, before anything connects, naming the field
and the fix and never a secret; the valid-but-unusual ones under good/ are accepted."""

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api.exceptions import InventoryError

from gpuhost.spec.host import HostSpec
from gpuhost.spec.inventory import (
    CHECK_GROUP,
    SOURCE_KEY,
    SPEC_KEY,
    SpecError,
    gpu_host,
    load_hosts,
    load_inventory,
)

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "inventories"
CASES = runpy.run_path(str(FIXTURES / "bad" / "specs.py"))["CASES"]
BAD_FILES = sorted(p for p in (FIXTURES / "bad").glob("*.py") if p.name != "specs.py")
GOOD_FILES = sorted((FIXTURES / "good").glob("*.py"))
SECRET = "hunter2"
INVENTORY = """
import runpy
from gpuhost.spec.inventory import gpu_host
CASES = {{c[0]: c[1] for c in runpy.run_path({fixture!r})["CASES"]}}
gpu_hosts = [gpu_host("kpro6", CASES[{case!r}], ssh_hostname="192.0.2.1", ssh_password={secret!r})]
"""


@pytest.fixture(autouse=True)
def no_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing in these tests may connect anywhere."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a connection was attempted")

    import pyinfra.api.connect
    import pyinfra.connectors.ssh

    monkeypatch.setattr(pyinfra.api.connect, "connect_all", refuse)
    monkeypatch.setattr(pyinfra.connectors.ssh.SSHConnector, "connect", refuse)


def test_the_corpus_is_big_enough() -> None:
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_invalid_spec_is_refused_when_the_inventory_loads(tmp_path: Path, case: tuple) -> None:
    name, _, fragments, absent = case
    inventory = tmp_path / "site.py"
    inventory.write_text(
        INVENTORY.format(fixture=str(FIXTURES / "bad" / "specs.py"), case=name, secret=SECRET)
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SpecError) as info:
        load_inventory(inventory)
    message = str(info.value)
    assert message.startswith(f"{os.path.relpath(inventory)}: host 'kpro6': invalid gpuhost spec")
    for fragment in fragments:
        assert fragment in message, message
    for fragment in [*absent, SECRET]:
        assert fragment not in message, message
    assert len(message) < 12_000
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


@pytest.mark.parametrize("path", BAD_FILES, ids=[p.stem for p in BAD_FILES])
def test_invalid_inventory_file_is_refused_at_load(path: Path) -> None:
    expected = re.findall(r'expect: (.*?)(?:"""|$)', path.read_text(), re.MULTILINE)
    assert expected
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    message = str(info.value)
    assert os.path.relpath(path) in message.splitlines()[0]
    for fragment in expected:
        assert fragment in message, message
    assert SECRET not in message


@pytest.mark.parametrize("path", GOOD_FILES, ids=[p.stem for p in GOOD_FILES])
def test_valid_unusual_inventory_is_accepted(path: Path) -> None:
    hosts = load_inventory(path)
    assert hosts
    for spec, data in hosts.values():
        assert data[SOURCE_KEY] == os.path.relpath(path)
        assert data["ssh_strict_host_key_checking"] == "yes"
        # what a spec dumps validates again to the same spec (inventory/twin.py relies on it)
        assert HostSpec.model_validate(spec.model_dump(mode="json")) == spec


def test_unusual_values_are_normalised() -> None:
    spec, _ = load_inventory(FIXTURES / "good" / "unusual_values.py")["kpro6"]
    assert spec.guests[0].gpus == ["0000:41:00.0", "0000:c1:00.0", 3]
    assert spec.vm_guests[0].gpus == [] and spec.vm_guests[0].machine is None
    every, _ = load_inventory(FIXTURES / "good" / "every_field.py")["kpro6"]
    assert every.boot.snp == "give_up" and every.vm_guests[0].gpus[1] == "0000:e1:00.0"


def test_gpu_host_verifies_host_keys_and_records_its_file() -> None:
    base = {"kernel": {"version": "6.8.12-9-pve"}, "driver": {"version": "580.95.05"}}
    _, data = gpu_host("kpro6", base, source="inventory/kpro6.py", ssh_password=SECRET)
    assert data["ssh_strict_host_key_checking"] == "yes"
    assert data[SOURCE_KEY] == "inventory/kpro6.py" and isinstance(data[SPEC_KEY], HostSpec)
    _, twin = gpu_host("kpro6", base, ssh_strict_host_key_checking="accept-new")
    assert twin["ssh_strict_host_key_checking"] == "accept-new"  # what the inventory says wins
    assert twin[SOURCE_KEY] == os.path.relpath(__file__)
    # from an imported module (not an executed inventory file) there is no per-file registry
    assert CHECK_GROUP not in globals()


def test_gpu_host_never_echoes_host_data() -> None:
    with pytest.raises(SpecError) as info:
        gpu_host("kpro6", {"kernel": {}}, ssh_password=SECRET, gpuhost_reboot_delay=SECRET)
    assert SECRET not in str(info.value)
    assert "kernel.version: required field is missing" in str(info.value)
    assert "host data gpuhost_reboot_delay: must be a whole number >= 0" in str(info.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("kernel.version", "6.8.12-9-pve"),
        ("driver.version", "580.95.05"),
        ("toolchain.gcc", "12.2.0"),
        ("guests.0.name", "ct200"),
        ("guests.0.gpus.0", "0000:41:00.0"),
        ("guests.0.cuda.0", "12.8"),
        ("guests.0.env.A", "1"),
        ("guests.0.access.ssh_hostname", "ct.lan"),
        ("guests.0.venvs.0.path", "/opt/v"),
        ("guests.0.venvs.0.packages.0", "torch==2.9.1"),
        ("boot.extra.0", "quiet"),
        ("boot.acs_override", "downstream"),
        ("modules.vfio_modules.0", "vfio_pci"),
    ],
)
def test_a_trailing_newline_is_refused_everywhere(field: str, value: str) -> None:
    """Full-string matches: `^...$` would let 'value\\n' through."""
    spec = {
        "kernel": {"version": "6.8.12-9-pve"},
        "driver": {"version": "580.95.05"},
        "toolchain": {"gcc": "12.2.0"},
        "guests": [
            {
                "kind": "lxc",
                "ctid": 200,
                "name": "ct200",
                "gpus": ["0000:41:00.0"],
                "cuda": ["12.8"],
                "env": {"A": "1"},
                "access": {"ssh_hostname": "ct.lan"},
                "venvs": [{"path": "/opt/v", "packages": ["torch==2.9.1"]}],
            }
        ],
        "boot": {"extra": ["quiet"], "acs_override": "downstream"},
        "modules": {"vfio_modules": ["vfio_pci"]},
    }
    HostSpec.model_validate(spec)
    *parents, last = field.split(".")
    node: object = spec
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]  # type: ignore[index]
    key = int(last) if isinstance(node, list) else last
    assert node[key] == value  # type: ignore[index]
    node[key] = value + "\n"  # type: ignore[index]
    with pytest.raises(SpecError) as info:
        load = __import__("gpuhost.spec.validate", fromlist=["validate_spec"]).validate_spec
        load("inventory/x.py", "kpro6", spec)
    assert "a newline" in str(info.value) or "'\\n'" in str(info.value)


def _pyinfra(inventory: Path) -> subprocess.CompletedProcess[str]:
    """The real pyinfra CLI, --dry, on an inventory whose hosts do not resolve."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "pyinfra"),
            "--dry",
            str(inventory),
            "exec",
            "--",
            "true",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("spec_error_with_password", "boot.extra[0] = '$(reboot)'"),
        ("host_without_spec", "host 'kpro7' in group 'gpu_hosts' has no gpuhost spec"),
    ],
)
def test_pyinfra_refuses_before_connecting(name: str, expected: str) -> None:
    run = _pyinfra(FIXTURES / "bad" / f"{name}.py")
    output = run.stdout + run.stderr
    assert run.returncode != 0
    assert expected in output and f"tests/fixtures/inventories/bad/{name}.py" in output
    assert "Connecting to hosts" not in output and "Could not connect" not in output
    assert SECRET not in output


def test_pyinfra_debug_inventory_shows_the_spec() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [str(Path(sys.executable).parent / "pyinfra"), "unusual_values.py", "debug-inventory"],
        cwd=FIXTURES / "good",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    output = run.stdout + run.stderr
    assert '"pc-q35-8.1+pve0"' in output and "Connecting" not in output


def test_a_build_host_is_declared_beside_its_gpu_hosts() -> None:
    hosts, builders = load_hosts(FIXTURES / "good" / "build_host.py")
    assert list(hosts) == ["kpro6"] and hosts["kpro6"][0].artifacts.build_host == "builder"
    data = builders["builder"]
    assert SPEC_KEY not in data
    assert data["ssh_hostname"] == "192.0.2.9" and data["ssh_strict_host_key_checking"] == "yes"
    assert data[SOURCE_KEY] == os.path.relpath(FIXTURES / "good" / "build_host.py")
    assert hosts["kpro6"][0].artifacts.mirror == "/var/cache/gpuhost/mirror"
