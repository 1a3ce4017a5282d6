"""The Plan's NVIDIA modules: which driver, for which kernel, from which tree and store, and
which compiler the host may build them with. Pure: from the spec and the host's facts."""

from __future__ import annotations

from dataclasses import dataclass

from gpuhost.artifacts import ArtifactKey
from gpuhost.hostfacts import HostFacts
from gpuhost.spec import HostSpec
from gpuhost.toolchain import CompilerChoice, ToolchainError, choose_module_compiler

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

    @property
    def key(self) -> ArtifactKey | None:
        """The store key. The compiler in it is the kernel's: the modules are good for that
        kernel whichever host built them, as long as the compiler's version was the kernel's."""
        if self.kernel_compiler is None:
            return None
        return ArtifactKey(MODULES_KIND, self.version, self.kernel, self.kernel_compiler)


def plan_driver_modules(spec: HostSpec, facts: HostFacts) -> DriverModules | None:
    """None when the spec leaves the modules unmanaged (no driver.source)."""
    source = spec.driver.source
    if source is None:
        return None
    kernel = spec.kernel.version
    cc_text = facts.compilers.kernel_compiler(kernel)
    choice = None
    if cc_text is not None:
        try:
            choice = choose_module_compiler(cc_text, facts.compilers.compilers)
        except ToolchainError as exc:  # a kernel built by a compiler gpuhost cannot name
            choice = CompilerChoice(None, cc_text, refusal=str(exc))
    return DriverModules(spec.driver.version, kernel, source.tree, source.store, cc_text, choice)
