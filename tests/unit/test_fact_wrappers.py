"""The pyinfra facts in facts/ are gpuhost's probes, run by pyinfra: one fact per probe, with the
probe's command (pyinfra binds fact arguments by its signature), tool, default and parser, and a
parser's refusal reported the way pyinfra reports a fact it could not process."""

import importlib
import inspect
import pkgutil

import pytest
from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

import facts
import gpuhost.observe
from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe


def _probes() -> list[type[Probe]]:
    found = []
    for info in pkgutil.iter_modules(gpuhost.observe.__path__):
        module = importlib.import_module(f"gpuhost.observe.{info.name}")
        found += [
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, Probe) and cls is not Probe and cls.__module__ == module.__name__
        ]
    return found


PROBES = _probes()


def _fact(probe: type[Probe]) -> type[FactBase]:
    concern = probe.__module__.rsplit(".", 1)[1]
    return getattr(importlib.import_module(f"facts.{concern}"), probe.__name__)


def test_every_probe_has_its_fact_and_facts_has_nothing_else() -> None:
    assert len(PROBES) > 30
    wrapped = {(p.__module__.rsplit(".", 1)[1], p.__name__) for p in PROBES}
    declared = set()
    for info in pkgutil.iter_modules(facts.__path__):
        module = importlib.import_module(f"facts.{info.name}")
        declared |= {
            (info.name, name)
            for name, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, FactBase) and cls.__module__ == module.__name__
        }
    assert declared == wrapped


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: f"{p.__module__}.{p.__name__}")
def test_fact_is_its_probe_under_pyinfra(probe: type[Probe]) -> None:
    fact = _fact(probe)
    assert issubclass(fact, FactBase) and issubclass(fact, probe)
    assert fact.name == f"{fact.__module__}.{probe.__name__}"
    # pyinfra binds get_fact's keyword arguments by the command's own signature
    assert inspect.signature(fact.command) == inspect.signature(probe.command)
    assert fact.command is probe.command and fact.requires_command == probe.requires_command
    assert fact.default() == probe.default()


def test_a_refused_line_is_a_fact_pyinfra_could_not_process() -> None:
    from facts.pci import IommuGroups

    with pytest.raises(FactProcessError, match="IOMMU groups") as caught:
        IommuGroups().process(["not-a-group 0000:41:00.0"])
    assert isinstance(caught.value.__cause__, UnparsedOutput)
    # the probe itself stays plain Python: a ValueError the planner and the audit report
    with pytest.raises(UnparsedOutput):
        gpuhost.observe.pci.IommuGroups().process(["not-a-group 0000:41:00.0"])
