"""pyinfra facts of :mod:`gpuhost.observe.kernel`: Running-kernel facts: /proc/devices majors, /proc/cmdline, /proc/version, module parameters.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import kernel


class CharDevices(Fact, kernel.CharDevices, FactBase[dict[str, int]]):
    """:class:`gpuhost.observe.kernel.CharDevices` as a pyinfra fact."""


class KernelCmdline(Fact, kernel.KernelCmdline, FactBase[list[str]]):
    """:class:`gpuhost.observe.kernel.KernelCmdline` as a pyinfra fact."""


class PanicSettings(Fact, kernel.PanicSettings, FactBase[dict[str, str]]):
    """:class:`gpuhost.observe.kernel.PanicSettings` as a pyinfra fact."""


class KernelBuildInfo(Fact, kernel.KernelBuildInfo, FactBase[kernel.KernelBuild]):
    """:class:`gpuhost.observe.kernel.KernelBuildInfo` as a pyinfra fact."""


class ModuleParameters(Fact, kernel.ModuleParameters, FactBase[dict[str, dict[str, str]]]):
    """:class:`gpuhost.observe.kernel.ModuleParameters` as a pyinfra fact."""


class CpuVendor(Fact, kernel.CpuVendor, FactBase[str]):
    """:class:`gpuhost.observe.kernel.CpuVendor` as a pyinfra fact."""


class LoadedModules(Fact, kernel.LoadedModules, FactBase[list[str]]):
    """:class:`gpuhost.observe.kernel.LoadedModules` as a pyinfra fact."""


class SevSnp(Fact, kernel.SevSnp, FactBase[kernel.SevState]):
    """:class:`gpuhost.observe.kernel.SevSnp` as a pyinfra fact."""


class NvidiaModuleFiles(Fact, kernel.NvidiaModuleFiles, FactBase[dict[str, dict[str, str]]]):
    """:class:`gpuhost.observe.kernel.NvidiaModuleFiles` as a pyinfra fact."""
