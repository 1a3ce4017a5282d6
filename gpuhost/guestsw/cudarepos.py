"""NVIDIA's CUDA apt repository for a guest's distribution, and whether the guest's apt can
trust it: which repository a guest needs, which toolkits it publishes, and whether its key is
bound by a hash the guest's OpenPGP verifier accepts.

Pure: made from the guest's /etc/os-release, the verifier its apt uses (gpuhost/observe/guestsoft.py) and
the key's text from the control machine.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

from gpuhost.observe.guestsoft import SQV, GuestOs

# CUDA toolkits (of those gpuhost knows, grammar.CUDA_MIN_DRIVER) that NVIDIA publishes in each
# network repository, .../compute/cuda/repos/<name>/x86_64/. NVIDIA adds a distribution from the
# toolkit release that supports it on and does not backport older toolkits to it: debian13
# opened late in 2025 with the 13.x toolkits and a new key (NVIDIA/cuda-repo-management#32,
# 2025-12-09; #39, #40: only the new key and the new driver branches there; CUDA 13.0 was offered
# for Debian 13 on NVIDIA's download page until 13.3, guoqingbao/xinfer#366), so CUDA 12.x is not
# in it; debian12 has the toolkits from 12.3 on (NVIDIA/nvidia-docker#1791), ubuntu2204 and
# ubuntu2404 all of these.
PUBLISHED = {
    "debian12": ("12.8", "12.9", "13.0", "13.1"),
    "debian13": ("13.0", "13.1"),
    "ubuntu2204": ("12.8", "12.9", "13.0", "13.1"),
    "ubuntu2404": ("12.8", "12.9", "13.0", "13.1"),
}
# The distributions gpuhost deploys guest software to (apt, deb822 sources, systemd or the
# twin's service shim), as os-release names them -> NVIDIA's repository name.
SUPPORTED = {
    ("debian", "12"): "debian12",
    ("debian", "13"): "debian13",
    ("ubuntu", "22.04"): "ubuntu2204",
    ("ubuntu", "24.04"): "ubuntu2404",
}
_REPO_IN_URL = re.compile(r"/(?P<name>(?:debian|ubuntu)[0-9]{2,4})/(?P<arch>x86_64|sbsa)/$")
# OpenPGP hash algorithm ids (RFC 9580 9.5) that Debian 13's apt policy refuses for binding
# signatures (/usr/share/apt/default-sequoia.config: sha1.second_preimage_resistance and sha224
# until 2026-02-01; MD5 and RIPEMD-160 are refused by Sequoia's own standard policy).
_WEAK_HASHES = {1: "MD5", 2: "SHA-1", 3: "RIPEMD-160", 11: "SHA-224"}
_HASH_NAMES = {**_WEAK_HASHES, 8: "SHA-256", 9: "SHA-384", 10: "SHA-512", 12: "SHA3-256"}
_SELF_BINDINGS = {0x10, 0x11, 0x12, 0x13, 0x1F}  # user ID certifications, direct-key


def supported_repo(guest_os: GuestOs) -> str | None:
    """NVIDIA's repository name for this distribution, None if gpuhost does not support it."""
    return SUPPORTED.get((guest_os.id, guest_os.version_id))


def repo_in_url(url: str) -> str | None:
    """The distribution NVIDIA's URL layout names (.../repos/debian13/x86_64/ -> debian13)."""
    match = _REPO_IN_URL.search(url)
    return match["name"] if match else None


def _packets(data: bytes) -> list[tuple[int, bytes]]:
    """(tag, body) of each OpenPGP packet (RFC 9580 4.2); raises ValueError when malformed."""
    out, i = [], 0
    while i < len(data):
        head = data[i]
        if not head & 0x80:
            raise ValueError(f"no packet header at byte {i}")
        if head & 0x40:  # new format
            tag, first = head & 0x3F, data[i + 1]
            if first < 192:
                length, i = first, i + 2
            elif first < 224:
                length, i = ((first - 192) << 8) + data[i + 2] + 192, i + 3
            elif first == 255:
                length, i = int.from_bytes(data[i + 2 : i + 6], "big"), i + 6
            else:
                raise ValueError("partial body lengths in a key")
        else:  # legacy format
            tag, kind = (head >> 2) & 0x0F, head & 3
            if kind == 3:
                raise ValueError("indeterminate length in a key")
            size = 1 << kind
            length, i = int.from_bytes(data[i + 1 : i + 1 + size], "big"), i + 1 + size
        if i + length > len(data):
            raise ValueError("a packet runs past the end")
        out.append((tag, data[i : i + length]))
        i += length
    return out


