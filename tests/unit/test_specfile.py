"""The host spec as a JSON file (gpuhost/spec/specfile.py): what `gpuhost metrics --local` audits
against; the deploy writes it to the host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuhost.spec.host import HostSpec
from gpuhost.spec.inventory import load_inventory
from gpuhost.spec.specfile import REDACTED, SpecFileError, dump_spec, load_spec, redacted_guests

SPECFILES = Path(__file__).parents[1] / "fixtures/specfiles"
WRONG = "tests/fixtures/inventories/audit/h200_wrong.py"
INVENTORIES = ["inventory/h200.py", "inventory/kpro6.py", "inventory/kpro5.py"]


@pytest.mark.parametrize("inventory", INVENTORIES)
def test_every_spec_comes_back_equal(inventory, tmp_path: Path):
    for name, (spec, _) in load_inventory(inventory).items():
        path = tmp_path / f"{name}.json"
        path.write_text(dump_spec(spec))
        assert load_spec(path) == spec
        assert dump_spec(load_spec(path)) == dump_spec(spec)  # stable text: no rewrite churn


def test_secret_named_env_values_are_redacted_and_named():
    spec = load_inventory("inventory/kpro6.py")["kpro6"][0]
    data = spec.model_dump(mode="json")
    ct = next(g for g in data["guests"] if g["kind"] == "lxc")
    ct["env"] = {"HF_TOKEN": "hf_abcdef0123456789", "NCCL_P2P_LEVEL": "NVL"}
    text = dump_spec(HostSpec.model_validate_json(json.dumps(data)))
    assert "hf_abcdef0123456789" not in text
    back = HostSpec.model_validate_json(text)
    guest = next(g for g in back.lxc_guests if g.name == ct["name"])
    assert guest.env == {"HF_TOKEN": REDACTED, "NCCL_P2P_LEVEL": "NVL"}
    assert redacted_guests(back) == {ct["name"]}
    assert redacted_guests(spec) == set()


def test_a_bad_spec_file_names_the_file_and_the_field(tmp_path: Path):
    path = tmp_path / "spec.json"
    data = json.loads(dump_spec(load_inventory("inventory/h200.py")["h200"][0]))
    data["driver"]["version"] = "latest"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecFileError) as err:
        load_spec(path)
    assert str(path) in str(err.value) and "driver.version" in str(err.value)
    with pytest.raises(FileNotFoundError, match="cannot read the host spec"):
        load_spec(tmp_path / "absent.json")


@pytest.mark.parametrize(
    ("inventory", "host", "name"),
    [("inventory/h200.py", "h200", "h200"), (WRONG, "h200-driver", "h200-driver")],
)
def test_the_spec_files_tools_carry_are_the_inventories(inventory, host, name):
    """tests/fixtures/specfiles (tools/device-metrics.sh audits the GPU machine against them);
    a field added to the spec since reads as its default."""
    assert load_spec(SPECFILES / f"{name}.json") == load_inventory(inventory)[host][0]
