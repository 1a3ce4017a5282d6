"""The VMs' PCI functions bound to vfio-pci at boot, per BDF, before any host driver can probe
them: the files of that mechanism, planned from the Plan's ``vm_functions``.

Why a modprobe.d ``install`` hook (docs/hazards.md "GPUs in VMs"): loading nvidia probes every board
it matches at once, and systemd-modules-load and udev's coldplug run with no ordering between
them, so a udev rule that sets driver_override can come too late. kmod runs a module's install
command instead of inserting it (libkmod-module.c: module_do_install_commands, command_do:
system(3) with MODPROBE_MODULE set), and every path that loads nvidia goes through modprobe:
modules-load, udev's kmod builtin, the initramfs, nvidia-modprobe, nvidia-persistenced, and
nvidia_uvm's dependency on nvidia. The command claims the functions, then inserts the driver
with --ignore-install. No ``$CMDLINE_OPTS`` on that insert: kmod substitutes the module's
modprobe.d options into it, and the inner modprobe adds them again. Three kmod rules matter:
only the first install line and the first softdep line of a module count, the config files
read in name order with the kernel's modules.softdep sorted in among them
(libkmod-config.c: conf_files_insert_sorted), and a module with a softdep has its install
command ignored (libkmod-module.c: mod->ignorecmd = pre || post). Modules do declare softdeps
(the open nvidia.ko: MODULE_SOFTDEP("pre: ecdh_generic,ecdsa_generic"), which depmod writes to
modules.softdep). So each hooked module also gets an empty ``softdep <module> pre:`` in
gpuhost-vfio.conf, which sorts before modules.softdep: kmod then finds no softdep, runs the
install command, and the command loads the module's own softdeps itself around the insert
(kmod loads none for the --ignore-install insert). A softdep for the module in a modprobe.d file
that sorts before gpuhost-vfio.conf still wins over it and disables the claim.

The override is what keeps host drivers off: once it is written the PCI core binds no other
driver (drivers/pci/pci-driver.c, pci_match_device). So the command fails closed (the module is
not inserted) only when an override cannot be written; if vfio-pci cannot load, the functions
stay without a driver and the module loads for the host's own devices.

The initramfs: initramfs-tools copies /etc/modprobe.d (not modules-load.d), so the install lines
run there too, and with MODULES=most it copies the USB host and i2c bus drivers (xhci_pci,
i2c_nvidia_gpu: hooked for boards with USB-C) but no vfio module (hook-functions:
auto_add_modules). An initramfs hook adds vfio_pci and its dependencies (manual_add_modules),
so a claim that runs there loads vfio-pci like one in the real root.

Every host driver that could bind one of a VM's functions is hooked: nvidia, nouveau and
nvidiafb for the GPU, snd_hda_intel for its audio function, xhci_pci and i2c_nvidia_gpu for the
USB-C functions of boards that have them. A driver built into the kernel (modules.builtin) or
loaded before the claim runs no hook: the boot unit (``CLAIM_UNIT``), ordered before
pve-guests, moves whatever planned function is not on vfio-pci then.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jinja2

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.paths import LIB_DIR
from gpuhost.plan.guests.split import slot
from gpuhost.plan.model import GpuAssignment
from gpuhost.spec.values import normalize_bdf

MODPROBE_CONF = "/etc/modprobe.d/gpuhost-vfio.conf"
INITRAMFS_HOOK = "/etc/initramfs-tools/hooks/gpuhost-vfio"
# The initramfs carries modprobe.d and what the hook adds: rebuild it when either changes.
INITRAMFS_FILES = (MODPROBE_CONF, INITRAMFS_HOOK)
# The boot unit that moves what a built-in or early driver took (see the module's docstring).
CLAIM_SCRIPT = f"{LIB_DIR}/vfio-claim"
CLAIM_UNIT = "/etc/systemd/system/gpuhost-vfio-claim.service"
CLAIM_WANTS = "/etc/systemd/system/multi-user.target.wants/gpuhost-vfio-claim.service"

# PCI class (prefix) of a VM's function -> the host drivers that would bind it.
CLAIMERS: dict[str, tuple[str, ...]] = {
    "03": ("nvidia", "nouveau", "nvidiafb"),  # display controllers
    "0403": ("snd_hda_intel",),  # the board's HD audio function
    "0c03": ("xhci_pci",),  # USB-C controller (Turing boards)
    "0c80": ("i2c_nvidia_gpu",),  # USB-C UCSI (serial bus)
}
_ROOT = Path(__file__).parents[3]


@dataclass(frozen=True)
class VfioBinding:
    """What binds at boot to vfio-pci: the functions (validated BDFs) and the hooked drivers."""

    bdfs: tuple[str, ...]
    modules: tuple[str, ...]


def plan_vfio(
    vm_functions: dict[int, tuple[str, ...]], classes: dict[str, str]
) -> VfioBinding | None:
    """The binding for every function given to a VM; None when no VM has one.

    + vm_functions: the Plan's vmid -> BDFs (each GPU's board and its IOMMU group as read now)
    + classes: BDF -> PCI class (hex, '030000') from the PCI facts
    """
    every = {normalize_bdf(b) for functions in vm_functions.values() for b in functions}
    # Only the GPUs' boards (their slots). An accepted plan allows no other device in a VM GPU's
    # IOMMU group, but while a planned pcie_acs_override is not active yet the groups read now
    # are the lumped ones, which can hold the host's NIC: claiming those would take it away.
    boards = {slot(b) for b in every if classes.get(b, "").startswith("03")}
    bdfs = sorted(b for b in every if slot(b) in boards)
    if not bdfs:
        return None
    modules: list[str] = []
    for bdf in bdfs:
        cls = classes.get(bdf, "")
        for prefix, drivers in CLAIMERS.items():
            if cls.startswith(prefix):
                modules += [m for m in drivers if m not in modules]
    # the GPU drivers always: whatever else a function is, nvidia must never probe first
    modules = [*CLAIMERS["03"], *(m for m in modules if m not in CLAIMERS["03"])]
    return VfioBinding(tuple(bdfs), tuple(modules))


def claim_command(binding: VfioBinding) -> str:
    """The claim as one shell command (an install line's first half): overrides (it fails
    only when one cannot be written), then vfio-pci bound to every planned function that is on
    the bus, where vfio-pci loads. Its values are BDFs that passed normalize_bdf, so nothing in
    it needs quoting."""
    functions = " ".join(binding.bdfs)
    return (
        f"{{ for f in {functions}; do d=/sys/bus/pci/devices/$f; "
        '[ ! -e "$d" ] || echo vfio-pci > "$d/driver_override" || exit 1; done; '
        "if /sbin/modprobe vfio-pci; then "
        f"for f in {functions}; do d=/sys/bus/pci/devices/$f; "
        '[ ! -e "$d" ] || [ -e "$d/driver" ] || echo "$f" > /sys/bus/pci/drivers_probe; done; '
        "fi; }"
    )


def insert_command(module: str) -> str:
    """The install line's second half: the module's own softdeps (its line of the running
    kernel's modules.softdep, split on white space as kmod splits it; a name that does not
    load is skipped, as kmod skips it), pre first, then the insert, then post. Its exit status
    is the insert's. ``module`` is one of CLAIMERS' names."""
    return (
        f"{{ set -f; s=$(sed -n 's/^softdep {module} //p' \"/lib/modules/$(uname -r)/modules.softdep\" "
        "2>/dev/null | head -n 1); "
        "dep() { w=; for x in $s; do case $x in pre:|post:) w=$x;; "
        '*) [ "$w" != "$1" ] || /sbin/modprobe -q "$x" || :;; esac; done; }; '
        f"dep pre:; /sbin/modprobe --ignore-install {module} && dep post:; }}"
    )


def modprobe_conf(binding: VfioBinding) -> str:
    return _render(
        "gpuhost-vfio.conf.j2",
        bdfs=binding.bdfs,
        modules=binding.modules,
        claim=claim_command(binding),
        insert=insert_command,
    )


def _render(template: str, **values: object) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_ROOT / "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # shell and modprobe.d text; its values are BDFs and module names
    )
    return env.get_template(template).render(**values)


def vfio_files(
    binding: VfioBinding | None,
) -> list[tuple[str, str | None, str, str | None]]:
    """(path, content or None for absent, mode, symlink target) of every file of the
    mechanism: all absent when no VM has a function."""
    on = binding is not None
    script = _render("gpuhost-vfio-claim.j2", bdfs=binding.bdfs) if binding else None
    return [
        (MODPROBE_CONF, modprobe_conf(binding) if binding else None, "644", None),
        (INITRAMFS_HOOK, _static("gpuhost-vfio-initramfs-hook") if on else None, "755", None),
        (CLAIM_SCRIPT, script, "755", None),
        (CLAIM_UNIT, _static("gpuhost-vfio-claim.service") if on else None, "644", None),
        (CLAIM_WANTS, None, "644", CLAIM_UNIT if on else None),
    ]


def _static(name: str) -> str:
    return (_ROOT / "files" / name).read_text()


def board_functions(gpus: list[GpuAssignment], facts: HostFacts, bdf: str) -> tuple[str, ...]:
    """The functions that move with GPU ``bdf``: the GPU and its board's other functions (the
    GPU first)."""
    gpu = normalize_bdf(bdf)
    a = next((g for g in gpus if g.bdf == gpu), None)
    if a is None:
        raise ValueError(f"{gpu} is not a GPU of this host ({', '.join(g.bdf for g in gpus)})")
    # the board only: another device in its group (a lumped group's NIC) never moves with it
    group = facts.iommu_groups.get(a.iommu_group, []) if a.iommu_group is not None else []
    members = sorted(b for b in group if slot(b) == slot(a.bdf) and b in facts.pci)
    return tuple(dict.fromkeys([a.bdf, *a.functions, *members]))


def misbound(gpus: list[GpuAssignment], facts: HostFacts) -> list[tuple[str, str]]:
    """(GPU, driver) for each board that sits on the wrong side of vfio-pci now and can move
    live: the IOMMU is on (vfio-pci needs a group) and the GPU is bound to a driver, or was
    left unbound with an override by a move that was killed halfway."""
    moves = []
    for a in gpus:
        if a.iommu_group is None or a.bdf not in facts.pci:
            continue
        gpu = facts.pci[a.bdf]
        if a.driver_now is None and gpu.driver_override is None:
            continue  # no driver to move it from: the boot claims or binds it
        functions = board_functions(gpus, facts, a.bdf)
        now = {facts.pci[f].driver for f in functions if f in facts.pci}
        if a.driver_planned == "vfio-pci" and now != {"vfio-pci"}:
            moves.append((a.bdf, "vfio-pci"))
        elif a.driver_planned == "nvidia" and a.driver_now != "nvidia" and facts.driver:
            moves.append((a.bdf, "nvidia"))
    return moves
