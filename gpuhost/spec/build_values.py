"""The pydantic types of a kernel build's values (kernel.build): its repository and ref, the
patches, the config and its base, LOCALVERSION. Same style as gpuhost/spec/values.py, whose
helpers they use."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from gpuhost.redact import show
from gpuhost.spec.grammar import (
    BASE_CONFIG_TARGETS,
    CONFIG_NAME_RE,
    CONFIG_VALUE_RE,
    GIT_PATH_CHARS,
    GIT_REF_RE,
    HTTPS_URL_RE,
    LOCALVERSION_RE,
    REL_PATH_RE,
    SCP_URL_RE,
    SSH_URL_RE,
)
from gpuhost.spec.values import _abs_path, _bounded, _first_bad, _grammar


def _patch_path(value: str) -> str:
    _bounded(value, "path", 1024)
    if REL_PATH_RE.fullmatch(value) and ".." not in value.split("/"):
        return value
    raise ValueError(
        f"{show(value)} is not a normalised path relative to files/ (no leading '/', no '.' or "
        "'..' components, no '//' or trailing '/', ASCII letters, digits and ._+@-); write e.g. "
        "'patches/acs-override.patch'"
    )


def _git_repo(value: str) -> str:
    _bounded(value, "repository address", 1024)
    fix = (
        "write an https:// or ssh:// git URL, user@host:path, or an absolute path; credentials "
        "never go into the URL (use an SSH key or a credential helper on the host)"
    )
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", value)
    if scheme and re.match(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@]*@", value):
        userinfo = value[len(scheme[0]) :].split("@", 1)[0]
        if scheme[1] != "ssh" or ":" in userinfo:
            raise ValueError(f"{show(value)} carries credentials; {fix}")
    if value.startswith("/"):
        try:
            return _abs_path(value)
        except ValueError:
            raise ValueError(f"{show(value)} is not an absolute, normalised path; {fix}") from None
    for pattern in (HTTPS_URL_RE, SSH_URL_RE, SCP_URL_RE):
        match = pattern.fullmatch(value)
        if match and ".." not in (match["path"] or "").split("/"):
            return value
    if scheme and scheme[1] not in ("https", "ssh"):
        raise ValueError(f"{show(value)}: the {scheme[1]}:// scheme is not accepted; {fix}")
    raise ValueError(
        f"{show(value)} is not a git repository address{_first_bad(value, GIT_PATH_CHARS + ':@')}; {fix}"
    )


def _git_ref(value: str) -> str:
    _bounded(value, "git ref", 200)
    if (
        GIT_REF_RE.fullmatch(value)
        and ".." not in value
        and not value.endswith((".lock", "."))
        and "/." not in value
    ):
        return value
    raise ValueError(
        f"{show(value)} is not a git branch, tag or commit{_first_bad(value, 'A-Za-z0-9._+/-')}; "
        "use ASCII letters, digits and ._+-/ (no '..', not starting with '-'), e.g. 'bookworm-6.14'"
    )


def _config_value(value: str) -> str:
    _bounded(value, "kernel config value", 256)
    if not CONFIG_VALUE_RE.fullmatch(value):
        raise ValueError(
            f"{show(value)} is not a kernel config value; write y, m, n, a number or plain text "
            "without quotes, $, backticks, backslashes or ; & | < > ( ) (gpuhost quotes strings)"
        )
    return value


def _config_name(value: str) -> str:
    _bounded(value, "kernel config name", 128)
    if not CONFIG_NAME_RE.fullmatch(value):
        raise ValueError(f"{show(value)} is not a kernel config name; write e.g. 'CONFIG_VFIO_PCI'")
    return value


def _base_config(value: str) -> str:
    if value in BASE_CONFIG_TARGETS:
        return value
    if value.startswith("/"):
        return _abs_path(value)
    raise ValueError(
        f"{show(value)} is not a base config; write one of {', '.join(BASE_CONFIG_TARGETS)} or "
        "the absolute path of a config file, e.g. '/etc/gpuhost/kernel-6.14.config'"
    )


LocalVersion = Annotated[
    str,
    _grammar(
        LOCALVERSION_RE,
        "kernel LOCALVERSION",
        "write what follows X.Y.Z in the release, e.g. '-2-bpo12-pve'",
        "a-z0-9.+-",
        64,
    ),
]
PatchPath = Annotated[str, AfterValidator(_patch_path)]
GitRepo = Annotated[str, AfterValidator(_git_repo)]
GitRef = Annotated[str, AfterValidator(_git_ref)]
ConfigName = Annotated[str, AfterValidator(_config_name)]
ConfigValue = Annotated[str, AfterValidator(_config_value)]
BaseConfig = Annotated[str, AfterValidator(_base_config)]
