"""GPU boards for the vm tier: emulated PCI functions where a host has its GPUs, with the real
IOMMU groups QEMU's topology gives them and a GPU's identity given in the guest.

QEMU emulates no NVIDIA device. A board here is real PCI hardware to the guest's kernel (config
space, BARs, a function behind a PCIe root port, an IOMMU group made by the real intel-iommu or
amd-iommu code), and only its identity is simulated: :func:`identity_command` bind-mounts
vendor 10de, an H200's device id and class 030200 over the function's sysfs attributes, which is
all gpuhost reads of a GPU's identity (gpuhost/observe/pci.py). The kernel, its drivers and
vfio-pci see the emulated device's own ids; the initramfs claim works by address, not by id.

The topology (``topology()``), as on a real host:

    board A   a GPU (pci-testdev, no host driver) and its USB-C controller (qemu-xhci, which
              xhci_pci binds unless claimed): two functions of one slot behind a root port,
              one IOMMU group, as a Turing board's GPU and USB-C functions
    board B   a GPU alone behind its own root port
    C and D   two GPUs behind one PCIe-to-PCI bridge: one IOMMU group for both and the bridge
              (DMA from behind a conventional bridge carries the bridge's requester id,
              drivers/iommu/iommu.c: pci_device_group), so they cannot go to two owners
    host USB  the host's own xHCI, on the root complex: it stays on xhci_pci

Root ports sit at fixed slots of pcie.0 (``PORTS``), so a function's place is known from its
parent without knowing the bus numbers the firmware chose.
"""

from __future__ import annotations

GPU_VENDOR, GPU_DEVICE, GPU_CLASS = "0x10de", "0x2335", "0x030200"  # an H200 (3D controller)
PORTS = {"A": "0000:00:10.0", "B": "0000:00:11.0", "CD": "0000:00:12.0"}
HOST_XHCI = "0000:00:1a.0"


def topology() -> list[str]:
    """QEMU arguments adding the boards and the host's xHCI (after the IOMMU device)."""
    argv: list[str] = []
    for chassis, (name, bdf) in enumerate(PORTS.items(), start=1):
        slot = bdf.split(":")[2].split(".")[0]
        argv += ["-device", f"pcie-root-port,id=rp{name},bus=pcie.0,addr={slot},chassis={chassis}"]
    argv += ["-device", "pci-testdev,bus=rpA,addr=00.0,multifunction=on"]
    argv += ["-device", "qemu-xhci,bus=rpA,addr=00.1"]
    argv += ["-device", "pci-testdev,bus=rpB,addr=00.0"]
    argv += ["-device", "pcie-pci-bridge,id=bridgeCD,bus=rpCD"]
    argv += ["-device", "pci-testdev,bus=bridgeCD,addr=01.0"]
    argv += ["-device", "pci-testdev,bus=bridgeCD,addr=02.0"]
    argv += ["-device", f"qemu-xhci,bus=pcie.0,addr={HOST_XHCI.split(':')[2]}"]
    return argv


def identity_command() -> str:
    """Shell for the guest: give every board's GPU function (a pci-testdev, 1b36:0005) an
    H200's identity by bind mounts under /run (gone at the next boot, as the guest's own
    state); prints each GPU's BDF and the port it sits under. Idempotent."""
    return (
        "set -e; for d in /sys/bus/pci/devices/*; do "
        '[ "$(cat $d/vendor):$(cat $d/device)" = 0x1b36:0x0005 ] || '
        "{ mountpoint -q $d/vendor || continue; }; "
        "f=${d##*/}; s=/run/gpu-standin/$f; mkdir -p $s; "
        f"echo {GPU_VENDOR} > $s/vendor; echo {GPU_DEVICE} > $s/device; "
        f"echo {GPU_CLASS} > $s/class; "
        "for a in vendor device class; do mountpoint -q $d/$a || "
        "mount --bind $s/$a $d/$a; done; "
        'echo "$f $(basename $(dirname $(readlink -f $d)))"; done'
    )
