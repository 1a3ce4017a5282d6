"""`zpool status -x` and `pvesm status` as the gate reads them (gpuhost/observe/storage.py)."""

from __future__ import annotations

import pytest

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.storage import parse_storage_health

DEGRADED = """\
  pool: tank
 state: DEGRADED
status: One or more devices could not be used because the label is missing or
\tinvalid.  Sufficient replicas exist for the pool to continue
\tfunctioning in a degraded state.
action: Replace the device using 'zpool replace'.
   see: https://openzfs.github.io/openzfs-docs/msg/ZFS-8000-4J
config:

\tNAME        STATE     READ WRITE CKSUM
\ttank        DEGRADED     0     0     0

errors: No known data errors
"""
PVESM = """\
Name             Type     Status     Total (KiB)      Used (KiB) Available (KiB)        %
local             dir     active        98497780        10398888        83049344   10.56%
local-zfs     zfspool   inactive               0               0               0    0.00%
old               nfs   disabled               0               0               0      N/A
"""


def test_healthy_and_empty():
    for verdict in ("all pools are healthy", "no pools available"):
        health = parse_storage_health(["== zpool", verdict, "== rc 0"])
        assert health.zpool is not None and not health.zpool.unhealthy and not health.zpool.error
    assert parse_storage_health([]).zpool is None  # zpool not installed


def test_unhealthy_pools_and_a_missing_module():
    lines = ["== zpool", *DEGRADED.splitlines(), "== rc 0"]
    assert parse_storage_health(lines).zpool.unhealthy == {"tank": "DEGRADED"}
    lines = ["== zpool", "The ZFS modules are not loaded.", "== rc 1"]
    assert (
        "exit status 1: The ZFS modules are not loaded." in parse_storage_health(lines).zpool.error
    )
    with pytest.raises(UnparsedOutput):
        parse_storage_health(["== zpool", "something else", "== rc 0"])


def test_pvesm_rows_and_warnings():
    lines = [
        "== pvesm",
        *PVESM.splitlines(),
        "== rc 0",
        "== warning zfs error: cannot open 'rpool': no such pool",
    ]
    pvesm = parse_storage_health(lines).pvesm
    assert pvesm.storages == {
        "local": ("dir", "active"),
        "local-zfs": ("zfspool", "inactive"),
        "old": ("nfs", "disabled"),
    }
    assert pvesm.warnings == ("zfs error: cannot open 'rpool': no such pool",)
    failed = parse_storage_health(["== pvesm", "== rc 13", "== warning ipcc_send_rec failed"]).pvesm
    assert failed.error == "exit status 13: ipcc_send_rec failed"
