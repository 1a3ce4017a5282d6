"""/etc/pve/user.cfg: users, tokens, groups, roles and ACL lines, and the built-in roles (stdlib
only). Follows pve-access-control (stable-bookworm, PVE 8): AccessControl.pm `$privgroups` and
`create_roles`, `parse_user_config`/`write_user_config`, `normalize_path`. The permission checks
that read it are access.py's."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = "root@pam"
USER_CFG = "etc/pve/user.cfg"

# PVE::Auth::Plugin user_regex / realm_regex and AccessControl token_full_regex
USER_RE = r"[^\s:/]+"
REALM_RE = r"[A-Za-z][A-Za-z0-9.\-_]+"
USERID_RE = re.compile(rf"({USER_RE})@({REALM_RE})")
TOKENID_RE = re.compile(rf"(({USER_RE})@({REALM_RE}))!({REALM_RE})")

# AccessControl.pm $privgroups (PVE 8): admin, user and audit privileges of each category
_PRIVGROUPS: dict[str, dict[str, list[str]]] = {
    "VM": {
        "root": [],
        "admin": ["VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network",
                  "VM.Config.HWType", "VM.Config.Options", "VM.Allocate", "VM.Clone",
                  "VM.Migrate", "VM.Monitor", "VM.Snapshot", "VM.Snapshot.Rollback"],
        "user": ["VM.Config.CDROM", "VM.Config.Cloudinit", "VM.Console", "VM.Backup",
                 "VM.PowerMgmt"],
        "audit": ["VM.Audit"],
    },
    "Sys": {
        "root": ["Sys.PowerMgmt", "Sys.Modify", "Sys.Incoming", "Sys.AccessNetwork"],
        "admin": ["Sys.Console", "Sys.Syslog"],
        "user": [],
        "audit": ["Sys.Audit"],
    },
    "Datastore": {
        "root": [],
        "admin": ["Datastore.Allocate", "Datastore.AllocateTemplate"],
        "user": ["Datastore.AllocateSpace"],
        "audit": ["Datastore.Audit"],
    },
    "SDN": {"root": [], "admin": ["SDN.Allocate", "SDN.Audit"], "user": ["SDN.Use"],
            "audit": ["SDN.Audit"]},
    "User": {"root": ["Realm.Allocate"], "admin": ["User.Modify", "Group.Allocate",
             "Realm.AllocateUser"], "user": [], "audit": []},
    "Pool": {"root": [], "admin": ["Pool.Allocate"], "user": ["Pool.Audit"],
             "audit": ["Pool.Audit"]},
    "Mapping": {"root": [], "admin": ["Mapping.Modify"], "user": ["Mapping.Use"],
                "audit": ["Mapping.Audit"]},
}  # fmt: skip


def _builtin_roles() -> tuple[set[str], dict[str, frozenset[str]]]:
    """create_roles(): PVE<Cat>Admin/User, PVEAdmin, PVEAuditor, Administrator, NoAccess."""
    valid = {"Permissions.Modify"}
    roles: dict[str, set[str]] = {"NoAccess": set()}
    for cat, groups in _PRIVGROUPS.items():
        valid.update(p for kind in ("root", "admin", "user", "audit") for p in groups[kind])
        for priv in groups["admin"] + groups["user"] + groups["audit"]:
            roles.setdefault(f"PVE{cat}Admin", set()).add(priv)
            roles.setdefault("PVEAdmin", set()).add(priv)
        if groups["user"]:
            for priv in groups["user"] + groups["audit"]:
                roles.setdefault(f"PVE{cat}User", set()).add(priv)
        for priv in groups["audit"]:
            roles.setdefault("PVEAuditor", set()).add(priv)
    roles["PVEAdmin"].discard("Mapping.Modify")  # only Administrator and PVEMappingAdmin have it
    roles["PVETemplateUser"] = {"VM.Clone", "VM.Audit"}
    roles["Administrator"] = set(valid)
    return valid, {name: frozenset(privs) for name, privs in roles.items()}


VALID_PRIVS, BUILTIN_ROLES = _builtin_roles()


@dataclass
class Token:
    privsep: bool = True
    expire: int = 0
    comment: str = ""


@dataclass
class User:
    enable: bool = True
    expire: int = 0
    rest: list[str] = field(default_factory=lambda: ["", "", "", "", ""])  # names, email, keys
    tokens: dict[str, Token] = field(default_factory=dict)


@dataclass
class AclNode:
    # member ("user@realm", "user@realm!token" or "@group") -> {role: propagate}
    members: dict[str, dict[str, bool]] = field(default_factory=dict)


@dataclass
class UserConfig:
    users: dict[str, User] = field(default_factory=dict)
    groups: dict[str, tuple[set[str], str]] = field(default_factory=dict)
    roles: dict[str, frozenset[str]] = field(default_factory=dict)  # custom roles only
    acl: dict[str, AclNode] = field(default_factory=dict)  # normalized path -> node
    other: list[str] = field(default_factory=list)  # pool lines, kept as they are

    def role(self, name: str) -> frozenset[str] | None:
        return BUILTIN_ROLES.get(name, self.roles.get(name))


def normalize_path(path: str) -> str | None:
    """AccessControl::normalize_path."""
    if not path:
        return None
    path = re.sub(r"/+", "/", path).rstrip("/") or "/"
    path = path if path.startswith("/") else "/" + path
    return path if re.fullmatch(r"[A-Za-z0-9.\-_/]+", path) else None


def parse_user_cfg(text: str) -> UserConfig:
    """parse_user_config: colon-separated lines; invalid ones are skipped (Proxmox warns)."""
    cfg = UserConfig()
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        data = [d.strip() for d in line.split(":")]
        kind, data = data[0], data[1:] + [""] * 8
        if kind == "user" and USERID_RE.fullmatch(data[0]) and re.fullmatch(r"\d*", data[2]):
            cfg.users[data[0]] = User(data[1] not in ("", "0"), int(data[2] or 0), data[3:8])
        elif kind == "token" and TOKENID_RE.fullmatch(data[0]) and re.fullmatch(r"\d*", data[1]):
            m = TOKENID_RE.fullmatch(data[0])
            assert m is not None
            if m.group(1) in cfg.users:
                cfg.users[m.group(1)].tokens[m.group(4)] = Token(
                    data[2] not in ("", "0"), int(data[1] or 0), data[3]
                )
        elif kind == "group":
            members = {u for u in data[1].split(",") if u}
            cfg.groups[data[0]] = (members, data[2])
        elif kind == "role":
            cfg.roles[data[0]] = frozenset(p for p in data[1].split(",") if p in VALID_PRIVS)
        elif kind == "acl":
            path = normalize_path(data[1])
            if path is None:
                continue
            node = cfg.acl.setdefault(path, AclNode())
            for role in (r for r in data[3].split(",") if r):
                if cfg.role(role) is None:
                    continue  # "ignore invalid acl role"
                for member in (m for m in data[2].split(",") if m):
                    node.members.setdefault(member, {})[role] = data[0] not in ("", "0")
        else:
            cfg.other.append(line)
    cfg.users.setdefault(ROOT, User())  # userconfig_force_defaults
    return cfg


def format_user_cfg(cfg: UserConfig) -> str:
    """write_user_config: users with their tokens, groups, pools, roles, then ACLs per path."""
    out = []
    for userid in sorted(cfg.users):
        user = cfg.users[userid]
        rest = (user.rest + [""] * 5)[:5]
        out.append(f"user:{userid}:{int(user.enable)}:{user.expire}:{':'.join(rest)}:")
        for name in sorted(user.tokens):
            tok = user.tokens[name]
            out.append(f"token:{userid}!{name}:{tok.expire}:{int(tok.privsep)}:{tok.comment}:")
    out.append("")
    for name in sorted(cfg.groups):
        members, comment = cfg.groups[name]
        out.append(f"group:{name}:{','.join(sorted(members))}:{comment}:")
    out.append("")
    out += cfg.other
    out.append("")
    for name in sorted(cfg.roles):
        out.append(f"role:{name}:{','.join(sorted(cfg.roles[name]))}:")
    out.append("")
    # iterate_acl_tree: depth first, children sorted by name
    for path in sorted(cfg.acl, key=lambda p: [] if p == "/" else p.strip("/").split("/")):
        by_list: dict[tuple[int, str], list[str]] = {}
        for member, roles in cfg.acl[path].members.items():
            if member == ROOT:
                continue  # "no need to save 'root@pam', it is always 'Administrator'"
            for flag in (0, 1):
                names = ",".join(sorted(r for r, p in roles.items() if int(p) == flag))
                if names:
                    by_list.setdefault((flag, names), []).append(member)
        for flag, names in sorted(by_list):
            members = ",".join(sorted(by_list[(flag, names)]))
            out.append(f"acl:{flag}:{path}:{members}:{names}:")
    return "\n".join(out) + "\n"


def load(root: Path) -> UserConfig:
    try:
        return parse_user_cfg((root / USER_CFG).read_text())
    except FileNotFoundError:
        return parse_user_cfg("")


def save(root: Path, cfg: UserConfig) -> None:
    path = root / USER_CFG
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(format_user_cfg(cfg))
    os.replace(tmp, path)
