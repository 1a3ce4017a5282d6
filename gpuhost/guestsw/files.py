"""The text of the files a guest's software plan manages: environment files for shells and for
systemd, uv's index settings, the deb822 source of NVIDIA's repository, a venv's service unit.
Every value here passed the spec's grammars (no quotes, $, backticks or backslashes)."""

from __future__ import annotations

from gpuhost.guestsw.indexconf import IndexConfig
from gpuhost.spec.guests import Venv

HEADER = "# Managed by gpuhost ({what}); changes are overwritten by the next deploy.\n"


def shell_env(env: dict[str, str], what: str, path_prefix: str | None = None) -> str:
    # values passed the env grammar: no quotes, $, backticks or backslashes
    lines = [HEADER.format(what=what)]
    lines += [f"export {k}='{v}'\n" for k, v in sorted(env.items())]
    if path_prefix:
        lines.append(f'export PATH="{path_prefix}/bin:$PATH"\n')
    return "".join(lines)


def env_file(env: dict[str, str], what: str) -> str:
    return HEADER.format(what=what) + "".join(f"{k}={v}\n" for k, v in sorted(env.items()))


def uv_toml(indexes: IndexConfig) -> str:
    # extra indexes first: uv takes a package from the first index that has it, and the
    # default index comes last, as with pip's --extra-index-url
    out = HEADER.format(what=f"package indexes from the control machine's {indexes.source}")
    for url in indexes.extra:
        out += f'\n[[index]]\nurl = "{url}"\n'
    if indexes.default:
        out += f'\n[[index]]\nurl = "{indexes.default}"\ndefault = true\n'
    return out


def sources(url: str, keyring: str) -> str:
    return (
        HEADER.format(what="NVIDIA's CUDA repository, from the spec's cuda_repo")
        + f"Types: deb\nURIs: {url}\nSuites: /\nSigned-By: {keyring}\n"
    )


def unit(venv: Venv, env_file: str) -> str:
    assert venv.service is not None
    words = list(venv.service.command)
    if "/" not in words[0]:
        words[0] = f"{venv.path}/bin/{words[0]}"
    return (
        HEADER.format(what=f"service of the venv {venv.path}")
        + f"[Unit]\nDescription=gpuhost: {venv.service.name} ({venv.path})\n"
        "After=network-online.target\n\n"
        f"[Service]\nEnvironmentFile={env_file}\nExecStart={' '.join(words)}\n"
        "Restart=on-failure\n\n[Install]\nWantedBy=multi-user.target\n"
    )
