"""Guest software on a kpro6 twin's container 200, deployed with the real pyinfra CLI.

CUDA 12.8 and 13.0 come from a signed stand-in of NVIDIA's repository (twin/cudarepo.py, served
over http; the deploy only knows its URL and key from the spec); the venv is real uv with real
packages from the package index this machine is configured with, `pluggy` standing in for
torch (pinned) and `pytest` for a package that depends on it; the service is a real
`python -m http.server` from the venv, run by the twin guest's service manager.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuhost.spec.inventory import load_inventory
from tests.e2e.conftest import PYINFRA, ROOT, Deploy, with_driver
from twin import cudarepo
from twin.pytest_plugin import TwinHandle

VERSION = "595.71.05"
SPEC = load_inventory(ROOT / "inventory/kpro6.py")["kpro6"][0].model_dump(mode="json")
CT200 = "arch: amd64\nhostname: ct200\nostype: debian\n"
PIN = "pluggy==1.5.0"  # the torch of this test: pinned, and pytest depends on it
VENV = "/opt/venvs/serve"


@dataclass
class Site:
    twin: TwinHandle
    inv: Path
    spec: dict
    repo: cudarepo.Repo
    url: str

    def guest(self, command: str) -> tuple[int, str, str]:
        return self.twin.run(f"pct exec 200 -- sh -c {quote(command)}")

    def write(self, spec: dict) -> None:
        write_inventory(self.inv, self.twin, spec)


def quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def write_inventory(path: Path, twin: TwinHandle, spec: dict) -> None:
    path.write_text(
        "from gpuhost.spec.inventory import gpu_host\n"
        "from gpuhost.pve.guests import guests_of\n"
        f"hosts = [gpu_host({twin.name!r}, {spec!r}, ssh_hostname={twin.address!r}, "
        f"ssh_user='root', ssh_key={str(twin.key)!r}, ssh_known_hosts_file={str(twin.known_hosts)!r}, "
        "ssh_strict_host_key_checking='yes')]\n"
        "guests = [g for g in guests_of(hosts[0]) if g[0] == 'ct200']\n"
    )


def guest_spec(site_spec: dict, twin: TwinHandle, repo: cudarepo.Repo, url: str, **ct) -> dict:
    spec = copy.deepcopy(site_spec)
    spec["guests"] = [g for g in spec["guests"] if g["kind"] == "lxc"]  # the node has CT 200 only
    for guest in spec["guests"]:
        if guest["kind"] == "lxc":
            guest.update(
                {
                    "access": {"ssh_hostname": twin.twin.guest_address(200)},
                    "privileged": True,
                    "cuda": ["12.8", "13.0"],
                    "cuda_default": "12.8",
                    "cuda_repo": {"url": url, "keyring": str(repo.key)},
                    "venvs": [
                        {
                            "path": VENV,
                            "python": "3.11",  # the guest's system python (Debian 12)
                            "cuda": "12.8",
                            "packages": ["pytest==8.3.3"],
                            "constraints": [PIN],
                            "env": {"NCCL_ALGO": "Ring"},
                            "service": {
                                "name": "web",
                                "command": [
                                    "python",
                                    "-m",
                                    "http.server",
                                    "8088",
                                    f"--bind={twin.twin.guest_address(200)}",
                                ],
                            },
                        }
                    ],
                    **ct,
                }
            )
    return spec


def changed(deploy: Deploy) -> int:
    """Operations with changes in pyinfra's results: the Success column of the Grand total."""
    (total,) = [line.split() for line in deploy.output.splitlines() if "Grand total" in line]
    _hosts, success, _error, _no_change = total[-4:]
    return 0 if success == "-" else int(success)


