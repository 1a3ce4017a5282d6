"""Constructed host facts for planner tests, in the facts' own raw output formats.

The real captures (tests/fixtures/captures) are H200 VMs without an IOMMU; the shapes the
planner must refuse (IOMMU groups, Proxmox guests, Blackwell boards) are built here from the
same line formats, so they go through the same parsers.
"""

from __future__ import annotations

from dataclasses import replace

from gpuhost.observe.hostfacts import HostFacts, parse_raw
from tests.unit.conftest import proxmox, snapshot

KPRO6_SLOTS = ["01", "21", "41", "61", "81", "a1", "c1", "e1"]  # one root port each


def pci_lines(
    bdf: str, path: str, vendor: str, device: str, cls: str, numa: int, driver: str, group: int
) -> list[str]:
    """The lines PciDevices prints for one device (its link, driver/group links, attributes)."""
    sys = f"/sys/bus/pci/devices/{bdf}"
    return [
        f"dev {bdf} ../../../devices/{path}",
        f"link {sys} driver ../../../bus/pci/drivers/{driver}",
        f"link {sys} iommu_group ../../../kernel/iommu_groups/{group}",
        *(
            f"{sys}/{attr}:{value}"
            for attr, value in [
                ("vendor", f"0x{vendor}"),
                ("device", f"0x{device}"),
                ("class", f"0x{cls}"),
                ("subsystem_vendor", f"0x{vendor}"),
                ("subsystem_device", "0x0000"),
                ("numa_node", str(numa)),
                ("driver_override", "(null)"),
            ]
        ),
    ]


def kpro6_raw(lumped: bool = False) -> dict[str, tuple[int, list[str]]]:
    """8 Blackwell boards (GPU + audio function), each behind its own root port and group.

    lumped=True puts boards c1 and e1 and a SATA controller into one IOMMU group, as a board
    without ACS isolation does.
    """
    pci, groups = [], {}
    for i, bus in enumerate(KPRO6_SLOTS):
        numa = 0 if i < 4 else 1
        host = f"pci0000:{bus[0]}0"
        port = f"0000:{bus[0]}0:01.1"
        group = 100 if lumped and bus in ("c1", "e1") else 10 + i
        pci.extend(
            pci_lines(port, f"{host}/{port}", "1022", "14ab", "060400", numa, "pcieport", 50 + i)
        )
        for fn, (device, cls, driver) in enumerate(
            [("2bb1", "030000", "nvidia"), ("22e8", "040300", "snd_hda_intel")]
        ):
            bdf = f"0000:{bus}:00.{fn}"
            pci.extend(
                pci_lines(bdf, f"{host}/{port}/{bdf}", "10de", device, cls, numa, driver, group)
            )
            groups.setdefault(group, []).append(bdf)
        groups.setdefault(50 + i, []).append(port)
    if lumped:
        sata = "0000:c0:08.0"
        pci.extend(pci_lines(sata, f"pci0000:c0/{sata}", "1022", "7901", "010601", 1, "ahci", 100))
        groups[100].append(sata)
    gpu_rows = [
        f"{i}, 00000000:{bus}:00.0, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, GPU-0000{i}, "
        f"580.95.05, 97887, 12.0, Enabled, 98.02.2E.00.01, 0x2BB110DE"
        for i, bus in enumerate(KPRO6_SLOTS)
    ]
    names = [f"GPU{i}" for i in range(8)]
    topo = ["\t" + "\t".join([*names, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for i, name in enumerate(names):
        cells = [" X " if i == j else ("NODE" if (i < 4) == (j < 4) else "SYS") for j in range(8)]
        topo.append(
            "\t".join(
                [name, *cells, "0-63" if i < 4 else "64-127", "0" if i < 4 else "1", "", "N/A"]
            )
        )
    p2p = [
        " \t" + "\t".join(names) + "\t",
        *(f" {n}\t" + "\t".join("X" if n == m else "NS" for m in names) + "\t" for n in names),
        "#gpuhost-exit=0",
    ]
    return {
        "PciDevices": (0, pci),
        "IommuGroups": (0, [f"{g} {' '.join(sorted(m))}" for g, m in groups.items()]),
        "NvidiaGpus": (
            0,
            [
                "index, pci.bus_id, name, uuid, driver_version, memory.total [MiB], compute_cap, persistence_mode, vbios_version, pci.device_id",
                *gpu_rows,
                "#gpuhost-exit=0",
            ],
        ),
        "NvidiaTopology": (0, [*topo, "", "Legend:", "#gpuhost-exit=0"]),
        # each GPU behind its own root port: the driver answers NS (not supported) both ways
        "NvidiaP2P-r": (0, p2p),
        "NvidiaP2P-w": (0, p2p),
        "NvidiaDriver": (
            0,
            [
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U22)",
                "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) ",
            ],
        ),
        "NvidiaGpuInformation": (0, []),
        "CharDevices": (
            0,
            [
                "Character devices:",
                "195 nvidia",
                "195 nvidiactl",
                "509 nvidia-uvm",
                "511 nvidia-caps",
            ],
        ),
        "KernelCmdline": (
            0,
            [
                "initrd=\\EFI\\proxmox\\6.8.12-9-pve\\initrd.img-6.8.12-9-pve root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet pcie_aspm=off"
            ],
        ),
        "KernelBuildInfo": (
            0,
            [
                "Linux version 6.8.12-9-pve (build@proxmox) (gcc (Debian 12.2.0-14) 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC PMX 6.8.12-9 (2025-03-16T19:18Z)"
            ],
        ),
        "ModuleParameters": (0, ["nvidia_uvm uvm_disable_hmm N"]),
        "CpuVendor": (0, ["vendor_id\t: AuthenticAMD"]),
        "BootTool": (0, proxmox("boot-tool-status-uefi.out")),
        "BootKernelList": (0, proxmox("kernel-list-nopin.out")),
        "PveGuestConfigs": (0, proxmox("guest-configs.out")),
    }


def kpro6(lumped: bool = False, **raw_changes: tuple[int, list[str]]) -> HostFacts:
    return parse_raw({**kpro6_raw(lumped), **raw_changes})


def h200x2(**changes: object) -> HostFacts:
    """The real 2x H200 capture, optionally with some facts replaced."""
    return replace(parse_raw(snapshot("h200x2")), **changes)
