"""Grammars for inventory values, and the pydantic types that enforce them.

Inventory values are untrusted text: every value that reaches a shell, a file a shell sources
(/etc/default/grub), a unit or env file or a guest config passes a strict grammar here, matched
against the WHOLE string (``re.fullmatch``: ``$`` would accept a trailing newline), ASCII only
(Unicode lookalikes and digits are refused). Deploys still quote what they write.
"""

from __future__ import annotations

import re

# --- grammars (one place; docs/reference/inventory.md and tests refer to them) -------------------------------------

BDF_RE = re.compile(
    r"(?:(?P<domain>[0-9a-fA-F]{4}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-1][0-9a-fA-F])\.(?P<fn>[0-7])"
)
KERNEL_RE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+-[0-9]+(?:-bpo[0-9]+)?(?:-[a-z0-9]+)*-pve")
DRIVER_RE = re.compile(r"[0-9]{3}\.[0-9]{2,3}(?:\.[0-9]{2,3})?")
GCC_RE = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}")
CUDA_RE = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}")
PYTHON_RE = re.compile(r"3\.[0-9]{1,2}(?:\.[0-9]{1,3})?")
# A kernel parameter: name[=value]. The name is [A-Za-z0-9_.-] and starts with a letter, digit
# or '_' (so '--', the init separator, is not one); the value is printable non-space ASCII
# without quotes, $, backticks, backslashes, ; & | < > ( ) or # (shell and comment syntax).
CMDLINE_VALUE_CHARS = r"!%*+,\-./0-9:=?@A-Z\[\]^_a-z{}~"
CMDLINE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
CMDLINE_RE = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.-]*(?:=[{CMDLINE_VALUE_CHARS}]*)?")
# A DNS name of lowercase labels (service and node names).
DNS_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
DNS_NAME_RE = re.compile(rf"{DNS_LABEL}(?:\.{DNS_LABEL})*")
# A guest name (VM name, container hostname): Proxmox's `dns-name` format (pve-common
# src/PVE/JSONSchema.pm, pve_verify_dns_name: labels of a-zA-Z0-9 and inner '-', joined by
# dots), upper case included; labels kept to DNS's 63. Compared case-insensitively for clashes.
GUEST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
GUEST_NAME_RE = re.compile(rf"{GUEST_LABEL}(?:\.{GUEST_LABEL})*")
HOSTNAME_RE = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
MODULE_RE = re.compile(r"[a-z0-9_]+")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Environment values end up in systemd Environment= lines, env files and LXC config lines:
# printable ASCII (space included, not at either end), without quotes, backslashes, $, backticks
# or % (a systemd specifier); no newline, NUL or other control character.
ENV_VALUE_NS = r"!#&()*+,\-./0-9:;<=>?@A-Z\[\]^_a-z{|}~"
ENV_VALUE_CHARS = " " + ENV_VALUE_NS
ENV_VALUE_RE = re.compile(rf"(?:[{ENV_VALUE_NS}](?:[{ENV_VALUE_CHARS}]*[{ENV_VALUE_NS}])?)?")
# Paths: absolute, normalised, components of ASCII letters, digits and ._+@- (not '.' or '..').
PATH_COMPONENT = r"(?!\.\.?(?:/|$))[A-Za-z0-9._+@-]+"
ABS_PATH_RE = re.compile(rf"(?:/{PATH_COMPONENT})+")
REL_PATH_RE = re.compile(rf"{PATH_COMPONENT}(?:/{PATH_COMPONENT})*")
# A GPU model as nvidia-smi names it ("NVIDIA H200", "NVIDIA RTX PRO 6000 Blackwell Workstation
# Edition"): letters, digits, space, . _ ( ) / - ; no space at either end.
GPU_MODEL_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9 ._()/-]{0,94}[A-Za-z0-9)])?")
# A `nvidia-smi topo -m` link class between two GPUs.
LINK_RE = re.compile(r"NV[0-9]{1,3}|PIX|PXB|PHB|NODE|SYS")
MACHINE_RE = re.compile(r"q35|pc|pc-(?:q35|i440fx)-[0-9]{1,2}\.[0-9]{1,2}(?:\+pve[0-9]{1,3})?")


def machine_is_q35(machine: str | None) -> bool:
    """Whether a VM's `machine` value (spec or qemu-server config: `[type=]<type>[,viommu=..]`)
    is q35, the one rule for GPU passthrough. qemu-server's machine_type_is_q35
    (src/PVE/QemuServer/Machine.pm): no machine -> the default i440fx; the base type is q35
    when the type contains 'q35'. Its parse_hostpci_devices (QemuServer/PCI.pm) refuses
    `pcie=1`, which gpuhost's hostpci entries carry, on any other: "q35 machine model is not
    enabled"."""
    if not machine:
        return False
    kind = machine.split(",", 1)[0].strip()
    return "q35" in kind.removeprefix("type=")


