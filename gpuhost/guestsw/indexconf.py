"""The package indexes this control machine is configured with, to hand to uv in guests.

A guest gets the indexes the operator already uses (no index host is written into gpuhost):
uv's own settings first (UV_DEFAULT_INDEX / UV_INDEX_URL, UV_INDEX / UV_EXTRA_INDEX_URL, then
uv.toml), else pip's (PIP_INDEX_URL / PIP_EXTRA_INDEX_URL, then pip.conf). Only http(s) URLs
without credentials travel: a file: index names a directory of this machine, not of the guest,
and credentials belong in the guest's own configuration. What was left out is reported.
"""

from __future__ import annotations

import configparser
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from gpuhost.redact import mask_secrets
from gpuhost.spec.grammar import INDEX_URL_RE


@dataclass(frozen=True)
class IndexConfig:
    default: str | None = None  # None: uv's built-in default index
    extra: tuple[str, ...] = ()
    skipped: tuple[str, ...] = field(default=())  # "url (why)", secrets masked
    source: str = "none"
    cert: str | None = None  # CA bundle pip/uv verify the indexes with (pip's cert, SSL_CERT_FILE)


def _split(value: str | None) -> list[str]:
    return value.split() if value else []


def _pip_files(env: dict[str, str], home: Path) -> list[Path]:
    if env.get("PIP_CONFIG_FILE"):
        return [Path(env["PIP_CONFIG_FILE"])]
    xdg = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    # pip's order: global, then user (later files win)
    return [Path("/etc/pip.conf"), home / ".pip/pip.conf", xdg / "pip/pip.conf"]


def _uv_files(env: dict[str, str], home: Path) -> list[Path]:
    if env.get("UV_CONFIG_FILE"):
        return [Path(env["UV_CONFIG_FILE"])]
    xdg = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    return [Path("/etc/uv/uv.toml"), xdg / "uv/uv.toml"]


def _from_uv_toml(paths: list[Path]) -> tuple[str | None, list[str]]:
    default, extra = None, []
    for path in paths:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            continue
        pip = data.get("pip", {}) if isinstance(data.get("pip"), dict) else {}
        for table in (data, pip):
            if isinstance(table.get("index-url"), str):
                default = table["index-url"]
            extra += [u for u in table.get("extra-index-url", []) if isinstance(u, str)]
        for index in data.get("index", []) if isinstance(data.get("index"), list) else []:
            if isinstance(index, dict) and isinstance(index.get("url"), str):
                if index.get("default"):
                    default = index["url"]
                else:
                    extra.append(index["url"])
    return default, extra


def _from_pip_conf(paths: list[Path]) -> tuple[str | None, list[str]]:
    default, extra = None, []
    for path in paths:
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except (OSError, configparser.Error):
            continue
        for section in ("global", "install"):
            if parser.has_option(section, "index-url"):
                default = parser.get(section, "index-url").strip()
            if parser.has_option(section, "extra-index-url"):
                extra += _split(parser.get(section, "extra-index-url"))
    return default, extra


def _cert(env: dict[str, str], home: Path) -> str | None:
    """The CA bundle this machine's uv/pip trust for their indexes: SSL_CERT_FILE, PIP_CERT,
    pip.conf's cert (a proxy's CA that a guest's own store lacks travels with the indexes)."""
    cert = env.get("SSL_CERT_FILE") or env.get("PIP_CERT")
    for path in _pip_files(env, home):
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except (OSError, configparser.Error):
            continue
        if not cert and parser.has_option("global", "cert"):
            cert = parser.get("global", "cert").strip()
    return cert or None


def control_indexes(env: dict[str, str] | None = None, home: Path | None = None) -> IndexConfig:
    """The indexes uv in a guest should use, from this machine's uv or pip configuration."""
    env = dict(os.environ) if env is None else env
    home = Path.home() if home is None else home
    cert = _cert(env, home)
    default = env.get("UV_DEFAULT_INDEX") or env.get("UV_INDEX_URL")
    extra = _split(env.get("UV_INDEX")) + _split(env.get("UV_EXTRA_INDEX_URL"))
    source = "uv environment"
    if not default and not extra:
        default, extra = _from_uv_toml(_uv_files(env, home))
        source = "uv.toml"
    if not default and not extra:
        default = env.get("PIP_INDEX_URL")
        extra = _split(env.get("PIP_EXTRA_INDEX_URL"))
        source = "pip environment"
    if not default and not extra:
        default, extra = _from_pip_conf(_pip_files(env, home))
        source = "pip.conf"
    if not default and not extra:
        return IndexConfig(cert=cert)
    skipped: list[str] = []

    def usable(url: str | None) -> str | None:
        if url is None:
            return None
        if "://" in url and "@" in url.split("/", 3)[2]:
            skipped.append(f"{mask_secrets(url)} (credentials: configure them in the guest)")
            return None
        if not INDEX_URL_RE.fullmatch(url.rstrip("/")):
            skipped.append(f"{mask_secrets(url)} (not an http(s) index a guest can reach)")
            return None
        return url

    kept = tuple(u for u in (usable(u) for u in extra) if u)
    return IndexConfig(usable(default), kept, tuple(skipped), source, cert)
