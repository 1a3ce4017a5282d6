"""API tokens and the permission checks over /etc/pve/user.cfg (usercfg.py) (stdlib only).

Follows pve-access-control (stable-bookworm, PVE 8): AccessControl.pm `$privgroups` and
`create_roles` (the built-in roles), `parse_user_config`/`write_user_config` (the file format),
`roles` (ACL inheritance along the path: the deepest node that names the caller wins, a role on
a parent applies only with propagate=1, a token's own entry beats its user's, a user's beats its
groups'; NoAccess masks everything), `check_user_enabled`/`verify_token` (token login), and
RPCEnvironment.pm `permissions`/`check`/`check_any` (root@pam has every privilege; a token without
privilege separation has its user's privileges; a privsep token has only what its own ACLs grant,
intersected with its user's, except for root@pam's tokens, which are not intersected).
Not modelled: pools, realms other than their names, TFA, tickets and CSRF (the twin's API takes
tokens only).

Who is calling is a context variable (`caller()`): routes.call sets it per request; pvesh and qm
inside the twin run as root@pam, like the real CLI tools started by root.
"""

from __future__ import annotations

import contextvars
import os
import re
import time
import uuid
from pathlib import Path

from .schema import PveError
from .usercfg import (  # noqa: F401  (access.X is the twin's API for these too)
    BUILTIN_ROLES,
    REALM_RE,
    ROOT,
    TOKENID_RE,
    USER_CFG,
    USERID_RE,
    VALID_PRIVS,
    AclNode,
    Token,
    User,
    UserConfig,
    format_user_cfg,
    load,
    normalize_path,
    parse_user_cfg,
    save,
)

# What a profiled twin grants its `root@pam!gpuhost` token (lifecycle.create): read everything,
# manage VMs (config, power), and create/use PCI mappings. Neither gives the root-only rights.
GPUHOST_TOKEN_ACLS = (("/", "PVEAuditor"), ("/vms", "PVEVMAdmin"),
                      ("/mapping/pci", "PVEMappingAdmin"))  # fmt: skip
TOKEN_CFG = "etc/pve/priv/token.cfg"

# --- roles and privileges ---


def roles(cfg: UserConfig, user: str, path: str) -> dict[str, bool]:
    """AccessControl::roles: {role: propagate} of ``user`` (a userid or a tokenid) on ``path``."""
    if user == ROOT:
        return {"Administrator": True}
    token = TOKENID_RE.fullmatch(user)
    if token:
        info = cfg.users.get(token.group(1), User()).tokens.get(token.group(4))
        if info is None:
            return {}
        if not info.privsep:
            return roles(cfg, token.group(1), path)
    parts = [""] if path == "/" else path.split("/")
    found: dict[str, bool] = {}
    current = ""
    for i, part in enumerate(parts):
        final = i == len(parts) - 1
        current = "/" if part == "" else (current.rstrip("/") + "/" + part)
        node = cfg.acl.get(current)
        if node is None:
            continue
        new = _applicable(node.members.get(user, {}), final)
        if new:
            found = new  # a token's or user's own entry overrides; groups only if none
            continue
        new = {}
        for member, member_roles in node.members.items():
            group = member[1:] if member.startswith("@") else None
            if group and user in cfg.groups.get(group, (set(), ""))[0]:
                new.update(_applicable(member_roles, final))
        if new:
            found = new
    if "NoAccess" in found:
        return {"NoAccess": found["NoAccess"]}
    return found


def _applicable(member_roles: dict[str, bool], final: bool) -> dict[str, bool]:
    return {r: p for r, p in member_roles.items() if final or p}


def privileges(cfg: UserConfig, user: str, path: str) -> set[str]:
    """RPCEnvironment::permissions, as a set."""
    if user == ROOT:
        return set(BUILTIN_ROLES["Administrator"])
    token = TOKENID_RE.fullmatch(user)
    owner = token.group(1) if token else None
    if token:
        info = cfg.users.get(token.group(1), User()).tokens.get(token.group(4))
        if info is None:
            return set()
        if not info.privsep:
            return privileges(cfg, token.group(1), path)
    privs: set[str] = set()
    for role in roles(cfg, user, path):
        privs |= cfg.role(role) or frozenset()
    if owner is not None and owner != ROOT:
        privs &= privileges(cfg, owner, path)  # a token never exceeds its user
    return privs


# --- the caller and the checks the API handlers make ---

_CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("pve_caller", default=ROOT)


def caller() -> str:
    return _CALLER.get()


def set_caller(user: str) -> contextvars.Token[str]:
    return _CALLER.set(user)


def reset_caller(token: contextvars.Token[str]) -> None:
    _CALLER.reset(token)


def perm_error(what: str) -> PveError:
    """PVE::Exception raise_perm_exc: 403 'Permission check failed (what)'."""
    return PveError(f"Permission check failed ({what})", code=403)


def allowed(root: Path, path: str, privs: list[str], any_of: bool = False) -> bool:
    user = caller()
    if user == ROOT:
        return True
    have = privileges(load(root), user, path)
    return any(p in have for p in privs) if any_of else all(p in have for p in privs)


