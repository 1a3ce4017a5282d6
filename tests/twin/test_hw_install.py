"""modprobe.d install commands on the twin's kernel, as kmod runs them (libkmod-module.c
module_do_install_commands / command_do): through /bin/sh, $CMDLINE_OPTS replaced by the
module's options, MODPROBE_MODULE set; --ignore-install skips them; a softdep disables them.
Also at boot: the modules-load path runs them like any modprobe."""

from __future__ import annotations

import sys
from pathlib import Path

from twin import hwtesting as ht
from twin.hwtesting import read, state, write


def _root(tmp_path: Path, conf: str) -> tuple[Path, Path]:
    root = ht.make_root(tmp_path / "root", "kpro6")
    log = tmp_path / "install.log"
    modprobe = f"{sys.executable} {root}/usr/local/bin/modprobe"
    write(root, "etc/modprobe.d/test.conf", conf.format(log=log, modprobe=modprobe))
    return root, log


def test_an_install_command_runs_instead_of_the_insert(tmp_path: Path) -> None:
    root, log = _root(
        tmp_path,
        "options kvm_amd nested=0\n"
        'install kvm_amd echo "$MODPROBE_MODULE $CMDLINE_OPTS" >> {log} && '
        "{modprobe} --ignore-install kvm_amd $CMDLINE_OPTS\n",
    )
    ht.boot_root(root, "kpro6")  # udev coldplug loads kvm_amd: through the command
    assert log.read_text() == "kvm_amd nested=0\n"
    assert state(root)["modules"]["kvm_amd"]["params"]["nested"] == "0"
    assert ht.run(root, "modprobe", "-r", "kvm_amd").returncode == 0
    assert ht.run(root, "modprobe", "kvm_amd", "npt=0").returncode == 0
    assert log.read_text() == "kvm_amd nested=0\nkvm_amd nested=0 npt=0\n"
    assert read(root, "sys/module/kvm_amd/parameters/npt") == "N\n"
    assert ht.run(root, "modprobe", "-r", "kvm_amd").returncode == 0
    assert ht.run(root, "modprobe", "-i", "kvm_amd").returncode == 0  # skips the command
    assert log.read_text().count("\n") == 2


def test_a_failing_install_command_fails_the_load(tmp_path: Path) -> None:
    root, _ = _root(tmp_path, "install vfio_pci echo no >> {log}; exit 3\n")
    ht.boot_root(root, "kpro6")
    run = ht.run(root, "modprobe", "vfio-pci")
    assert run.returncode == 1
    assert "Error running install command 'echo no >> " in run.stderr
    assert "for module vfio_pci: retcode 3" in run.stderr
    assert "vfio_pci" not in state(root)["modules"]


def test_a_softdep_disables_the_install_command(tmp_path: Path) -> None:
    root, log = _root(tmp_path, "install vfio_pci echo ran >> {log}\nsoftdep vfio_pci pre: vfio\n")
    ht.boot_root(root, "kpro6")
    assert ht.run(root, "modprobe", "vfio_pci").returncode == 0
    assert not log.exists()
    assert "vfio_pci" in state(root)["modules"]
