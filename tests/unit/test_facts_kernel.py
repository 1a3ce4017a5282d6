import pytest

from gpuhost.observe.kernel import (
    KernelCmdline,
    SevSnp,
    SevState,
    parse_char_devices,
    parse_cpu_vendor,
    parse_kernel_build,
    parse_loaded_modules,
    parse_module_parameters,
    parse_sev_state,
)
from gpuhost.observe.parse import UnparsedOutput
from tests.unit.conftest import captured


def test_char_device_majors(machine: str) -> None:
    majors = parse_char_devices(captured(machine, "CharDevices"))
    assert majors["nvidia"] == 195 and majors["nvidiactl"] == 195
    assert majors["nvidia-uvm"] == 238 and majors["nvidia-caps"] == 241
    assert "virtblk" not in majors  # a block device, not a character device


def test_char_devices_rejects_garbage() -> None:
    with pytest.raises(UnparsedOutput):
        parse_char_devices(["Character devices:", "abc nvidia"])
    with pytest.raises(UnparsedOutput, match="before any section"):
        parse_char_devices(["195 nvidia"])


def test_cmdline(machine: str) -> None:
    params = KernelCmdline().process(captured(machine, "KernelCmdline"))
    assert "pci=realloc=off" in params and params[0].startswith("mitigations=")


def test_kernel_build_from_real_proc_version(machine: str) -> None:
    build = parse_kernel_build(captured(machine, "KernelBuildInfo"))
    # the lent machines' image kernel: v657 when h200x2 was captured, v973 at h200x1's
    # recapture, v1252 when h100x1 was
    release = {"h200x2": "v657", "h200x1": "v973", "h100x1": "v1252"}[machine]
    assert build.release == f"6.18.44-fc-{release}-gpu"
    assert (build.compiler, build.gcc_version) == ("gcc (GCC) 15.3.0", "15.3.0")


def test_kernel_build_proxmox_and_clang() -> None:
    # Proxmox kernels are built by Debian's GCC; the shape matches docs/reference/formats.md / docs/hazards.md
    pve = parse_kernel_build(
        [
            "Linux version 6.8.12-9-pve (build@proxmox) (gcc (Debian 12.2.0-14) 12.2.0, GNU ld (GNU "
            "Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC PMX 6.8.12-9 (2025-03-16T19:18Z)"
        ]
    )
    assert (pve.release, pve.gcc_version) == ("6.8.12-9-pve", "12.2.0")
    clang = parse_kernel_build(
        ["Linux version 6.6.0 (u@h) (Debian clang version 16.0.6, LLD 16.0.6) #1 SMP"]
    )
    assert clang.gcc_version is None
    with pytest.raises(UnparsedOutput):
        parse_kernel_build(["Linux 6.1"])


def test_module_parameters(machine: str) -> None:
    params = parse_module_parameters(captured(machine, "ModuleParameters"))
    assert params["nvidia_uvm"]["uvm_disable_hmm"] == "N"
    assert params["nvidia_uvm"]["uvm_page_table_location"] == "(null)"
    assert set(params) == {"nvidia_uvm"}  # nvidia exposes its options in /proc/driver/nvidia/params


def test_module_parameters_reject_unknown_modules() -> None:
    with pytest.raises(UnparsedOutput):
        parse_module_parameters(["e1000 debug 0"])


def test_cpu_vendor(machine: str) -> None:
    assert parse_cpu_vendor(captured(machine, "CpuVendor")) == "intel"
    assert parse_cpu_vendor(["vendor_id\t: AuthenticAMD"]) == "amd"
    with pytest.raises(UnparsedOutput):
        parse_cpu_vendor(["vendor_id\t: HygonGenuine"])


# --- SEV-SNP ---------------------------------------------------------------------------------


def test_sev_state_on_the_real_intel_machine() -> None:
    # h200x1 (2026-12-01): Intel, no kvm_amd, no SEV flags -> empty output
    state = SevSnp().process(captured("h200x1", "SevSnp"))
    assert state == SevState() and not state.snp_host and state.snp_usable is None


def test_sev_state_snp_host() -> None:
    # the shapes the command prints on an AMD host (kvm_amd's bool parameters read Y/N)
    lines = [
        "/sys/module/kvm_amd/parameters/sev:Y",
        "/sys/module/kvm_amd/parameters/sev_es:Y",
        "/sys/module/kvm_amd/parameters/sev_snp:Y",
        "cpuflag sme",
        "cpuflag sev",
        "cpuflag sev_es",
        "cpuflag sev_snp",
    ]
    state = parse_sev_state(lines)
    assert state.snp_host and state.snp_usable is True
    # iommu=pt on the same host: the IOMMU driver withdraws SNP, the cpu flag stays
    given_up = parse_sev_state([*lines[:2], "/sys/module/kvm_amd/parameters/sev_snp:N", *lines[3:]])
    assert given_up.snp_host and given_up.snp_usable is False


def test_sev_state_rejects_garbage() -> None:
    with pytest.raises(UnparsedOutput, match="unknown cpu flag"):
        parse_sev_state(["cpuflag avx"])
    with pytest.raises(UnparsedOutput):
        parse_sev_state(["/sys/module/kvm_amd/parameters/sev_snp:maybe"])


def test_loaded_modules_on_the_real_capture() -> None:
    """/proc/modules on a real H200 (refcount and dependencies read '-', an (O) taint flag)."""
    assert parse_loaded_modules(captured("h200x1", "LoadedModules")) == ["nvidia_uvm", "nvidia"]


def test_loaded_modules_refuses_other_output() -> None:
    with pytest.raises(UnparsedOutput):
        parse_loaded_modules(["Module                  Size  Used by"])  # lsmod, not /proc/modules