def check(root: Path, path: str, privs: list[str], any_of: bool = False) -> None:
    """RPCEnvironment check / check_any: 403 naming the path and the (first missing) privilege."""
    user = caller()
    if user == ROOT:
        return
    have = privileges(load(root), user, path)
    if any_of:
        if not any(p in have for p in privs):
            raise perm_error(f"{path}, {'|'.join(privs)}")
        return
    for priv in privs:
        if priv not in have:
            raise perm_error(f"{path}, {priv}")


# --- tokens: login, and the twin-side helpers tests use (pveum user token add, acl modify) ---


def read_secrets(root: Path) -> dict[str, str]:
    """priv/token.cfg: `user@realm!tokenid secret` per line (pmxcfs's format)."""
    try:
        return parse_secrets((root / TOKEN_CFG).read_text())
    except FileNotFoundError:
        return {}


def parse_secrets(text: str) -> dict[str, str]:
    secrets = {}
    for line in text.splitlines():
        m = re.fullmatch(r"\s*(\S+!\S+?)(?:\s+|=)(\S+)\s*", line)
        if m and not line.lstrip().startswith("#"):
            secrets[m.group(1)] = m.group(2)
    return secrets


def verify_token(root: Path, tokenid: str, secret: str) -> str:
    """AccessControl::verify_token: the tokenid, or PveError (the API answers 401)."""
    import hmac

    m = TOKENID_RE.fullmatch(tokenid)
    if not m:
        raise PveError(f"'{tokenid}' is not a valid token ID", code=401)
    cfg = load(root)
    user = cfg.users.get(m.group(1))
    now = time.time()
    if user is None:
        raise PveError(f"no such user ('{m.group(1)}')", code=401)
    if not user.enable:
        raise PveError(f"user '{m.group(1)}' is disabled", code=401)
    if user.expire and user.expire < now:
        raise PveError(f"user '{m.group(1)}' access expired", code=401)
    token = user.tokens.get(m.group(4))
    if token is None:
        raise PveError(f"no such token '{m.group(4)}' for user '{m.group(1)}'", code=401)
    if token.expire and token.expire < now:
        raise PveError(f"token '{m.group(4)}' access expired", code=401)
    known = read_secrets(root).get(tokenid)
    if known is None or not hmac.compare_digest(known, secret):
        raise PveError("invalid token value!", code=401)
    return tokenid


def add_user(root: Path, userid: str, enable: bool = True, expire: int = 0) -> None:
    """`pveum user add USERID` (the twin keeps no passwords)."""
    if not USERID_RE.fullmatch(userid):
        raise ValueError(f"userid {userid!r} is not like 'name@realm'")
    cfg = load(root)
    user = cfg.users.setdefault(userid, User())
    user.enable, user.expire = enable, expire
    save(root, cfg)


def add_token(
    root: Path, userid: str, tokenid: str, privsep: bool = True, expire: int = 0, comment: str = ""
) -> str:
    """`pveum user token add USERID TOKENID [--privsep 0|1] [--expire T]`: returns the secret.

    The user must exist (root@pam always does); an existing token gets a new secret."""
    if not USERID_RE.fullmatch(userid):
        raise ValueError(f"userid {userid!r} is not like 'root@pam'")
    if not re.fullmatch(REALM_RE, tokenid):
        raise ValueError(
            f"tokenid {tokenid!r} must start with a letter (then letters, digits, .-_)"
        )
    cfg = load(root)
    if userid not in cfg.users:
        raise ValueError(f"no such user ('{userid}'); add it first (add_user)")
    cfg.users[userid].tokens[tokenid] = Token(privsep, expire, comment)
    save(root, cfg)
    full = f"{userid}!{tokenid}"
    path = root / TOKEN_CFG
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    lines = [f"{k} {v}" for k, v in read_secrets(root).items() if k != full]
    secret = str(uuid.uuid4())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("".join(f"{ln}\n" for ln in [*lines, f"{full} {secret}"]))
    return secret


def grant(
    root: Path, path: str, roles_: str | list[str], members: str | list[str], propagate: bool = True
) -> None:
    """`pveum acl modify PATH --roles R[,R] --users|--tokens|--groups M[,M] [--propagate 0|1]`."""
    norm = normalize_path(path)
    if norm is None:
        raise ValueError(f"ACL path {path!r} is not valid")
    cfg = load(root)
    names = [r for r in (roles_.split(",") if isinstance(roles_, str) else roles_) if r]
    for role in names:
        if cfg.role(role) is None:
            raise ValueError(f"role '{role}' does not exist")
    node = cfg.acl.setdefault(norm, AclNode())
    for member in members.split(",") if isinstance(members, str) else members:
        for role in names:
            node.members.setdefault(member, {})[role] = propagate
    save(root, cfg)


def revoke(root: Path, path: str, roles_: str | list[str], members: str | list[str]) -> None:
    """`pveum acl delete PATH --roles R --tokens M`."""
    norm = normalize_path(path) or path
    cfg = load(root)
    node = cfg.acl.get(norm)
    names = roles_.split(",") if isinstance(roles_, str) else roles_
    for member in members.split(",") if isinstance(members, str) else members:
        if node and member in node.members:
            for role in names:
                node.members[member].pop(role, None)
            if not node.members[member]:
                del node.members[member]
    save(root, cfg)
