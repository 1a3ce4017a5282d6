"""Monitoring on a twin: the audit as metrics, served by Debian's real node_exporter.

The deploy, with monitoring on, installs Debian's prometheus-node-exporter from the twin's apt
sources (the real package: its unit, its default textfile directory, its user), gives it the
twin's own loopback address through gpuhost's drop-in, uploads the metrics runtime built for the
twin's python3 and enables gpuhost-metrics.timer; its one run of gpuhost-metrics.service writes
the metrics, which a scrape of node_exporter shows. A second deploy changes nothing. A planted
drift (a GPU node gone) turns its check to 0 in the next scrape, after the service's next run
(the twin's systemctl runs a oneshot's start as systemd would; timers are not simulated, so the
test starts the service the timer starts). On the PVE 9 twin (Debian 13) the same install
runs with trixie's python3.13 (its own pydantic-core wheel) and node_exporter 1.9.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import time
import urllib.request
from pathlib import Path

from gpuhost.observe.monitoring import MonitoringStateFact
from tests.e2e.conftest import deploy, inventory, with_driver
from tests.e2e.test_boot_slice import KPRO6
from tests.e2e.test_pve9 import PVE9_SPEC, trixie_modules  # noqa: F401  (a fixture)

PORT = 19100  # on the twin's own address (127.0.0.N): unique to the twin
SERVICE = "gpuhost-metrics.service"
CACHE = {"GPUHOST_RUNTIME_CACHE": "/var/cache/gpuhost-test/runtime"}


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}:{PORT}/metrics", timeout=10) as answer:
        return answer.read().decode()


def check_value(text: str, check: str, host: str) -> str | None:
    """The value of gpuhost_check_ok for a host check, or None when it is absent."""
    for line in text.splitlines():
        wanted = (f'check="{check}"', f'host="{host}"', 'guest=""')
        if line.startswith("gpuhost_check_ok{") and all(w in line for w in wanted):
            return line.rsplit(" ", 1)[1]
    return None


def test_node_exporter_serves_the_checks_and_a_drift(fresh, modules, tmp_path: Path) -> None:
    twin = fresh("kpro6")
    with_driver(twin, modules, KPRO6["driver"]["version"])
    spec = copy.deepcopy(KPRO6)
    spec["monitoring"] = {
        "enabled": True,
        "interval_seconds": 60,
        "listen_address": f"{twin.address}:{PORT}",
    }
    inv = inventory(tmp_path / "inv.py", twin, spec)
    started = time.monotonic()
    first = deploy(inv, env=CACHE)
    print(f"\nfirst deploy (with the trial boot): {time.monotonic() - started:.1f} s")
    assert first.rc == 0, first.output
    twin.reconnect()
    rc, out, _ = twin.run("dpkg-query -W -f '${db:Status-Abbrev}' prometheus-node-exporter")
    assert (rc, out) == (0, "ii ")
    timer = "/etc/systemd/system/timers.target.wants/gpuhost-metrics.timer"
    assert twin.run(f"test -L {timer} && systemctl is-active gpuhost-metrics.timer")[0] == 0
    # node_exporter runs as Debian's unit says (User=prometheus), on the drop-in's address
    pid = "$(cat /run/gpuhost-twin/systemd/prometheus-node-exporter.service.pid)"
    rc, out, _ = twin.run(f"stat -c %U /run/gpuhost-twin/proc/{pid}")
    assert (rc, out.strip()) == (0, "prometheus")

    text = scrape(twin.address)
    assert "node_textfile_scrape_error 0" in text  # the file is readable by node_exporter
    assert check_value(text, "devices.nodes", twin.name) == "1", text[-3000:]

    if os.environ.get("GPUHOST_CAPTURE_MONITORING"):  # tests/fixtures/captures/monitoring
        command = shlex.quote(MonitoringStateFact().command())
        Path(os.environ["GPUHOST_CAPTURE_MONITORING"]).write_text(twin.run(f"sh -c {command}")[1])
    started = time.monotonic()
    second = deploy(inv, env=CACHE)
    print(f"converged re-run with monitoring on: {time.monotonic() - started:.1f} s")
    assert second.rc == 0, second.output
    assert not second.changed, second.output

    # the drift: a GPU node the container needs is gone; the next run of the service sees it
    assert twin.run("rm /dev/nvidia0")[0] == 0
    started = time.monotonic()
    rc, _, err = twin.run(f"systemctl start {SERVICE}")
    seconds = time.monotonic() - started
    assert rc == 0, err
    text = scrape(twin.address)
    lines = [line for line in text.splitlines() if 'check="devices.nodes"' in line]
    print(
        f"\nthe service's run on the twin: {seconds:.2f} s; after the drift:\n" + "\n".join(lines)
    )
    assert check_value(text, "devices.nodes", twin.name) == "0", "\n".join(lines)
    # the timer's own checks: in place, and the file the last run wrote is recent
    assert check_value(text, "monitoring.timer", twin.name) == "1"
    assert check_value(text, "monitoring.fresh", twin.name) == "1"
    assert re.search(r"^gpuhost_audit_last_run_timestamp_seconds\{.*\} \S+$", text, re.M)

    # a run killed while it installed a new runtime: uploaded and half unpacked, the link still
    # on the old one (here the runtime in use, renamed); the next run converges
    key = twin.run("readlink /opt/gpuhost/current")[1].strip()
    old = "0123456789abcdef"
    planted = (
        f"cd /opt/gpuhost && mv {key} {old} && ln -sfn {old} current && mkdir .{key}.part && "
        f"touch .{key}.part/KEY .upload-{key}.tar.gz"
    )
    assert twin.run(planted)[0] == 0
    third = deploy(inv, env=CACHE)
    assert third.rc == 0 and third.changed, third.output[-3000:]
    # (ls sorts by name, and the key is a hash: compare as sets)
    assert set(twin.run("ls -A /opt/gpuhost")[1].split()) == {key, "current"}
    assert twin.run("readlink /opt/gpuhost/current")[1].strip() == key


def test_the_same_on_debian_13(fresh, trixie_modules, tmp_path: Path) -> None:  # noqa: F811
    twin = fresh("kpro6-pve9")
    with_driver(twin, trixie_modules, PVE9_SPEC["driver"]["version"])
    spec = copy.deepcopy(PVE9_SPEC)
    spec["monitoring"] = {"enabled": True, "listen_address": f"{twin.address}:{PORT}"}
    inv = inventory(tmp_path / "inv.py", twin, spec)
    first = deploy(inv, env=CACHE)
    assert first.rc == 0, first.output[-5000:]
    twin.reconnect()
    assert twin.run("readlink /opt/gpuhost/current")[0] == 0
    assert "cpython-313" in twin.run("ls /opt/gpuhost/current/site/pydantic_core")[1]
    text = scrape(twin.address)
    assert "node_textfile_scrape_error 0" in text
    assert check_value(text, "devices.nodes", twin.name) == "1", text[-3000:]
    second = deploy(inv, env=CACHE)
    assert second.rc == 0 and not second.changed, second.output[-3000:]
