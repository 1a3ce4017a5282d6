"""NVSwitch boards: a split that matches no Fabric Manager deployment model is refused.

The facts are kpro6's, with its PCI bus replaced by the hgx-h200 twin profile's (8x H200 SXM and
four NVSwitches), printed in PciDevices' own line format so they go through the real parser.
"""

from __future__ import annotations

from gpuhost.plan.make import make_plan
from tests.unit.hosts import kpro6, kpro6_raw, pci_lines
from tests.unit.test_plan import KPRO6, host, lxc, refused, vm
from twin.profile import load_profile

HGX = load_profile("hgx-h200")
SWITCHES = [d.bdf for d in HGX.pci_devices if d.class_code.startswith("0680")]
GPUS = [g.bdf for g in HGX.gpus]


def hgx_facts():
    status, _ = kpro6_raw()["PciDevices"]
    lines: list[str] = []
    for dev in HGX.pci_devices:
        driver = "nvidia" if dev.vendor == "10de" else "pcieport"
        path = f"pci0000:00/{dev.bdf}"
        lines += pci_lines(
            dev.bdf,
            path,
            dev.vendor,
            dev.device,
            dev.class_code,
            max(dev.numa_node, 0),
            driver,
            dev.iommu_group or 0,
        )
    return kpro6(PciDevices=(status, lines))


def test_sxm_gpus_split_between_vms_and_the_host_are_refused() -> None:
    problems = refused(host(KPRO6, vm(129, GPUS[:4]), lxc(200, "rest")), hgx_facts())
    fabric = [p for p in problems if "NVSwitch fabric" in p]
    assert fabric == [
        f"this host's GPUs share an NVSwitch fabric (4 NVSwitches: {', '.join(SWITCHES)}), and "
        f"the split gives {', '.join(GPUS[:4])} to VMs while {', '.join(GPUS[4:])} stay on the "
        "host (host or containers): no Fabric Manager deployment model (bare metal, full "
        "passthrough, shared NVSwitch) supports that; give every GPU to the host and its "
        "containers, or every GPU to VMs"
    ]
    # GPUs left unassigned stay on the host's driver: the same split
    problems = refused(host(KPRO6, vm(129, GPUS[:1])), hgx_facts())
    assert any("NVSwitch fabric" in p for p in problems)


def test_every_gpu_on_one_side_matches_a_model() -> None:
    bare_metal = make_plan("hgx", host(KPRO6, lxc(200, "rest")), hgx_facts())
    assert {g.owner.kind for g in bare_metal.gpus} == {"lxc"}
    passthrough = make_plan("hgx", host(KPRO6, vm(129, GPUS[:4]), vm(130, GPUS[4:])), hgx_facts())
    assert {g.owner.kind for g in passthrough.gpus} == {"vm"}
