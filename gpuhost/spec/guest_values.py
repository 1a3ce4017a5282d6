"""Strict grammars of the guest software's values (apt and package index URLs, service command
words, Python module names), in the style of gpuhost/spec/values.py, whose helpers they use."""

from __future__ import annotations

import re
from typing import Annotated

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import AfterValidator

from gpuhost.redact import mask_secrets, show
from gpuhost.spec.grammar import APT_URL_RE, INDEX_URL_RE, PY_MODULE_RE, SERVICE_ARG_RE
from gpuhost.spec.values import _bounded, _first_bad, _grammar


def _url_without_credentials(value: str, what: str) -> None:
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://[^/]*@", value):
        raise ValueError(
            f"{show(value)} carries credentials; a {what} in the spec may not (they would be "
            "printed and stored); configure them in the guest (netrc, UV_INDEX_* variables)"
        )


def _apt_url(value: str) -> str:
    _bounded(value, "apt repository URL", 1024)
    _url_without_credentials(value, "repository URL")
    if APT_URL_RE.fullmatch(value) and ".." not in value.split("/"):
        return value
    raise ValueError(
        f"{show(value)} is not an apt repository URL{_first_bad(value, 'A-Za-z0-9._~+%/:-')}; "
        "write http(s)://host/path/ or file:/path/, ending with '/', e.g. NVIDIA's "
        "'.../compute/cuda/repos/debian12/x86_64/'"
    )


def _index_url(value: str) -> str:
    _bounded(value, "package index URL", 1024)
    _url_without_credentials(value, "package index URL")
    if INDEX_URL_RE.fullmatch(value) and ".." not in value.split("/"):
        return value
    raise ValueError(
        f"{show(value)} is not a package index URL{_first_bad(value, 'A-Za-z0-9._~+%/:-')}; "
        "write http(s)://host[:port]/path, e.g. 'https://mirror.example/simple'"
    )


AptUrl = Annotated[str, AfterValidator(_apt_url)]
IndexUrl = Annotated[str, AfterValidator(_index_url)]
ServiceArg = Annotated[
    str,
    _grammar(
        SERVICE_ARG_RE,
        "service command word",
        "use A-Za-z0-9_@+=:,./- only, one word per item, e.g. ['vllm', 'serve', '--port=8000']",
        "A-Za-z0-9_@+=:,./-",
    ),
]
PyModule = Annotated[
    str,
    _grammar(
        PY_MODULE_RE, "Python module name", "write e.g. 'torch' or 'flash_attn'", "A-Za-z0-9_.", 128
    ),
]


def _requirement(value: str) -> str:
    _bounded(value, "requirement", 1024)
    if "\n" in value or "\r" in value or not value.isascii() or not value.isprintable():
        raise ValueError(
            f"{show(value)} is not one PEP 508 requirement{_first_bad(value, ' -~')}; give one "
            "requirement per item, e.g. 'torch==2.9.1'"
        )
    try:
        req = Requirement(value)
    except InvalidRequirement as exc:
        reason = mask_secrets(str(exc).splitlines()[0])[:120]
        raise ValueError(
            f"{show(value)} is not a PEP 508 requirement ({reason}); write e.g. 'torch==2.9.1' or "
            "'vllm>=0.11'"
        ) from None
    if req.url and re.match(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@]*@", req.url):
        raise ValueError(
            f"{show(value)} carries credentials in its URL; configure the index credentials on the "
            "guest (uv's UV_INDEX_* or a netrc), not in the spec"
        )
    if any(c in value for c in "$`\\"):
        raise ValueError(
            f"{show(value)} contains shell syntax ($, backticks or backslashes); write a plain "
            "requirement, e.g. 'torch==2.9.1'"
        )
    return value


PipRequirement = Annotated[str, AfterValidator(_requirement)]
