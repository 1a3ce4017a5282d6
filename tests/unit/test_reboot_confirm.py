"""The reboot's confirmation checks every planned binding (deploys/reboot.py): a first run
either converges or stops naming each function the new boot left on the wrong driver."""

from __future__ import annotations

from dataclasses import replace

from deploys.reboot import misbound_after_boot
from gpuhost.plan.make import make_plan
from tests.unit.hosts import kpro6
from tests.unit.test_vfioplan import FUNCTIONS, vm_spec


def test_the_confirmation_names_each_function_the_boot_left_elsewhere() -> None:
    facts = kpro6()
    plan = make_plan("kpro6", vm_spec(), facts)
    booted = dict(facts.pci)
    for bdf in FUNCTIONS:  # what a boot that made every planned binding shows
        booted[bdf] = replace(booted[bdf], driver="vfio-pci")
    assert misbound_after_boot(plan, booted) == []
    # a built-in driver kept one function, another was left unbound, a host GPU was claimed
    booted["0000:c1:00.1"] = replace(booted["0000:c1:00.1"], driver="snd_hda_intel")
    booted["0000:e1:00.0"] = replace(booted["0000:e1:00.0"], driver=None)
    booted["0000:41:00.0"] = replace(booted["0000:41:00.0"], driver="vfio-pci")
    assert misbound_after_boot(plan, booted) == [
        "0000:c1:00.1 is on snd_hda_intel, not vfio-pci",
        "0000:e1:00.0 is on no driver, not vfio-pci",
        "host GPU 0000:41:00.0 is on vfio-pci, not nvidia",
    ]
