"""CUDA as gpuhost's probe sees it on twins: the real gpuhost/probes/cuda_probe.py against the
twin's stand-in libcuda (gpuhost-twin/twin/libcuda), on the twin host over SSH and in real LXC
guests through `pct exec`. Each fault is planted the way it happens on a real host: a stale uvm
major in raw cgroup rules, a guest userspace of another driver version, uvm_disable_hmm left N,
P2P DMA on an SEV-SNP host with translated IOMMU domains, a pair without peer access whose copies
the driver stages through host memory, a GPU whose peer connections another process has used up.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest
import yaml

from gpuhost.observe.nvidia_driver import NvidiaUserspace, parse_userspace
from twin import driver
from twin.pytest_plugin import PVE_DIRS, TwinHandle

PROBE = Path(__file__).parents[2] / "gpuhost/probes/cuda_probe.py"
VERSION = "580.159.04"
LIB = f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"
SNP_GPUS = ["0000:43:00.0", "0000:44:00.0", "0000:c3:00.0", "0000:c4:00.0"]
HMM = "/etc/modprobe.d/nvidia-uvm.conf"
USERSPACE = NvidiaUserspace().command()
TIMED = "4096 8388608"  # a size of a MiB or more: the probe measures bandwidth


def probe_host(twin: TwinHandle, env: str = "", sizes: str = "4096 65536") -> dict:
    (twin.root / "root/cuda_probe.py").write_text(PROBE.read_text())
    rc, out, err = twin.run(f"{env} python3 /root/cuda_probe.py {sizes}")
    assert rc == 0, err
    return json.loads(out)


def probe_guest(twin: TwinHandle, ctid: int) -> dict:
    assert twin.twin is not None
    (twin.twin.dir / f"guests/{ctid}/root/root/cuda_probe.py").write_text(PROBE.read_text())
    rc, out, err = twin.run(f"pct exec {ctid} -- python3 /root/cuda_probe.py 4096 65536")
    assert rc == 0, err
    return json.loads(out)


def start_ct(twin: TwinHandle, ctid: int, conf: str) -> None:
    twin.run(f"{PVE_DIRS}; cat > /etc/pve/lxc/{ctid}.conf <<'EOF'\n{conf}EOF")
    rc, _, err = twin.request(f'{{"op": "ct-start", "ctid": {ctid}}}')
    assert rc == 0, err


def stop_ct(twin: TwinHandle, ctid: int) -> None:
    twin.request(f'{{"op": "ct-stop", "ctid": {ctid}}}')


def live_major(twin: TwinHandle, name: str) -> int:
    devices = twin.run("cat /proc/devices")[1].split("\n\n")[0].splitlines()[1:]
    return next(int(m) for m, n in (line.split() for line in devices) if n == name)


def copies(result: dict) -> dict[tuple[str, str], tuple[bool | None, bool]]:
    return {
        (c["from"], c["to"]): (c["peer"], all(s["ok"] for s in c["sizes"]))
        for c in result["copies"]
    }


def by_pair(result: dict) -> dict[tuple[str, str], dict]:
    return {(c["from"], c["to"]): c for c in result["copies"]}


def deploy_gpus(twin: TwinHandle, gpus: int, hmm: bool) -> None:
    """What a deploy leaves: driver installed, uvm loaded (hmm as given), every node made."""
    if hmm:
        twin.run(f"echo 'options nvidia_uvm uvm_disable_hmm=1' > {HMM}")
    assert twin.twin is not None
    driver.install(twin.twin, VERSION)
    for minor in range(gpus):
        assert twin.run(f"nvidia-modprobe -c={minor}")[0] == 0
    assert twin.run("nvidia-modprobe -u -c=0")[0] == 0


# -- h200x2: a healthy NVLink pair --------------------------------------------------------------


@pytest.fixture(scope="module")
def h200(twin_fleet) -> TwinHandle:
    handle = twin_fleet.start(1, "h200x2")[0]
    yield handle
    twin_fleet.stop(handle)


def test_no_nvidia_module_means_no_device(h200: TwinHandle) -> None:
    from twin import userspace

    userspace.install_root(h200.root, VERSION)  # userspace only, as before the driver's modules
    result = probe_host(h200)
    assert (result["libcuda"], result["init"]) == (LIB, "CUDA_ERROR_NO_DEVICE")
    assert result["driver_api"] == 13000  # a property of the library: answered all the same


def test_deployed_host_sees_every_gpu_and_copies_over_nvlink(h200: TwinHandle) -> None:
    deploy_gpus(h200, 2, hmm=True)
    result = probe_host(h200)
    assert (result["libcuda"], result["init"], result["error"]) == (LIB, "CUDA_SUCCESS", None)
    assert result["driver_api"] == 13000
    assert result["devices"] == [
        {"bdf": "0000:00:06.0", "name": "NVIDIA H200"},
        {"bdf": "0000:00:07.0", "name": "NVIDIA H200"},
    ]
    a, b = "0000:00:06.0", "0000:00:07.0"
    assert copies(result) == {
        (a, a): (None, True),
        (a, b): (True, True),  # no SEV-SNP: P2P DMA is sound
        (b, a): (True, True),
        (b, b): (None, True),
    }
    assert h200.run("nvidia-smi -L")[0] == 0  # libnvidia-ml matches the kernel driver


def test_peer_access_is_enabled_both_ways_and_copies_beat_host_staging(h200: TwinHandle) -> None:
    result = probe_host(h200, sizes=TIMED)
    a, b = "0000:00:06.0", "0000:00:07.0"
    pairs = by_pair(result)
    for there in ((a, b), (b, a)):
        copy = pairs[there]
        assert copy["enable"] == ["CUDA_SUCCESS", "CUDA_SUCCESS"], copy
        assert copy["gbps"] > copy["staged_gbps"] > 0, copy
        assert (copy["host_staged"], copy["error"]) == (False, None)
    assert pairs[(a, a)]["gbps"] > 0 and pairs[(a, a)]["host_staged"] is None
    # the probe gave its peer connections back: none is held once it ended
    assert h200.run("cat /run/gpuhost-twin-peers/* 2>/dev/null")[1] == ""


def test_hidden_devices_give_no_device_like_the_capture(h200: TwinHandle) -> None:
    result = probe_host(h200, env="CUDA_VISIBLE_DEVICES=")
    assert (result["init"], result["devices"]) == ("CUDA_ERROR_NO_DEVICE", [])
    result = probe_host(h200, env="CUDA_VISIBLE_DEVICES=1")
    assert result["devices"] == [{"bdf": "0000:00:07.0", "name": "NVIDIA H200"}]


def test_stale_uvm_node_is_cuda_error_999(h200: TwinHandle) -> None:
    """A node of another major than /proc/devices' live one (a stale mknod)."""
    h200.run("mv /dev/nvidia-uvm /dev/nvidia-uvm.away; mknod /dev/nvidia-uvm c 1 3")
    try:
        assert probe_host(h200)["init"] == "CUDA_ERROR_UNKNOWN"
    finally:
        h200.run("rm -f /dev/nvidia-uvm; mv /dev/nvidia-uvm.away /dev/nvidia-uvm")
    assert probe_host(h200)["init"] == "CUDA_SUCCESS"


