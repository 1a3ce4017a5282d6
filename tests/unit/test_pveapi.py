"""The API token: from a 0600 file or the environment, strictly parsed, never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhost.pve.token import ApiTokenError, read_token
from gpuhost.spec.proxmox import ProxmoxApiSpec

SECRET = "0b5e9a4c-1f2d-4e6a-9c3b-7d8e1f2a3b4c"


def test_token_from_the_environment() -> None:
    token = read_token(ProxmoxApiSpec(), {"GPUHOST_PVE_TOKEN": f"root@pam!gpuhost={SECRET}"})
    assert (token.identity, token.secret) == ("root@pam!gpuhost", SECRET)
    assert SECRET not in repr(token)


def test_missing_token_names_the_variable_and_the_fix() -> None:
    with pytest.raises(ApiTokenError, match="export GPUHOST_PVE_TOKEN=USER@REALM!TOKENID=SECRET"):
        read_token(ProxmoxApiSpec(), {})


def test_malformed_token_is_refused_without_showing_it() -> None:
    bad = f"root@pam:gpuhost={SECRET}"
    with pytest.raises(ApiTokenError) as refused:
        read_token(ProxmoxApiSpec(token_env="PVE"), {"PVE": bad})
    assert "environment variable PVE" in str(refused.value) and SECRET not in str(refused.value)


def test_token_file_must_be_private(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"gpuhost@pve!deploy={SECRET}\n")
    path.chmod(0o644)
    spec = ProxmoxApiSpec(token_file=str(path))
    with pytest.raises(
        ApiTokenError, match=f"mode 0644; others may read the token: chmod 600 {path}"
    ):
        read_token(spec, {})
    path.chmod(0o600)
    assert read_token(spec, {}).identity == "gpuhost@pve!deploy"
    with pytest.raises(ApiTokenError, match="cannot be read"):
        read_token(ProxmoxApiSpec(token_file=str(tmp_path / "absent")), {})


def test_an_api_error_shows_proxmoxs_own_message() -> None:
    """pveproxy sends a handler's die message as the HTTP reason; proxmoxer keeps it as the
    exception's content, beside the code's standard phrase: the error shows the message."""
    from proxmoxer import ResourceException

    from gpuhost.pve.api import _describe

    msg = "create hardware mapping failed: pci ID 'gpuhost-0000-c1-00' already defined"
    died = ResourceException(500, "Internal Server Error", msg, errors={"errors": b""})
    assert (
        _describe("post", "/cluster/mapping/pci", died) == f"POST /cluster/mapping/pci: 500 {msg}"
    )
    bad = ResourceException(
        400, "Bad Request", "Parameter verification failed.", errors={"map": "invalid format"}
    )
    assert _describe("put", "/x", bad) == (
        "PUT /x: 400 Parameter verification failed. (map: invalid format)"
    )
