"""pyinfra facts of :mod:`gpuhost.observe.files`: The files gpuhost manages, read in one command: contents, symlinks, and gpuhost's own records.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import files


class ConfigFiles(Fact, files.ConfigFiles, FactBase[files.ManagedFiles]):
    """:class:`gpuhost.observe.files.ConfigFiles` as a pyinfra fact."""


class ModuleConfigFiles(Fact, files.ModuleConfigFiles, FactBase[files.ManagedFiles]):
    """:class:`gpuhost.observe.files.ModuleConfigFiles` as a pyinfra fact."""


class BootId(Fact, files.BootId, FactBase[str]):
    """:class:`gpuhost.observe.files.BootId` as a pyinfra fact."""