def test_missing_nodes_are_made_through_nvidia_modprobe_on_the_host(h200: TwinHandle) -> None:
    """As the real library does: root on the host gets missing nodes made, then CUDA works."""
    h200.run("rm /dev/nvidia-uvm /dev/nvidia1")
    assert probe_host(h200)["init"] == "CUDA_SUCCESS"
    assert h200.run("stat -c %t:%T /dev/nvidia1")[1].strip() == "c3:1"
    assert h200.run("test -c /dev/nvidia-uvm")[0] == 0


# -- sevsnp: four GPUs, P2P DMA unsafe; guests -------------------------------------------------

CT_TWO_GPUS = 301
CONF_TWO_GPUS = """\
arch: amd64
hostname: two-gpus
dev0: /dev/nvidiactl
dev1: /dev/nvidia1
dev2: /dev/nvidia3
dev3: /dev/nvidia-uvm
dev4: /dev/nvidia-uvm-tools
"""
CT_RAW = 302
CONF_RAW = """\
arch: amd64
hostname: raw-rules
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c {uvm}:* rwm
lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
"""


@pytest.fixture(scope="module")
def snp(twin_fleet) -> TwinHandle:
    handle = twin_fleet.start(1, "sevsnp")[0]
    deploy_gpus(handle, 4, hmm=False)  # the operator's first attempt: hmm not disabled yet
    assert handle.twin is not None
    driver.install_userspace(handle.twin, CT_TWO_GPUS, VERSION)
    driver.install_userspace(handle.twin, CT_RAW, VERSION)
    yield handle
    for ctid in (CT_TWO_GPUS, CT_RAW):
        stop_ct(handle, ctid)
    twin_fleet.stop(handle)


