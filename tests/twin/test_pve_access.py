"""The twin's permission model (pve-access-control AccessControl.pm roles/create_roles,
parse_user_config/write_user_config, RPCEnvironment.pm permissions): built-in roles, ACL
inheritance with the propagate flag, groups, NoAccess, and privilege-separated tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.twin.pve_helpers import make_root
from twin.pve import access

# user.cfg as Proxmox writes it (write_user_config): users with their tokens, groups, roles, ACLs
USER_CFG = """\
user:alice@pve:1:0:Alice::alice@example.org:::
token:alice@pve!ci:0:1::
token:alice@pve!full:0:0::
user:root@pam:1:0::::::
token:root@pam!gpuhost:0:1::

group:ops:alice@pve::


role:VMStarter:VM.Audit,VM.PowerMgmt:

acl:1:/:@ops:PVEAuditor:
acl:1:/mapping/pci/gpu0:root@pam!gpuhost:PVEMappingUser:
acl:1:/vms:alice@pve:PVEVMAdmin:
acl:1:/vms:alice@pve!ci:VMStarter:
acl:0:/vms/129:alice@pve!ci:PVEAuditor:
acl:1:/vms/200:alice@pve:NoAccess:
"""


def test_builtin_roles_follow_create_roles() -> None:
    roles = access.BUILTIN_ROLES
    assert roles["PVEAuditor"] == {"VM.Audit", "Sys.Audit", "Datastore.Audit", "SDN.Audit",
                                   "Pool.Audit", "Mapping.Audit"}  # fmt: skip
    assert roles["PVEMappingUser"] == {"Mapping.Use", "Mapping.Audit"}
    assert roles["PVEMappingAdmin"] == {"Mapping.Modify", "Mapping.Use", "Mapping.Audit"}
    assert "Mapping.Modify" not in roles["PVEAdmin"] and "Mapping.Use" in roles["PVEAdmin"]
    assert {"VM.Config.HWType", "VM.PowerMgmt", "VM.Audit"} <= roles["PVEVMAdmin"]
    assert "Sys.Modify" not in roles["PVEAdmin"] and "Sys.Modify" in roles["Administrator"]
    assert roles["PVEVMUser"] == {"VM.Config.CDROM", "VM.Config.Cloudinit", "VM.Console",
                                  "VM.Backup", "VM.PowerMgmt", "VM.Audit"}  # fmt: skip


def test_user_cfg_round_trip_is_byte_identical() -> None:
    cfg = access.parse_user_cfg(USER_CFG)
    assert access.format_user_cfg(cfg) == USER_CFG
    assert cfg.users["alice@pve"].tokens["full"].privsep is False


def test_inheritance_propagate_groups_and_noaccess() -> None:
    cfg = access.parse_user_cfg(USER_CFG)
    alice = "alice@pve"
    assert "VM.Config.HWType" in access.privileges(cfg, alice, "/vms/129")  # propagated
    assert access.privileges(cfg, alice, "/vms/200") == set()  # NoAccess masks everything
    # her own ACL on /vms overrides the group's PVEAuditor from / on that subtree only
    assert "Sys.Audit" not in access.privileges(cfg, alice, "/vms/129")
    assert "Sys.Audit" in access.privileges(cfg, alice, "/nodes/pve1")
    assert access.privileges(cfg, "root@pam", "/anything") == access.BUILTIN_ROLES["Administrator"]


def test_privsep_tokens_have_their_own_acls_within_their_user() -> None:
    cfg = access.parse_user_cfg(USER_CFG)
    ci = "alice@pve!ci"
    # /vms/129 names the token itself (propagate=0 counts on the node itself): PVEAuditor only
    assert access.privileges(cfg, ci, "/vms/129") == {"VM.Audit", "Sys.Audit", "Datastore.Audit",
                                                      "SDN.Audit", "Pool.Audit", "Mapping.Audit"} & (
        access.privileges(cfg, "alice@pve", "/vms/129")
    )  # fmt: skip
    assert access.privileges(cfg, ci, "/vms/130") == {"VM.Audit", "VM.PowerMgmt"}
    assert access.privileges(cfg, ci, "/vms/200") == set()  # never more than its user has
    assert access.privileges(cfg, ci, "/nodes/pve1") == set()  # the group's ACL is not the token's
    full = "alice@pve!full"  # privsep=0: exactly its user's privileges
    assert access.privileges(cfg, full, "/vms/129") == access.privileges(
        cfg, "alice@pve", "/vms/129"
    )
    # root@pam's privsep token: its own ACLs, not intersected (root has everything)
    gpuhost = "root@pam!gpuhost"
    assert access.privileges(cfg, gpuhost, "/mapping/pci/gpu0") == {"Mapping.Use", "Mapping.Audit"}
    assert access.privileges(cfg, gpuhost, "/mapping/pci/gpu1") == set()
    assert access.privileges(cfg, "alice@pve!nope", "/") == set()


def test_checks_raise_proxmox_permission_errors(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    (root / access.USER_CFG).write_text(USER_CFG)
    token = access.set_caller("alice@pve!ci")
    try:
        access.check(root, "/vms/130", ["VM.PowerMgmt"])
        with pytest.raises(access.PveError) as exc:
            access.check(root, "/vms/130", ["VM.Audit", "VM.Config.HWType"])
        assert (exc.value.code, exc.value.msg) == (
            403,
            "Permission check failed (/vms/130, VM.Config.HWType)\n",
        )
        with pytest.raises(access.PveError, match=r"\(/vms/200, VM.Audit\|VM.PowerMgmt\)"):
            access.check(root, "/vms/200", ["VM.Audit", "VM.PowerMgmt"], any_of=True)
    finally:
        access.reset_caller(token)
    access.check(root, "/vms/200", ["VM.Allocate"])  # the default caller is root@pam


def test_helpers_write_what_pveum_would(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    access.add_user(root, "ci@pve")
    secret = access.add_token(root, "ci@pve", "deploy", privsep=True)
    access.grant(root, "/vms", "PVEVMAdmin", "ci@pve!deploy")
    access.grant(root, "/vms/129", ["PVEAuditor"], "ci@pve!deploy", propagate=False)
    text = (root / access.USER_CFG).read_text()
    assert "user:ci@pve:1:0::::::\ntoken:ci@pve!deploy:0:1::\n" in text
    assert (
        "acl:1:/vms:ci@pve!deploy:PVEVMAdmin:\nacl:0:/vms/129:ci@pve!deploy:PVEAuditor:\n" in text
    )
    assert access.read_secrets(root)["ci@pve!deploy"] == secret
    assert access.verify_token(root, "ci@pve!deploy", secret) == "ci@pve!deploy"
    access.add_user(root, "ci@pve", enable=False)
    with pytest.raises(access.PveError, match="disabled"):
        access.verify_token(root, "ci@pve!deploy", secret)
    access.revoke(root, "/vms", "PVEVMAdmin", "ci@pve!deploy")
    assert "acl:1:/vms:" not in (root / access.USER_CFG).read_text()
    with pytest.raises(ValueError, match="role 'Nope' does not exist"):
        access.grant(root, "/", "Nope", "ci@pve!deploy")
