"""A stand-in for NVIDIA's CUDA apt repository: real .debs, a real signed flat repository.

NVIDIA's repository cannot be reached from CI, so tests serve this one instead. What is real:
the repository layout (a flat repository, deb822 `Suites: /`, like NVIDIA's
.../compute/cuda/repos/<distro>/<arch>/), the package names (cuda-toolkit-X-Y depending on
cuda-nvcc-X-Y and cuda-cudart-X-Y), the install prefix /usr/local/cuda-X.Y with bin/nvcc and
version.json, and the `cuda` / `cuda-<major>` alternatives the toolkit registers (priority =
the major version, as NVIDIA's packages do: the newest major wins in auto mode). Release is
signed (InRelease and Release.gpg) with a throwaway key made by gpg, so apt checks a real
signature against the Signed-By key a guest is given. What is not real: nvcc compiles nothing
(it prints `nvcc --version` as NVIDIA's does) and there are no libraries.

    repo = build(Path("/tmp/cuda-repo"), ["12.8", "13.0"])
    with serve(repo.root) as url: ...   # http://127.0.0.1:<port>/
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path

# Stand-in releases: the version NVIDIA's repository carried for each (cuda-toolkit-X-Y).
RELEASES = {"12.8": "12.8.1", "12.9": "12.9.1", "13.0": "13.0.2", "13.1": "13.1.0"}
KEY_UID = "gpuhost twin CUDA stand-in <cuda-repo@twin.invalid>"


@dataclass(frozen=True)
class Repo:
    root: Path  # serve this directory
    key: Path  # the armored public key (what cuda_repo.keyring names)
    versions: tuple[str, ...]


def _nvcc(version: str, release: str) -> str:
    return (
        "#!/bin/sh\n"
        "# gpuhost twin: stand-in nvcc (prints what NVIDIA's prints; compiles nothing)\n"
        'if [ "$1" = "--version" ] || [ "$1" = "-V" ]; then\n'
        "  echo 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
        "  echo 'Copyright (c) 2005-2025 NVIDIA Corporation'\n"
        f"  echo 'Cuda compilation tools, release {version}, V{release}'\n"
        "  exit 0\nfi\n"
        "echo 'nvcc (gpuhost twin stand-in): no compiler here' >&2\nexit 1\n"
    )


def _deb(
    work: Path,
    out: Path,
    name: str,
    version: str,
    fields: dict[str, str],
    files: dict[str, tuple[str, int]],
    scripts: dict[str, str],
) -> Path:
    root = work / name
    (root / "DEBIAN").mkdir(parents=True)
    for rel, (text, mode) in files.items():
        path = root / rel.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
    control = {
        "Package": name,
        "Version": version,
        "Architecture": "amd64",
        "Maintainer": "gpuhost twin <twin@invalid>",
        "Section": "devel",
        "Priority": "optional",
        **fields,
        "Description": f"stand-in for NVIDIA's {name} (gpuhost twin)",
    }
    (root / "DEBIAN/control").write_text("".join(f"{k}: {v}\n" for k, v in control.items()))
    for script, body in scripts.items():
        path = root / "DEBIAN" / script
        path.write_text("#!/bin/sh\nset -e\n" + body)
        path.chmod(0o755)
    deb = out / f"{name}_{version}_amd64.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)],
        check=True,
        capture_output=True,
    )
    return deb


def _toolkit_debs(work: Path, out: Path, cuda: str) -> list[tuple[Path, dict[str, str]]]:
    release = RELEASES[cuda]
    dashed = cuda.replace(".", "-")
    major = cuda.split(".")[0]
    prefix = f"/usr/local/cuda-{cuda}"
    version = f"{release}-1"
    info = json.dumps(
        {
            "cuda": {"name": "CUDA SDK", "version": release},
            "cuda_nvcc": {"name": "CUDA NVCC", "version": release},
        },
        indent=3,
    )
    debs = []
    nvcc = {"Depends": f"cuda-cudart-{dashed} (>= {release})"}
    debs.append(
        (
            _deb(
                work,
                out,
                f"cuda-nvcc-{dashed}",
                version,
                nvcc,
                {f"{prefix}/bin/nvcc": (_nvcc(cuda, release), 0o755)},
                {},
            ),
            nvcc,
        )
    )
    debs.append(
        (
            _deb(
                work,
                out,
                f"cuda-cudart-{dashed}",
                version,
                {},
                {f"{prefix}/version.json": (info + "\n", 0o644)},
                {},
            ),
            {},
        )
    )
    meta = {"Depends": f"cuda-nvcc-{dashed} (>= {release}), cuda-cudart-{dashed} (>= {release})"}
    scripts = {
        "postinst": (
            f"update-alternatives --install /usr/local/cuda cuda {prefix} {major}\n"
            f"update-alternatives --install /usr/local/cuda-{major} cuda-{major} {prefix} {major}\n"
        ),
        "prerm": (
            'if [ "$1" = remove ]; then\n'
            f"  update-alternatives --remove cuda {prefix}\n"
            f"  update-alternatives --remove cuda-{major} {prefix}\nfi\n"
        ),
    }
    debs.append((_deb(work, out, f"cuda-toolkit-{dashed}", version, meta, {}, scripts), meta))
    return debs


def _stanza(deb: Path, fields: dict[str, str]) -> str:
    control = subprocess.run(
        ["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True
    ).stdout.strip()
    data = deb.read_bytes()
    return (
        f"{control}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
        f"MD5sum: {hashlib.md5(data).hexdigest()}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
    )


def _release(root: Path, names: list[str]) -> str:
    lines = [
        "Origin: gpuhost twin",
        "Label: CUDA stand-in",
        "Architectures: amd64",
        f"Date: {formatdate(usegmt=True)}",
        "SHA256:",
    ]
    for name in names:
        data = (root / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    return "\n".join(lines) + "\n"


def _gpg(home: Path, *args: str) -> None:
    subprocess.run(
        [
            "gpg",
            "--homedir",
            str(home),
            "--batch",
            "--yes",
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            *args,
        ],
        check=True,
        capture_output=True,
    )


def build(
    dest: Path, versions: list[str] | tuple[str, ...], cert_digest: str | None = None
) -> Repo:
    """A signed flat repository of stand-in toolkits ``versions`` in ``dest`` (emptied first).

    ``cert_digest`` (e.g. SHA1): the hash of the key's self-signature, gpg's default otherwise;
    NVIDIA's key 3bf863cc is bound by SHA-1, which Debian 13's apt refuses (sqv policy)."""
    shutil.rmtree(dest, ignore_errors=True)
    root = dest / "repo"
    root.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="gpuhost-cudarepo-") as tmp:
        work, home = Path(tmp) / "debs", Path(tmp) / "gnupg"
        home.mkdir(mode=0o700)
        stanzas = []
        for cuda in versions:
            for deb, fields in _toolkit_debs(work, root, cuda):
                stanzas.append(_stanza(deb, fields))
        packages = "\n".join(stanzas)
        (root / "Packages").write_text(packages)
        (root / "Packages.gz").write_bytes(gzip.compress(packages.encode(), mtime=0))
        (root / "Release").write_text(_release(root, ["Packages", "Packages.gz"]))
        digest = ["--cert-digest-algo", cert_digest] if cert_digest else []
        _gpg(home, *digest, "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
        _gpg(home, "--armor", "--output", str(dest / "cuda-stand-in.pub"), "--export", KEY_UID)
        _gpg(home, "--clearsign", "--output", str(root / "InRelease"), str(root / "Release"))
        _gpg(
            home,
            "--armor",
            "--detach-sign",
            "--output",
            str(root / "Release.gpg"),
            str(root / "Release"),
        )
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True)
    return Repo(root, dest / "cuda-stand-in.pub", tuple(versions))


def publish(site: Path, repo: Repo, distro: str) -> str:
    """Lay ``repo`` out in ``site`` where NVIDIA's is (compute/cuda/repos/<distro>/x86_64/);
    returns that path, to append to the URL ``serve(site)`` yields."""
    path = f"compute/cuda/repos/{distro}/x86_64/"
    link = site / path.rstrip("/")
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(repo.root)
    return path


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve(root: Path, address: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``root`` over http on ``address`` (a free port); yields the repository URL.

    Twin guests share the machine's network namespace, so they reach it at this address."""
    handler = functools.partial(_Quiet, directory=os.fspath(root))
    server = http.server.ThreadingHTTPServer((address, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{address}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
