"""The kpro6 twin with its guests as the e2e tests set it up: deployed with the real pyinfra CLI,
its GPU split (VM GPUs on vfio-pci by BDF, the container's and the VM's configs, the container's
NVIDIA userspace) put in place the way an operator does today, guests given gpuhost's readiness;
and the audit of it over real SSH (tests/e2e/test_audit_twin.py, test_pve9.py, benchmarks too).
"""

from __future__ import annotations

from pathlib import Path

from gpuhost.audit.connect import host_runner
from gpuhost.audit.run import audit_all, read_host
from gpuhost.spec.inventory import load_inventory
from tests.e2e.conftest import ROOT, Deploy, deploy, inventory, with_driver
from twin import driver as twin_driver
from twin import node, userspace
from twin.hwtesting import ModuleCache
from twin.pytest_plugin import PVE_DIRS, TwinHandle

VERSION = "595.71.05"
MODEL = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
SPEC = load_inventory(ROOT / "inventory/kpro6.py")["kpro6"][0].model_dump(mode="json")
SPEC["hardware"] = {"gpus": 8, "gpu_model": MODEL}
# ct200's guest software (CUDA toolkits) is tests/e2e/test_guest_software.py's: this twin is not
# given it, so its container asks for none here (the software checks then do not apply).
for _guest in SPEC["guests"]:
    if _guest["kind"] == "lxc":
        _guest["cuda"] = []
CT_GPUS = (
    "0000:01:00.0",
    "0000:21:00.0",
    "0000:41:00.0",
    "0000:61:00.0",
    "0000:81:00.0",
    "0000:a1:00.0",
)
VM_FUNCTIONS = ("0000:c1:00.0", "0000:c1:00.1", "0000:e1:00.0", "0000:e1:00.1")
CT_NODES = [f"/dev/nvidia{i}" for i in range(6)] + [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
]


def ct_config(hostname: str, nodes: list[str]) -> str:
    """An unprivileged container granted exactly ``nodes`` with devN entries."""
    devs = "".join(f"dev{i}: {path}\n" for i, path in enumerate(nodes))
    return f"arch: amd64\nhostname: {hostname}\nostype: debian\nunprivileged: 1\n{devs}"


CT200 = ct_config("ct200", CT_NODES)
HOOK = "hookscript: local:snippets/gpuhost-ready\n"  # what give_readiness sets (readiness.md)
VM129 = "machine: q35\nname: vm129\nhostpci0: 0000:c1:00,pcie=1\nhostpci1: 0000:e1:00,pcie=1\n"
# VM GPUs go to vfio-pci by PCI address at device add (the GPU split deploy will own this).
UDEV = "".join(
    f'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="{bdf}", ATTR{{driver_override}}="vfio-pci"\n'
    for bdf in VM_FUNCTIONS
)
SIZES = (4096, 1 << 20)


def put(twin: TwinHandle, path: str, text: str) -> None:
    rc, _, err = twin.run(f"mkdir -p $(dirname {path}) && cat > {path} <<'EOF'\n{text}EOF")
    assert rc == 0, err


def ct(twin: TwinHandle, op: str) -> None:
    rc, _, err = twin.run(f"pct {op} 200")
    assert rc == 0, err


def provision(twin: TwinHandle, modules: ModuleCache, inv: Path) -> Path:
    """A kpro6 twin as deployed, with its GPU split and guests in place (benchmarks use it too)."""
    deploy_host(twin, modules, inv, SPEC)
    place_guests(twin)
    give_readiness(twin, inv)
    return inv


def deploy_host(twin: TwinHandle, modules: ModuleCache, inv: Path, spec: dict) -> Deploy:
    """The driver installed, then the main deploy run once (tests/e2e/test_pve9.py too)."""
    with_driver(twin, modules, VERSION)
    userspace.install_root(twin.root, VERSION)
    inventory(inv, twin, spec)
    result = deploy(inv)
    assert result.rc == 0, result.output[-3000:]
    return result


def place_guests(twin: TwinHandle) -> None:
    """The GPU split as an operator puts it in place today: VM boards on vfio-pci, the
    container's and the VM's configs, the container started with the driver's userspace."""
    twin.run(PVE_DIRS)
    put(twin, "/etc/udev/rules.d/70-gpuhost-vfio.rules", UDEV)
    put(twin, "/etc/pve/lxc/200.conf", CT200)
    put(twin, "/etc/pve/qemu-server/129.conf", VM129)
    twin.reboot()  # binds the VM's boards to vfio-pci
    ct(twin, "start")
    twin_driver.install_userspace(node.Twin.load(twin.name), 200, VERSION)


def give_readiness(twin: TwinHandle, inv: Path) -> None:
    """What the deploy gives guests placed after it ran (a run now would also replace their
    hand-made entries): gpuhost's hookscript and each guest's contract, from the host's Plan
    (gpuhost/plan/guests/readiness.py, docs/guides/readiness.md)."""
    name, (spec, data) = next(iter(load_inventory(inv).items()))
    run = host_runner(name, data, f"ssh://root@{twin.address}:22")
    plan = read_host(name, spec, run, None, SIZES, guests=False)
    assert plan.context is not None, plan.refused
    readiness = plan.context.plan.readiness
    if readiness.snippets_content:
        assert twin.run(f"pvesm set local --content {readiness.snippets_content}")[0] == 0
    for item in plan.context.plan.files.values():
        if item.concern == "readiness" and item.content is not None:
            put(twin, item.path, item.content)
            assert twin.run(f"chmod {item.mode} {item.path}")[0] == 0
    for hook in readiness.hooks.values():
        rc, _, err = twin.run(f"{hook.tool} set {hook.vmid} --hookscript {hook.wanted}")
        assert rc == 0, err


def audit(twin: TwinHandle, inv: Path, field: str = "found") -> dict[str, list[str]]:
    """check id (with /guest) -> each finding's ``field`` (found, fix...), for every failed check."""
    name, (spec, data) = next(iter(load_inventory(inv).items()))
    host = read_host(
        name, spec, host_runner(name, data, f"ssh://root@{twin.address}:22"), None, SIZES
    )
    failed = {}
    for outcome in audit_all(host):
        if outcome.status == "failed":
            key = outcome.check.id + (
                "/" + outcome.target.split("/", 1)[1] if "/" in outcome.target else ""
            )
            failed[key] = [getattr(f, field) for f in outcome.findings]
    return failed
