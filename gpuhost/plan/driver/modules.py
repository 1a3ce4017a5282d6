"""The Plan's NVIDIA modules: which driver, for which kernel, from which tree and store, and
which compiler the host may build them with. Pure: from the spec and the host's facts."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.plan.driver.toolchain import CompilerChoice, ToolchainError, choose_module_compiler
from gpuhost.spec.host import HostSpec

MODULES_KIND = "nvidia-modules"
# gpuhost's own directory in /lib/modules/<kernel>/updates: depmod prefers updates/ over the
# kernel's own tree, and a directory of its own keeps DKMS' and the distribution's files apart.
INSTALL_SUBDIR = "updates/gpuhost"


@dataclass(frozen=True)
class DriverModules:
    version: str  # driver version: "595.71.05"
    kernel: str  # the kernel they are for (spec.kernel.version): "6.14.8-2-bpo12-pve"
    tree: str  # driver.source.tree, on the control machine
    store: str  # driver.source.store, on the control machine
    kernel_compiler: str | None  # the kernel's CONFIG_CC_VERSION_TEXT; None: not on the host
    on_host: CompilerChoice | None  # the host's compiler for a build there; None: kernel unknown

    @property
    def install_dir(self) -> str:
        return f"/lib/modules/{self.kernel}/{INSTALL_SUBDIR}"


def _host_choice(cc_text: str, available: dict[str, str]) -> CompilerChoice:
    try:
        return choose_module_compiler(cc_text, available)
    except ToolchainError as exc:  # a kernel built by a compiler gpuhost cannot name
        return CompilerChoice(None, cc_text, refusal=str(exc))


def plan_driver_modules(spec: HostSpec, facts: HostFacts) -> DriverModules | None:
    """None when the spec leaves the modules unmanaged (no driver.source)."""
    source = spec.driver.source
    if source is None:
        return None
    kernel = spec.kernel.version
    cc_text = facts.compilers.kernel_compiler(kernel)
    choice = _host_choice(cc_text, facts.compilers.compilers) if cc_text is not None else None
    return DriverModules(spec.driver.version, kernel, source.tree, source.store, cc_text, choice)


def for_new_kernel(wanted: DriverModules, cc_text: str, available: dict[str, str]) -> DriverModules:
    """The modules for a kernel this run installs (not on the host yet), whose compiler is
    known from its stored build: the same key and host compiler choice as once it is there."""
    return replace(wanted, kernel_compiler=cc_text, on_host=_host_choice(cc_text, available))
