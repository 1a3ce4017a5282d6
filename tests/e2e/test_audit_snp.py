"""The P2P data check on an SEV-SNP twin, where P2P DMA through translated IOMMU domains silently
corrupts data (as on the operator's host): the audit records the corrupted copies with the IOMMU
state that produced them, does not rely on P2P there, and requires NCCL_P2P_DISABLE=1 in the
container that owns the GPU pair instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhost.audit.connect import host_runner
from gpuhost.audit.run import audit_all, read_host
from gpuhost.spec.inventory import load_inventory
from tests.e2e.conftest import deploy, inventory, with_driver
from tests.e2e.guests import ct_config, give_readiness, put
from twin import driver as twin_driver
from twin import node, userspace
from twin.pytest_plugin import PVE_DIRS, TwinHandle

VERSION = "580.159.04"
PAIR = ["0000:43:00.0", "0000:44:00.0"]
SPEC = {
    "kernel": {"version": "6.8.12-9-pve"},
    "driver": {"version": VERSION, "open": True},
    "guests": [{"kind": "lxc", "ctid": 300, "name": "ct300", "gpus": PAIR}],
}
NODES = [
    "/dev/nvidia0",
    "/dev/nvidia1",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
]


@pytest.fixture(scope="module")
def snp(twin_fleet, modules, tmp_path_factory):
    (twin,) = twin_fleet.start(1, "sevsnp")
    try:
        with_driver(twin, modules, VERSION)
        userspace.install_root(twin.root, VERSION)
        inv = inventory(tmp_path_factory.mktemp("snp") / "snp.py", twin, SPEC)
        result = deploy(inv)
        assert result.rc == 0, result.output[-3000:]
        twin.run(PVE_DIRS)
        put(twin, "/etc/pve/lxc/300.conf", ct_config("ct300", NODES))
        rc, _, err = twin.run("pct start 300")
        assert rc == 0, err
        twin_driver.install_userspace(node.Twin.load(twin.name), 300, VERSION)
        give_readiness(twin, inv)  # what the deploy gives a guest placed after it
        yield twin, inv
    finally:
        twin_fleet.stop(twin)


def audit(twin: TwinHandle, inv: Path):
    name, (spec, data) = next(iter(load_inventory(inv).items()))
    run = host_runner(name, data, f"ssh://root@{twin.address}:22")
    outcomes = audit_all(read_host(name, spec, run, None, (4096,)))
    return {
        o.check.id + ("/" + o.target.split("/")[1] if "/" in o.target else ""): o for o in outcomes
    }


def test_unsafe_p2p_needs_nccl_p2p_disable_in_the_guest(snp):
    twin, inv = snp
    outcomes = audit(twin, inv)
    failed = {k: [f.found for f in o.findings] for k, o in outcomes.items() if o.status == "failed"}
    assert failed == {"ct.p2p/ct300": ["unset"]}
    # The corruption is recorded, with the IOMMU state that produced it, not relied on.
    details = outcomes["ct.p2p/ct300"].details
    pair = [c for c in details["copies"] if c["from"] != c["to"]]
    assert {(c["from"], c["to"]) for c in pair} == {(PAIR[0], PAIR[1]), (PAIR[1], PAIR[0])}
    assert all(c["expected_p2p"] is None and c["peer_access"] for c in pair)
    assert all(not s["intact"] for c in pair for s in c["sizes"])
    assert details["iommu"]["sev_snp_host"] and "identity" not in details["iommu"]["domain_types"]

    rc, _, err = twin.run(
        "pct exec 300 -- sh -c 'echo export NCCL_P2P_DISABLE=1 > /etc/profile.d/nccl.sh'"
    )
    assert rc == 0, err
    outcomes = audit(twin, inv)
    assert [k for k, o in outcomes.items() if o.status == "failed"] == []