Q35_FIX = "set machine: q35 for it in the inventory"
GIT_REF_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*(?:/[A-Za-z0-9_][A-Za-z0-9._+-]*)*")
GIT_PATH_CHARS = r"A-Za-z0-9._~+%/-"
HTTPS_URL_RE = re.compile(
    rf"https://(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{{1,5}})?(?P<path>/[{GIT_PATH_CHARS}]*)?"
)
SSH_URL_RE = re.compile(
    rf"ssh://(?:(?P<user>[a-z_][a-z0-9_.-]{{0,31}})@)?(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])"
    rf"(?::[0-9]{{1,5}})?(?P<path>/[{GIT_PATH_CHARS}]*)?"
)
SCP_URL_RE = re.compile(
    rf"(?P<user>[a-z_][a-z0-9_.-]{{0,31}})@(?P<host>[A-Za-z0-9.-]+):(?P<path>[A-Za-z0-9._~+%/][{GIT_PATH_CHARS}]*)"
)
CONFIG_NAME_RE = re.compile(r"CONFIG_[A-Z0-9_]+")
# LOCALVERSION: what the kernel appends to X.Y.Z (it reaches make's command line and the
# packages' names, so the release's own characters only).
LOCALVERSION_RE = re.compile(r"[-.+][a-z0-9]+(?:[-.+][a-z0-9]+)*")
BASE_CONFIG_TARGETS = ("tinyconfig", "defconfig", "allnoconfig")
CONFIG_VALUE_RE = re.compile(
    rf"[ymn]|-?[0-9]+|0x[0-9a-fA-F]+|[{CMDLINE_VALUE_CHARS}](?:[ {CMDLINE_VALUE_CHARS}]*[{CMDLINE_VALUE_CHARS}])?"
)
ACS_TOKEN_RE = re.compile(r"downstream|multifunction|id:[0-9a-fA-F]{4}:[0-9a-fA-F]{4}")
ACS_MAX_IDS = 16  # NUM_ACS_IDS in the Proxmox kernel's ACS override patch

# Parameters gpuhost owns on the kernel command line: the field that sets each one instead.
MANAGED_CMDLINE_KEYS = {
    "intel_iommu": "boot.iommu",
    "amd_iommu": "boot.iommu",
    "iommu": "boot.iommu_passthrough (iommu=pt)",
    "iommu.passthrough": "boot.iommu_passthrough",
    "iommu.strict": "boot.iommu_passthrough (gpuhost owns the IOMMU mode)",
    "pcie_acs_override": "boot.acs_override",
}
# `pci=` is a comma list of independent options, and the kernel parses every occurrence
# (drivers/pci/pci.c pci_setup, an early_param; init/main.c do_early_param runs it for each):
# gpuhost owns only its realloc option (boot.pci_realloc), a user's pci=noaer is theirs.
PCI_OWNED_OPTION = "realloc"
# Minimum driver branch for each CUDA major.minor a guest may ask for (NVIDIA's compatibility
# table: CUDA 12.8 needs >= 570, CUDA 13.x needs >= 580).
CUDA_MIN_DRIVER = {"12.8": 570, "12.9": 575, "13.0": 580, "13.1": 580}
# Guest software (gpuhost/guestsw/plan.py). An apt repository: http(s)://host[:port]/path/ or
# file:/abs/path/, ending with '/' (NVIDIA's CUDA repositories are flat: `Suites: /`).
APT_URL_RE = re.compile(
    rf"(?:https?://(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{{1,5}})?|file:)"
    rf"(?P<path>/(?:[{GIT_PATH_CHARS}]*/)?)"
)
# A package index for uv in a guest: http(s)://host[:port]/path (no file: URLs, which would name
# the control machine's disk; no credentials: configure those in the guest).
INDEX_URL_RE = re.compile(
    rf"https?://(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{{1,5}})?(?:/[{GIT_PATH_CHARS}]*)?"
)
# One word of a service's command line (systemd ExecStart=): no space, quotes, backslashes,
# $, %, backticks or shell syntax, so it needs no quoting in a unit file.
SERVICE_ARG_RE = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
# node_exporter's --web.listen-address (monitoring.listen_address): host:port, [v6]:port, :port.
LISTEN_RE = re.compile(r"(?P<host>[A-Za-z0-9.-]*|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")
PY_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
MAX_TEXT = 4096  # no spec string is longer (bounds messages and regex work)