def run(site: Site, *args: str) -> Deploy:
    proc = subprocess.run(
        [
            str(PYINFRA),
            *(args or ["-y"]),
            str(site.inv),
            "deploys/gpu_guest.py",
            "--limit",
            "ct200",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return Deploy(proc.returncode, proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def site(twin_fleet, modules, tmp_path_factory) -> Iterator[Site]:
    (twin,) = twin_fleet.start(1, "kpro6")
    tmp = tmp_path_factory.mktemp("guestsw")
    try:
        with_driver(twin, modules, VERSION)
        rc, _, err = twin.run(
            f"mkdir -p /etc/pve/lxc && printf '{CT200}' > /etc/pve/lxc/200.conf && pct start 200"
        )
        assert rc == 0, err
        repo = cudarepo.build(tmp / "cuda", ["12.8", "12.9", "13.0"])
        with cudarepo.serve(repo.root) as url:
            spec = guest_spec(SPEC, twin, repo, url)
            site = Site(twin, tmp / "kpro6.py", spec, repo, url)
            site.write(spec)
            yield site
    finally:
        twin_fleet.stop(twin)


def test_toolkits_venv_env_and_service_converge_and_rerun_changes_nothing(site: Site) -> None:
    first = run(site)
    assert first.rc == 0, first.output[-4000:]
    # two toolkits side by side, the spec's default behind /usr/local/cuda
    for version, release in (("12.8", "12.8.1"), ("13.0", "13.0.2")):
        rc, out, _ = site.guest(f"/usr/local/cuda-{version}/bin/nvcc --version")
        assert rc == 0 and f"release {version}, V{release}" in out, out
    rc, out, _ = site.guest(
        "readlink -f /usr/local/cuda; dpkg-query -W cuda-toolkit-12-8 cuda-toolkit-13-0"
    )
    assert out.splitlines()[0] == "/usr/local/cuda-12.8", out
    assert "cuda-toolkit-12-8\t12.8.1-1" in out and "cuda-toolkit-13-0\t13.0.2-1" in out, out
    # the venv: real uv, the pin held, the import check passed, CUDA_HOME and NCCL in activation
    rc, out, _ = site.guest(
        f". {VENV}/bin/activate && python -c 'import pluggy, pytest; print(pluggy.__version__)' "
        "&& echo CUDA_HOME=$CUDA_HOME MAX_JOBS=$MAX_JOBS NCCL_IB_DISABLE=$NCCL_IB_DISABLE "
        "NCCL_ALGO=$NCCL_ALGO UV_CONSTRAINT=$UV_CONSTRAINT && which nvcc"
    )
    assert rc == 0, out
    assert out.splitlines()[0] == "1.5.0", out
    assert "CUDA_HOME=/usr/local/cuda-12.8" in out and "NCCL_IB_DISABLE=1" in out, out
    assert "NCCL_ALGO=Ring" in out and "/usr/local/cuda-12.8/bin/nvcc" in out, out
    # a hand-run install in the activated venv honours the pins too (UV_CONSTRAINT)
    rc, out, err = site.guest(
        f". {VENV}/bin/activate && SSL_CERT_FILE=/etc/gpuhost/index-ca.pem "
        "uv pip install pluggy==1.6.0"
    )
    assert rc != 0 and "pluggy==1.6.0" in err and "pluggy==1.5.0" in err, out + err
    # a login shell has the guest's environment from the Plan
    rc, out, _ = site.guest("env -i HOME=/root PATH=/usr/bin:/bin sh -lc env")
    assert "NCCL_IB_DISABLE=1" in out and "MAX_JOBS=" in out, out
    # the service runs from the venv with its environment
    rc, pid, _ = site.guest(
        "systemctl show -p MainPID --value gpuhost-web.service || systemctl show -p MainPID gpuhost-web.service"
    )
    pid = pid.strip().removeprefix("MainPID=")
    assert rc == 0 and pid.isdigit() and pid != "0", pid
    rc, environ, _ = site.guest(f"tr '\\0' '\\n' < /proc/{pid}/environ")
    assert "CUDA_HOME=/usr/local/cuda-12.8" in environ and "NCCL_IB_DISABLE=1" in environ
    address = site.twin.twin.guest_address(200)
    rc, out, _ = site.guest(
        f"python3 -c \"import urllib.request as u; print(u.urlopen('http://{address}:8088/').status)\""
    )
    assert out.strip() == "200", out

    second = run(site)
    assert second.rc == 0, second.output[-3000:]
    assert changed(second) == 0, second.output[-3000:]
    rc, again, _ = site.guest("systemctl show -p MainPID gpuhost-web.service")
    assert again.strip().removeprefix("MainPID=") == pid  # not restarted


def service_pid(site: Site) -> str:
    rc, out, _ = site.guest("systemctl show -p MainPID gpuhost-web.service")
    assert rc == 0, out
    return out.strip().removeprefix("MainPID=")


def test_a_changed_environment_restarts_the_service_once(site: Site) -> None:
    assert run(site).rc == 0
    before = service_pid(site)
    spec = copy.deepcopy(site.spec)
    (ct,) = [g for g in spec["guests"] if g["kind"] == "lxc"]
    ct["venvs"][0]["env"] = {"NCCL_ALGO": "Tree"}
    site.write(spec)
    try:
        result = run(site)
        assert result.rc == 0, result.output[-3000:]
        assert "restart (its unit, environment or venv changed since it started)" in result.output
        after = service_pid(site)
        assert after != before
        _rc, environ, _ = site.guest(f"tr '\\0' '\\n' < /proc/{after}/environ")
        assert "NCCL_ALGO=Tree" in environ, environ
        again = run(site)
        assert again.rc == 0 and changed(again) == 0, again.output[-3000:]
        assert service_pid(site) == after
    finally:
        site.write(site.spec)
        assert run(site).rc == 0


def test_a_package_that_would_move_the_pin_is_refused_and_the_venv_kept(site: Site) -> None:
    assert run(site).rc == 0
    spec = copy.deepcopy(site.spec)
    (ct,) = [g for g in spec["guests"] if g["kind"] == "lxc"]
    ct["venvs"][0]["constraints"] = ["pluggy==1.4.0"]  # pytest 8.3.3 needs pluggy>=1.5
    site.write(spec)
    try:
        result = run(site)
        assert result.rc != 0, result.output[-3000:]
        out = result.output
        assert "refused: a package would move a pin" in out, out[-3000:]
        assert "pluggy" in out and "1.4.0" in out and "pytest" in out, out[-3000:]
        _rc, version, _ = site.guest(
            f"{VENV}/bin/python -c 'import pluggy; print(pluggy.__version__)'"
        )
        assert version.strip() == "1.5.0"  # nothing moved
    finally:
        site.write(site.spec)
        assert run(site).rc == 0


def test_a_requirement_against_a_pin_is_refused_before_anything_changes(site: Site) -> None:
    spec = copy.deepcopy(site.spec)
    (ct,) = [g for g in spec["guests"] if g["kind"] == "lxc"]
    ct["venvs"][0]["packages"] = ["pytest==8.3.3", "pluggy<1.5"]
    site.write(spec)
    try:
        result = run(site)
        assert result.rc != 0
        assert "would move pinned pluggy from 1.5.0" in result.output, result.output[-2000:]
        assert "Beginning operation run" not in result.output
    finally:
        site.write(site.spec)


def test_a_toolkit_the_host_driver_cannot_run_is_refused(twin_fleet, modules, tmp_path) -> None:
    (twin,) = twin_fleet.start(1, "kpro6")
    try:
        with_driver(twin, modules, "575.64.05")  # CUDA 13.0 needs the 580 branch
        rc, _, err = twin.run(
            f"mkdir -p /etc/pve/lxc && printf '{CT200}' > /etc/pve/lxc/200.conf && pct start 200"
        )
        assert rc == 0, err
        repo = cudarepo.build(tmp_path / "cuda", ["12.8", "13.0"])
        spec = guest_spec(SPEC, twin, repo, "http://127.0.0.1:9/")
        spec["driver"]["version"] = "575.64.05"
        (ct,) = [g for g in spec["guests"] if g["kind"] == "lxc"]
        ct["cuda"], ct["cuda_default"], ct["venvs"] = ["12.8"], None, []
        site = Site(twin, tmp_path / "kpro6.py", spec, repo, "")
        site.write(spec)  # the spec itself allows 12.8 with 575
        ct["cuda"] = ["12.8", "13.0"]
        spec["driver"]["version"] = "595.71.05"  # the spec says 595, the host runs 575
        site.write(spec)
        result = run(site)
        assert result.rc != 0
        assert (
            "CUDA 13.0 needs an NVIDIA driver of branch 580 or newer, but the host driver is "
            "575.64.05" in result.output
        ), result.output[-2000:]
        rc, out, _ = site.guest("ls /etc/apt/sources.list.d/; dpkg-query -W 'cuda-*' 2>&1")
        assert "gpuhost-cuda" not in out and "cuda-toolkit" not in out  # nothing was installed
    finally:
        twin_fleet.stop(twin)


SOFTWARE_CHECKS = ("ct.toolkits", "ct.venvs", "ct.environment", "ct.services")


def software_audit(site: Site) -> dict[str, list[str]]:
    """check id -> the 'found' of each finding, for the guest software checks (through pct exec)."""
    from gpuhost.audit.connect import host_runner
    from gpuhost.audit.run import audit_all, read_host

    name, (spec, data) = next(iter(load_inventory(site.inv).items()))
    run = host_runner(name, data, f"ssh://root@{site.twin.address}:22")
    host = read_host(name, spec, run, None, (4096,))
    outcomes = {o.check.id: o for o in audit_all(host) if o.check.id in SOFTWARE_CHECKS}
    assert sorted(outcomes) == sorted(SOFTWARE_CHECKS)
    assert all(o.status != "skipped" for o in outcomes.values()), {
        k: o.skipped for k, o in outcomes.items()
    }
    return {k: [f.found for f in o.findings] for k, o in outcomes.items() if o.findings}


def test_the_audit_passes_and_each_planted_defect_fails_with_its_finding(site: Site) -> None:
    assert run(site).rc == 0
    assert software_audit(site) == {}
    ca = "SSL_CERT_FILE=/etc/gpuhost/index-ca.pem"
    defects = {
        "ct.toolkits": "update-alternatives --set cuda /usr/local/cuda-13.0",
        "ct.venvs": f"{ca} uv pip install -q --python {VENV}/bin/python pluggy==1.6.0",
        "ct.environment": "sed -i s/NCCL_IB_DISABLE=.1./NCCL_IB_DISABLE=0/ /etc/profile.d/gpuhost-env.sh",
        "ct.services": "systemctl stop gpuhost-web.service",
    }
    for command in defects.values():
        rc, out, err = site.guest(command)
        assert rc == 0, out + err
    failed = software_audit(site)
    assert sorted(failed) == sorted(defects), failed
    assert failed["ct.toolkits"] == ["-> /etc/alternatives/cuda -> /usr/local/cuda-13.0"]
    assert failed["ct.venvs"] == ["1.6.0"]
    assert failed["ct.environment"] == ["0", "different content"]
    assert failed["ct.services"] == ["inactive"]
    # the next deploy converges back from every defect, and the audit passes again
    result = run(site)
    assert result.rc == 0, result.output[-3000:]
    assert software_audit(site) == {}


HUNG = "tmp/gpuhost-test-hung"  # in the guest: the wrapper writes its PID there when it hangs


def hang_in_guest(site: Site, tool: str, first_arg: str) -> Path:
    """Make ``tool`` in the guest hang (and say so) when called with ``first_arg``."""
    groot = site.twin.twin.dir / "guests" / "200" / "root"
    path = groot / tool.lstrip("/")
    path.rename(path.with_name(path.name + ".real"))
    path.write_text(
        f'#!/bin/sh\nif [ "$1" = "{first_arg}" ]; then echo $$ > /{HUNG}; exec sleep 600; fi\n'
        f'exec {tool}.real "$@"\n'
    )
    path.chmod(0o755)
    return path


def killed_run(site: Site, tool: str, first_arg: str) -> None:
    """A guest deploy killed (SIGKILL) while ``tool`` runs, its remote command then ended."""
    wrapper = hang_in_guest(site, tool, first_arg)
    hung = site.twin.twin.dir / "guests" / "200" / "root" / HUNG
    proc = subprocess.Popen(
        [str(PYINFRA), "-y", str(site.inv), "deploys/gpu_guest.py", "--limit", "ct200"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not hung.exists() or not hung.read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, "the run never got there"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        wrapper.with_name(wrapper.name + ".real").rename(wrapper)
        if hung.exists():
            site.guest(f"kill $(cat /{HUNG}); rm -f /{HUNG}")  # the SSH session's end, for dpkg
            time.sleep(1)


def test_a_run_killed_inside_dpkg_or_a_restart_converges_on_the_next(site: Site) -> None:
    assert run(site).rc == 0
    spec = copy.deepcopy(site.spec)
    (ct,) = [g for g in spec["guests"] if g["kind"] == "lxc"]
    ct["cuda"] = ["12.8", "12.9", "13.0"]
    ct["venvs"][0]["env"] = {"NCCL_ALGO": "Tree"}  # the service must restart
    site.write(spec)
    try:
        # killed inside cuda-toolkit-12-9's postinst (update-alternatives --install)
        killed_run(site, "/usr/bin/update-alternatives", "--install")
        _, out, _ = site.guest("dpkg-query -W -f '${db:Status-Abbrev}' cuda-toolkit-12-9")
        assert out.strip() != "ii", out  # left half-configured
        # killed while systemctl restarts the service: its new environment is not recorded
        killed_run(site, "/usr/local/bin/systemctl", "restart")
        result = run(site)
        assert result.rc == 0, result.output[-3000:]
        _, out, _ = site.guest("dpkg-query -W -f '${db:Status-Abbrev}' cuda-toolkit-12-9")
        assert out.strip() == "ii", out
        _, environ, _ = site.guest(f"tr '\\0' '\\n' < /proc/{service_pid(site)}/environ")
        assert "NCCL_ALGO=Tree" in environ
        again = run(site)
        assert again.rc == 0 and changed(again) == 0, again.output[-3000:]
    finally:
        site.write(site.spec)
        assert run(site).rc == 0
