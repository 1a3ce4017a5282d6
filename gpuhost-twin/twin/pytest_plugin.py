"""pytest fixtures that run twins: real sshd on 127.0.0.N, real host-key checks, real teardown.

Installing gpuhost-twin registers this module as a pytest plugin (entry point `pytest11`), so
every test session has the fixtures; no conftest imports them.

    twin_profile = "kpro6"   # module attributes pick what `twins`/`twin` start (default: bare)
    twin_count = 2

    def test_x(twin):        # a TwinHandle: .address .key .known_hosts .host (testinfra) .run()
        assert twin.host.file("/etc/os-release").contains("bookworm")

`twin_fleet` (session) is a factory for tests that need twins of their own:
`twin_fleet.start(n, profile)` and `twin_fleet.stop(handle)`. Everything is torn down at the end:
no mounts, no processes. Without root or the tools in gpuhost-twin/twin/APT_PACKAGES the tests
skip with the reason; under CI (env CI set) they fail instead, since CI must really run them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from twin import lifecycle, node, processes

TOOLS = lifecycle.TOOLS
SBIN_PATH = lifecycle.SBIN_PATH
# A bare twin (no profile) has no Proxmox install: this lays out /etc/pve as pmxcfs shows it.
PVE_DIRS = (
    "n=$(cat /etc/hostname); mkdir -p /etc/pve/nodes/$n/lxc; ln -sfn nodes/$n/lxc /etc/pve/lxc"
)
# Test twins use 127.0.0.201 up, away from twin1..; a second test session running at the same
# time (another checkout) sets GPUHOST_TWIN_TEST_INDEX to a range of its own, e.g. 230.
FIRST_TEST_INDEX = int(os.environ.get("GPUHOST_TWIN_TEST_INDEX", node.FIRST_TEST_INDEX))


# Each pytest-xdist worker (gw0, gw1, ...) of a session takes its own range of indexes.
WORKER_INDEXES = 8  # a test holds at most three twins at once


def first_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return FIRST_TEST_INDEX + WORKER_INDEXES * int(worker.removeprefix("gw") or 0)


def support_problem() -> str | None:
    """Why twins cannot run here, or None."""
    if os.geteuid() != 0:
        return "twins need root (overlay mounts, chroot sshd, LXC)"
    missing = lifecycle.missing_tools()
    if missing:
        return f"missing {', '.join(missing)}: {lifecycle.INSTALL_HINT}"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs"
    return processes.port_22_problem()


def require_twins() -> None:
    problem = support_problem()
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"twin tests must run in CI but cannot: {problem}")
    pytest.skip(problem)


@dataclass
class Endpoint:
    """An SSH endpoint of the fleet (a twin or one of its guests), host keys checked."""

    address: str
    _host: Any = field(default=None, repr=False)

    key = property(lambda self: node.client_key())
    known_hosts = property(lambda self: node.known_hosts())
    ssh_config = property(lambda self: node.ssh_config())

    def connect(self, timeout: float = 10.0) -> Any:
        """A paramiko client that verifies the host key against the fleet's known_hosts."""
        import paramiko

        client = paramiko.SSHClient()
        client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(
            self.address,
            username="root",
            key_filename=str(self.key),
            look_for_keys=False,
            allow_agent=False,
            timeout=timeout,
        )
        return client

    def run(self, command: str, timeout: float = 120.0) -> tuple[int, str, str]:
        client = self.connect()
        try:
            _, out, err = client.exec_command(command, timeout=timeout)
            stdout, stderr = out.read().decode(), err.read().decode()
            return out.channel.recv_exit_status(), stdout, stderr
        finally:
            client.close()

    @property
    def host(self) -> Any:
        """A testinfra host (paramiko://root@address). testinfra's paramiko backend only warns on
        unknown host keys, so it is handed a client that verifies them; `reconnect()` after a
        reboot."""
        if self._host is None:
            import testinfra.backend
            from testinfra.host import Host

            backend = testinfra.backend.get_backend(
                f"paramiko://root@{self.address}", ssh_identity_file=str(self.key)
            )
            backend.__dict__["client"] = self.connect()  # fills its functools.cached_property
            self._host = Host(backend)
            backend.set_host(self._host)
        return self._host

    def reconnect(self) -> None:
        if self._host is not None:
            self._host.backend.client.close()
        self._host = None