def _dearmor(text: str) -> bytes:
    body = text.split("-----BEGIN PGP PUBLIC KEY BLOCK-----", 1)[1]
    body = body.split("-----END PGP PUBLIC KEY BLOCK-----", 1)[0]
    lines = body.strip().splitlines()
    while lines and ":" in lines[0]:  # armor headers (Comment:, Version:)
        lines.pop(0)
    data = [line.strip() for line in lines if line.strip() and not line.startswith("=")]
    return base64.b64decode("".join(data), validate=True)


def _issuers(sig: bytes) -> set[bytes]:
    """Issuer key ids (8 bytes) a v4 signature names in its subpackets (types 16 and 33)."""
    found, i = set(), 4
    for _area in range(2):
        size = int.from_bytes(sig[i : i + 2], "big")
        area, i = sig[i + 2 : i + 2 + size], i + 2 + size
        j = 0
        while j < len(area):
            first = area[j]
            if first < 192:
                length, j = first, j + 1
            elif first < 255:
                length, j = ((first - 192) << 8) + area[j + 1] + 192, j + 2
            else:
                length, j = int.from_bytes(area[j + 1 : j + 5], "big"), j + 5
            kind = area[j] & 0x7F if length else 0
            if kind == 16:
                found.add(area[j + 1 : j + 9])
            elif kind == 33:
                found.add(area[j + 2 : j + length][-8:])
            j += length
    return found


def binding_hashes(key_text: str) -> list[str]:
    """Hash algorithm names of the primary key's self-signatures (user ID certifications and
    direct-key signatures) in an armored key; raises ValueError when the key is malformed."""
    try:
        packets = _packets(_dearmor(key_text))
    except (IndexError, binascii.Error) as exc:
        raise ValueError(f"not an OpenPGP key block ({exc})") from None
    if not packets or packets[0][0] != 6:
        raise ValueError("no public key packet first")
    primary = packets[0][1]
    if primary[0] != 4:
        raise ValueError(f"a version {primary[0]} key (gpuhost reads version 4 keys)")
    keyid = hashlib.sha1(b"\x99" + len(primary).to_bytes(2, "big") + primary).digest()[-8:]
    names = []
    for tag, body in packets[1:]:
        if tag == 14:  # a subkey: its binding signatures follow, not the primary's
            break
        if tag != 2 or body[0] != 4 or body[1] not in _SELF_BINDINGS:
            continue
        issuers = _issuers(body)
        if issuers and keyid not in issuers:
            continue  # a third party's certification
        names.append(_HASH_NAMES.get(body[3], f"hash {body[3]}"))
    return names


def sqv_refuses(key_text: str) -> str | None:
    """Why Debian 13's apt (sqv) cannot bind this key to its user IDs, or None if it can."""
    hashes = binding_hashes(key_text)
    if not hashes:
        return "it carries no self-signature"
    if all(h in _WEAK_HASHES.values() for h in hashes):
        return f"its self-signatures use {', '.join(sorted(set(hashes)))} only"
    return None


def repo_problems(
    guest_os: GuestOs | None,
    verifier: str,
    url: str,
    keyring: str,
    key_text: str | None,
    versions: list[str],
) -> list[str]:
    """Why the guest cannot install ``versions`` from ``url`` signed by the key, before apt runs."""
    if guest_os is None:
        return [
            "cuda: the guest has no /etc/os-release, so gpuhost cannot tell which of NVIDIA's "
            "repositories it needs; give the container a Debian or Ubuntu userland"
        ]
    name = supported_repo(guest_os)
    if name is None:
        known = ", ".join(f"{i} {v}" for i, v in SUPPORTED)
        return [
            f"cuda: the guest runs {guest_os.pretty} (ID={guest_os.id} VERSION_ID="
            f"{guest_os.version_id or '-'}); gpuhost installs CUDA on {known} guests only"
        ]
    problems = []
    in_url = repo_in_url(url)
    if in_url is not None and in_url != name:
        problems.append(
            f"cuda_repo.url {url} is NVIDIA's {in_url} repository, but the guest runs "
            f"{guest_os.pretty}: use .../compute/cuda/repos/{name}/x86_64/ (or a mirror of it)"
        )
        return problems
    published = PUBLISHED[name]
    problems += [
        f"cuda: CUDA {v} is not published in NVIDIA's {name} repository (it has "
        f"{', '.join(published)}); remove {v!r} from cuda, or give this toolkit a guest whose "
        "release has it (Debian 12, Ubuntu 24.04)"
        for v in versions
        if v not in published
    ]
    if verifier == SQV and key_text is not None:
        try:
            reason = sqv_refuses(key_text)
        except ValueError as exc:
            reason = str(exc)
        if reason:
            problems.append(
                f"cuda_repo.keyring {keyring}: the guest's apt verifies with Sequoia (sqv), "
                f"whose Debian policy refuses this key: {reason} (SHA-1 bindings are refused "
                f"since 2026-02-01); give the key NVIDIA signs its {name} repository with "
                "(debian13: the new key, not 3bf863cc), or a mirror's SHA-256-bound key"
            )
    return problems