def test_snp_peer_copies_corrupt_and_staged_copies_do_not(snp: TwinHandle) -> None:
    result = probe_host(snp)
    assert result["init"] == "CUDA_SUCCESS"
    assert [d["bdf"] for d in result["devices"]] == SNP_GPUS
    got = copies(result)
    g0, g1, g2, _ = SNP_GPUS
    assert got[(g0, g1)] == (True, False)  # topo -p2p says OK; the data arrives flipped
    assert got[(g1, g0)] == (True, False)
    assert got[(g0, g2)] == (False, True)  # no peer access: staged through the host, intact
    assert got[(g0, g0)] == (None, True)
    bad = next(c for c in result["copies"] if (c["from"], c["to"]) == (g0, g1))
    assert [s["first_bad_offset"] for s in bad["sizes"]] == [256, 256]


def test_pair_without_peer_access_runs_at_host_staged_speed(snp: TwinHandle) -> None:
    g0, g1, g2, _ = SNP_GPUS
    pairs = by_pair(probe_host(snp, sizes=TIMED))
    staged = pairs[(g0, g2)]  # NS across the sockets: cuMemcpyPeer stages through the host
    assert (staged["peer"], staged["enable"], staged["error"]) == (False, [None, None], None)
    assert staged["host_staged"] is None  # nothing to judge: P2P was never possible here
    p2p = pairs[(g0, g1)]
    assert (p2p["enable"], p2p["host_staged"]) == (["CUDA_SUCCESS", "CUDA_SUCCESS"], False)
    # the NS pair's copies go through the twin's host path (libcuda.c HOST_PATH_BPS, 2 GB/s: a
    # ceiling, however loaded the machine), like g0 <-> g1's own copy before peer access; two
    # such timings are not compared with each other (machine load moves either)
    assert staged["gbps"] <= 2.0 * 1.05 and p2p["staged_gbps"] <= 2.0 * 1.05
    assert p2p["gbps"] > 2 * staged["gbps"]


def test_guest_with_hmm_enabled_gets_cuda_error_999(snp: TwinHandle) -> None:
    start_ct(snp, CT_TWO_GPUS, CONF_TWO_GPUS)
    result = probe_guest(snp, CT_TWO_GPUS)
    assert (result["init"], result["devices"]) == ("CUDA_ERROR_UNKNOWN", [])
    assert probe_host(snp)["init"] == "CUDA_SUCCESS"  # the host itself is no container


def test_guest_sees_exactly_its_two_gpus_once_hmm_is_disabled(snp: TwinHandle) -> None:
    # Reloading nvidia_uvm with the option: the running guest sees the kernel's new state.
    snp.run(f"echo 'options nvidia_uvm uvm_disable_hmm=1' > {HMM}")
    assert snp.run("modprobe -r nvidia_uvm && modprobe nvidia_uvm")[0] == 0
    rc, out, _ = snp.run(
        f"pct exec {CT_TWO_GPUS} -- cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm"
    )
    assert (rc, out) == (0, "Y\n")
    result = probe_guest(snp, CT_TWO_GPUS)
    assert (result["libcuda"], result["init"]) == (LIB, "CUDA_SUCCESS")
    assert [d["bdf"] for d in result["devices"]] == ["0000:44:00.0", "0000:c4:00.0"]
    assert all(ok for _, ok in copies(result).values())  # 44 and c4 are no peers (NS)