@dataclass
class TwinHandle(Endpoint):
    twin: node.Twin | None = None

    @property
    def name(self) -> str:
        assert self.twin is not None
        return self.twin.name

    @property
    def root(self) -> Path:
        assert self.twin is not None
        return self.twin.root

    def guest(self, ctid: int) -> Endpoint:
        assert self.twin is not None
        return Endpoint(self.twin.guest_address(ctid))

    def request(self, req: str) -> tuple[int, str, str]:
        """Send a supervisor request from inside the twin, as the pct/reboot shims do."""
        return self.run(f"python3 /usr/lib/gpuhost-twin/twinreq.py '{req}'")

    def boot_id(self) -> str:
        return (self.root / "proc/sys/kernel/random/boot_id").read_text().strip()

    def reboot(self, command: str = "reboot", timeout: float = 30.0) -> float:
        """Reboot from inside and wait until it is back with a new boot_id; returns seconds."""
        before = self.boot_id()
        self.reconnect()
        t0 = time.monotonic()
        self.run(command)
        while self.boot_id() == before or not processes.wait_port(self.address, 22, timeout=0.5):
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{self.name} did not come back within {timeout} s")
            time.sleep(0.02)
        return time.monotonic() - t0


class Fleet:
    """Starts twins for a test session and stops every one of them at the end."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def _first_free(self, count: int) -> int:
        """The lowest index with ``count`` free indexes from it (stopped twins' are reused)."""
        used = {int(name.removeprefix("twin")) for name in self.started}
        first = first_index()
        while any(i in used for i in range(first, first + count)):
            first += 1
        if first + count > 255:
            raise RuntimeError("out of loopback addresses for test twins")
        return first

    def start(self, count: int = 1, profile: str | None = None) -> list[TwinHandle]:
        return self.start_profiles([profile] * count)

    def start_profiles(self, profiles: list[str | None]) -> list[TwinHandle]:
        """One twin per profile, started together."""
        require_twins()
        count = len(profiles)
        first = self._first_free(count)
        names = [node.twin_name(i) for i in range(first, first + count)]
        for name in names:
            lifecycle.stop(name)  # a leftover of a killed earlier run
        self.started += names
        twins = lifecycle.start_profiles(profiles, first)
        _forget_known_hosts()
        for t in twins:
            error = t.dir / "boot-error"
            if error.exists():  # a bug in the simulation must not pass as a booted host
                pytest.fail(f"{t.name}: simulate_boot raised:\n{error.read_text()}")
        return [TwinHandle(t.address, twin=t) for t in twins]

    def stop(self, handle: TwinHandle) -> None:
        handle.reconnect()
        lifecycle.stop(handle.name)
        if handle.name in self.started:
            self.started.remove(handle.name)

    def stop_all(self) -> None:
        for name in self.started:
            lifecycle.stop(name)
        self.started.clear()


@pytest.fixture(scope="session")
def twin_base() -> Path:
    """The cached Debian base every twin stands on (built the first time, about a minute)."""
    require_twins()
    from twin import rootfs

    return rootfs.ensure_base()


@pytest.fixture(scope="session")
def trixie_base() -> Path:
    """The Debian 13 base PVE 9 twins stand on (built the first time; see twin/rootfs.py)."""
    require_twins()
    from twin import rootfs

    return rootfs.ensure_base(suite="trixie")


@pytest.fixture(scope="session")
def twin_fleet() -> Iterator[Fleet]:
    # Here, not only in Fleet.start: a test that starts its twin another way (a subprocess, as
    # tests/e2e/test_rehearse.py does) also skips, or fails under CI, where twins cannot run.
    require_twins()
    fleet = Fleet()
    yield fleet
    fleet.stop_all()


@pytest.fixture(scope="module")
def twins(request: pytest.FixtureRequest, twin_fleet: Fleet) -> Iterator[list[TwinHandle]]:
    profile = getattr(request.module, "twin_profile", None)
    count = getattr(request.module, "twin_count", 1)
    handles = twin_fleet.start(count, profile)
    yield handles
    for handle in handles:
        twin_fleet.stop(handle)


@pytest.fixture(scope="module")
def twin(twins: list[TwinHandle]) -> TwinHandle:
    return twins[0]


def _forget_known_hosts() -> None:
    """The fleet's known_hosts now holds the new twins' keys: drop pyinfra's memo of it.

    pyinfra's SSH client loads a known_hosts file once per process (sshuserclient.client's
    ``get_host_keys`` is memoized); a test worker that read twins in-process earlier (facts'
    ``gather``) would otherwise judge a new twin by the keys of before and refuse it."""
    try:
        from pyinfra.connectors.sshuserclient.client import get_host_keys
    except ImportError:  # a twin test without pyinfra
        return
    get_host_keys.cache.clear()  # type: ignore[attr-defined]
