"""Which stored kernel a host installs, and what installing the spec's kernel takes.

A reprovisioned host gets its kernel from the artifact store as the .debs `gpuhost build` made:
only dpkg runs on it, so nothing compiles there. The store may hold a release more than once
(built by another compiler, or from another config); the host takes the one built by the spec's
toolchain.gcc, and refuses to guess between two configs of it.

Reads the store (the control machine's, or a build host's) and the host's facts; runs nothing
on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuhost.build.artifacts import Artifact, ArtifactError, ArtifactKey, StoreReader
from gpuhost.plan.driver.toolchain import ToolchainError, parse_compiler

# Packages of a Proxmox kernel by release (docs/reference/formats.md §6): the image (the -signed build
# provides this name) and the headers NVIDIA modules are built against.
PROXMOX_PACKAGES = ("proxmox-kernel-{release}", "proxmox-headers-{release}")


class KernelStoreError(RuntimeError):
    """No stored kernel, or no single one, the spec's toolchain built."""


@dataclass(frozen=True)
class KernelInstall:
    """How the spec's kernel gets onto the host: ``debs`` (store files, in dpkg's order) or
    ``packages`` (apt, from the host's own sources)."""

    release: str
    source: str  # "build" (store) | "package" (apt)
    packages: tuple[str, ...] = ()
    debs: tuple[str, ...] = ()  # absolute paths on the control machine
    compiler: str = ""  # CONFIG_CC_VERSION_TEXT of the stored build

    def describe(self) -> str:
        if self.source == "package":
            return f"apt: {' '.join(self.packages)}"
        return f"from the store, built by {self.compiler}: " + " ".join(
            d.rsplit("/", 1)[-1] for d in self.debs
        )


def _gcc(text: str) -> str | None:
    try:
        found = parse_compiler(text)
    except ToolchainError:
        return None
    return found.version if found.name == "gcc" else None


def stored_key(store: StoreReader, release: str, gcc: str) -> ArtifactKey:
    """The key of the one stored build of ``release`` by GCC ``gcc`` (X.Y.Z), from the store's
    manifests alone (nothing is fetched: the run's preconditions read it while planning)."""
    keys = store.keys("kernel", release, release)
    if not keys:
        raise KernelStoreError(
            f"kernel {release} is not in the artifact store {store.root}; build it once with "
            "`gpuhost build <inventory>` (kernel.source: build), or copy a store that has it"
        )
    ours = [k for k in keys if _gcc(k.compiler) == gcc]
    if not ours:
        others = ", ".join(sorted({k.compiler for k in keys}))
        raise KernelStoreError(
            f"the artifact store {store.root} has kernel {release} only as built by {others}, "
            f"not by gcc {gcc} (toolchain.gcc); build it with gcc {gcc}, or set toolchain.gcc "
            "to the compiler that built it"
        )
    if len(ours) > 1:
        configs = ", ".join(k.config for k in ours)
        raise KernelStoreError(
            f"the artifact store {store.root} has kernel {release} by gcc {gcc} from "
            f"{len(ours)} configs ({configs}); remove the ones this host must not get"
        )
    return ours[0]


def stored_kernel(store: StoreReader, release: str, gcc: str) -> Artifact:
    """The stored build of ``release`` by GCC ``gcc`` (X.Y.Z), verified file by file."""
    key = stored_key(store, release, gcc)
    try:
        artifact = store.get(key)
    except ArtifactError as exc:
        raise KernelStoreError(str(exc)) from None
    assert artifact is not None  # its manifest was just listed
    return artifact


# The image package's name: `make bindeb-pkg`'s, or pve-kernel's (debian/rules PMX_KERNEL_PKG).
IMAGE_PREFIXES = ("linux-image-", "proxmox-kernel-")


def _debs(artifact: Artifact) -> tuple[str, ...]:
    """The image before the headers (the headers package does not depend on it, but a reader
    of dpkg's output expects the kernel first)."""
    names = sorted(n for n in artifact.files if n.endswith(".deb"))
    names.sort(key=lambda n: not n.startswith(IMAGE_PREFIXES))
    if not any(n.startswith(IMAGE_PREFIXES) for n in names):
        raise KernelStoreError(
            f"{artifact.directory} holds no kernel image .deb (linux-image-* or proxmox-kernel-*; "
            f"it has {', '.join(names) or 'no .debs'}); remove it and build again"
        )
    return tuple(str(artifact.file(n)) for n in names)


def plan_install(release: str, source: str, gcc: str, store: StoreReader | None) -> KernelInstall:
    """What installing ``release`` takes (raises KernelStoreError when the store cannot say)."""
    if source == "package":
        packages = tuple(p.format(release=release) for p in PROXMOX_PACKAGES)
        return KernelInstall(release, source, packages=packages)
    if store is None:
        raise KernelStoreError("kernel.source is 'build' but no artifact store is configured")
    artifact = stored_kernel(store, release, gcc)
    key: ArtifactKey = artifact.key
    return KernelInstall(release, source, debs=_debs(artifact), compiler=key.compiler)


def installed_problem(release: str, compiler: str | None, gcc: str) -> str | None:
    """Why an installed ``release`` (its CONFIG_CC_VERSION_TEXT ``compiler``) is not the spec's
    kernel: built by another GCC than toolchain.gcc. None when it is fine or unknown."""
    if not compiler:
        return None
    found = _gcc(compiler)
    if found == gcc:
        return None
    return (
        f"kernel {release} is installed but was built by {compiler!r}, not gcc {gcc} "
        "(toolchain.gcc): modules built for it with gcc "
        f"{gcc} would not match. Remove that kernel package, or set toolchain.gcc to its compiler"
    )