def test_guest_userspace_of_another_version_is_a_driver_mismatch(snp: TwinHandle) -> None:
    assert snp.twin is not None
    driver.install_userspace(snp.twin, CT_TWO_GPUS, "570.124.06")
    try:
        result = probe_guest(snp, CT_TWO_GPUS)
        assert result["libcuda"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.570.124.06"
        assert result["init"] == "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"
        assert result["driver_api"] == 12080
        # what the audit's NvidiaUserspace fact reads: the loader's cache knows the new library
        _, out, _ = snp.run(f"pct exec {CT_TWO_GPUS} -- sh -c {shlex.quote(USERSPACE)}")
        assert parse_userspace(out.splitlines()) == {
            "libcuda": ["570.124.06"],
            "libnvidia-ml": ["570.124.06"],
        }
    finally:
        driver.install_userspace(snp.twin, CT_TWO_GPUS, VERSION)
    assert probe_guest(snp, CT_TWO_GPUS)["init"] == "CUDA_SUCCESS"


def test_stale_uvm_major_in_raw_rules_is_cuda_error_999(snp: TwinHandle) -> None:
    live = live_major(snp, "nvidia-uvm")
    stale = 509 if live != 509 else 511
    start_ct(snp, CT_RAW, CONF_RAW.format(uvm=stale))
    result = probe_guest(snp, CT_RAW)
    assert result["init"] == "CUDA_ERROR_UNKNOWN"
    stop_ct(snp, CT_RAW)
    start_ct(snp, CT_RAW, CONF_RAW.format(uvm=live))  # the deploy's fix: the live major
    result = probe_guest(snp, CT_RAW)
    assert (result["init"], [d["bdf"] for d in result["devices"]]) == ("CUDA_SUCCESS", SNP_GPUS[:1])


# -- ten PCIe GPUs, no NVSwitch: eight peer connections per GPU at most ------------------------

HOLD = """\
import ctypes, sys, time
cu = ctypes.CDLL("libcuda.so.1")
cu.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
cu.cuCtxEnablePeerAccess.argtypes = [ctypes.c_void_p, ctypes.c_uint]
assert cu.cuInit(0) == 0
ctx = [ctypes.c_void_p() for _ in range(9)]
for i, c in enumerate(ctx):
    cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), i)
cu.cuCtxSetCurrent(ctx[0])
print([cu.cuCtxEnablePeerAccess(c, 0) for c in ctx[1:]], flush=True)
time.sleep(600)
"""


def pcie10_profile(path: Path) -> Path:
    """h200x2's machine with ten GPUs behind PCIe switches, P2P OK between all, no NVSwitch."""
    data = yaml.safe_load(
        (Path(PROBE).parents[2] / "gpuhost-twin/twin/profiles/h200x2.yaml").read_text()
    )
    template_dev = next(d for d in data["pci_devices"] if d["vendor"] == "10de")
    data["pci_devices"] = [d for d in data["pci_devices"] if d["vendor"] != "10de"]
    template, gpus = data["gpus"][0], []
    for i in range(10):
        bdf = f"0000:00:{6 + i:02x}.0"
        data["pci_devices"].append({**template_dev, "bdf": bdf})
        gpus.append(
            {
                **template,
                "bdf": bdf,
                "uuid": f"GPU-00000000-0000-0000-0000-0000000000{i:02d}",
                "serial": f"16537240000{i:02d}",
                "module_id": str(i + 1),
                "board_id": hex(6 + i),
            }
        )
    data["gpus"] = gpus
    cell = lambda same, other: [[same if r == c else other for c in range(10)] for r in range(10)]  # noqa: E731
    data["topology"] = {
        "links": cell("X", "PIX"),
        "p2p": {m: cell("X", "OK" if m != "p" else "NS") for m in ("r", "w", "n", "a", "p")},
    }
    data["name"] = data["hostname"] = "pcie10"
    data["description"] = "ten GPUs behind PCIe switches, P2P OK, no NVSwitch"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def pcie10(twin_fleet, tmp_path_factory) -> TwinHandle:
    profile = pcie10_profile(tmp_path_factory.mktemp("pcie10") / "pcie10.yaml")
    handle = twin_fleet.start(1, str(profile))[0]
    deploy_gpus(handle, 10, hmm=True)
    yield handle
    twin_fleet.stop(handle)


def test_too_many_peers_is_one_pairs_result(pcie10: TwinHandle) -> None:
    """Another process holds GPU0's eight peer connections (1-8): GPU0 <-> GPU9 cannot be
    enabled, that pair's copies run staged, and every other pair is still checked."""
    (pcie10.root / "root/hold.py").write_text(HOLD)
    rc, pid, err = pcie10.run(
        "setsid python3 /root/hold.py >/root/hold.out 2>&1 </dev/null & echo $!"
    )
    assert rc == 0, err
    try:
        for _ in range(100):
            if pcie10.run("cat /root/hold.out")[1]:
                break
            time.sleep(0.1)
        assert pcie10.run("cat /root/hold.out")[1] == "[0, 0, 0, 0, 0, 0, 0, 0]\n"
        result = probe_host(pcie10, sizes=TIMED)
    finally:
        pcie10.run(f"kill {int(pid)}")
    assert result["error"] is None
    gpus = [d["bdf"] for d in result["devices"]]
    pairs = by_pair(result)
    refused = {k for k, c in pairs.items() if c["enable"] and "CUDA_SUCCESS" not in c["enable"]}
    assert refused == {(gpus[0], gpus[9]), (gpus[9], gpus[0])}
    for there in refused:
        assert pairs[there]["enable"] == ["CUDA_ERROR_TOO_MANY_PEERS"] * 2
        assert pairs[there]["host_staged"] is True and pairs[there]["error"] is None
        assert all(s["ok"] for s in pairs[there]["sizes"])
    others = [c for k, c in pairs.items() if k[0] != k[1] and k not in refused]
    assert len(others) == 88 and not [c for c in others if c["host_staged"] or c["error"]]