# One line per grammar, for docs/reference/inventory.md (python -m gpuhost.docs). Every match
# is against the whole string; all grammars are ASCII.
GRAMMARS = {
    "kernel release (kernel.version, kernel.keep)": "X.Y.Z-N[-bpoN][-word...]-pve, as `uname -r` "
    "prints Proxmox kernels, e.g. 6.14.8-2-bpo12-pve",
    "driver version": "NNN.NN or NNN.NN.NN (2-3 digits after each dot), e.g. 595.71.05",
    "GCC version": "X.Y.Z, e.g. 12.2.0",
    "CUDA version": "X.Y, one of " + ", ".join(CUDA_MIN_DRIVER),
    "Python version (venvs[].python)": "3.X or 3.X.Y",
    "kernel parameter (boot.extra)": "name[=value]; name of A-Za-z0-9_.- starting with a letter, "
    "digit or _; value of printable ASCII without space, quotes, $, backticks, backslashes, "
    "; & | < > ( ) or #; managed names (compared with - = _) are refused, and pci= only "
    "with a realloc option",
    "pcie_acs_override": "comma-separated downstream, multifunction, id:vvvv:dddd (hex, at most "
    f"{ACS_MAX_IDS} ids), each once",
    "guest name": "DNS name as Proxmox takes it: labels of A-Za-z0-9- (no - at either end, 1-63 "
    "characters) joined by dots, at most 253 characters; names differing only in case clash",
    "host name (access.ssh_hostname)": "DNS name (letters, digits, -, dots) or an IPv4/IPv6 "
    "address (no scope id)",
    "user name (access.ssh_user)": "[a-z_][a-z0-9_-], at most 32 characters",
    "PCI address (gpus)": "[dddd:]bb:dd.f in hex, any case; stored as 0000:41:00.0",
    "GPU index (gpus)": "an int 0-1023 (not a bool, float or string)",
    "path (venvs[].path)": "absolute and normalised: /component/..., components of A-Za-z0-9._+@- "
    "that are not . or ..; no //, no trailing /",
    "patch path (kernel.build.patches)": "relative to files/, normalised like a path, no leading /",
    "module name (modules.vfio_modules)": "[a-z0-9_]+",
    "environment variable name": "[A-Za-z_][A-Za-z0-9_]*, at most 128 characters",
    "environment value": "printable ASCII without quotes, backslashes, $, backticks, % or control "
    "characters, no space at either end, at most 4096 characters (systemd Environment=, env "
    "files and LXC config lines)",
    "GPU model (hardware.gpu_model)": "as nvidia-smi names it, e.g. 'NVIDIA H200': letters, "
    "digits, space and . _ ( ) / -, at most 96 characters",
    "link class (p2p.link)": "a `nvidia-smi topo -m` class: NV<n>, PIX, PXB, PHB, NODE or SYS",
    "machine type (machine)": "q35, pc-q35-X.Y or pc-q35-X.Y+pveN (pc, pc-i440fx-X.Y only "
    "without GPUs)",
    "git repository (kernel.build.repo)": "https://host[:port]/path, ssh://[user@]host[:port]/path, "
    "user@host:path or an absolute path; no credentials, no .. components",
    "git ref (kernel.build.ref)": "A-Za-z0-9._+- components joined by /, no .., not starting "
    "with - or ., not ending with . or .lock",
    "kernel config (kernel.build.config)": "names CONFIG_[A-Z0-9_]+; values y, m, n, an integer, "
    "0xHEX or text of the kernel-parameter value characters plus inner spaces",
    "base config (kernel.build.base_config)": "one of "
    + ", ".join(BASE_CONFIG_TARGETS)
    + " (make targets), or an absolute, normalised path of a config file on the build machine",
    "LOCALVERSION (kernel.build.localversion)": "starts with - . or +, then a-z0-9 words joined "
    "by - . or +, at most 64 characters, e.g. -2-bpo12-pve",
    "store path (artifacts.store)": "absolute and normalised, like a path",
    "requirement (venvs[].packages, constraints)": "one PEP 508 requirement (packaging's parser), "
    "no credentials in a URL, no $, backticks or backslashes",
    "apt repository (cuda_repo.url)": "http(s)://host[:port]/path/ or file:/path/, ending with /, "
    "path characters A-Za-z0-9._~+%/-; no credentials",
    "package index (python_index)": "http(s)://host[:port]/path, no credentials",
    "service command word (venvs[].service.command)": "A-Za-z0-9_@+=:,./- (no spaces, quotes, $, "
    "%, backslashes), at most 256 characters",
    "Python module (venvs[].imports)": "dotted identifiers, e.g. torch or flash_attn.ops",
    "listen address (monitoring.listen_address)": "host:port, [IPv6]:port or :port (every "
    "address); host a lower-case DNS name or IPv4 address, port 1-65535",
    "types": "strict: ints are ints (True, 1.0 and '200' are not), bools are True/False, "
    "strings are strings, lists are lists",
}
