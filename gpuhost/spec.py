"""The host spec: what an inventory says a Proxmox GPU host must be (pydantic v2).

Every field has a default or is required, and a description; README's inventory reference is
generated from these models (tests fail when it drifts). Validation is pure: no host is
contacted. Checks that need the live hardware (unknown BDF, IOMMU groups) live in the planner.

Inventory values are untrusted text: every value that reaches a shell, a file a shell sources
(/etc/default/grub), a unit or env file or a guest config passes a strict grammar here, matched
against the WHOLE string (``re.fullmatch``: ``$`` would accept a trailing newline), ASCII only
(Unicode lookalikes and digits are refused), with strict types (``True`` is not a GPU index,
``"200"`` is not a ctid, ``1.0`` is not an int). Deploys still quote what they write.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

# --- grammars (one place; README and tests refer to them) -------------------------------------

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
# A DNS name of lowercase labels (Proxmox guest names and container hostnames are DNS names;
# lowercase so that 'CT200' and 'ct200' cannot both exist).
DNS_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
DNS_NAME_RE = re.compile(rf"{DNS_LABEL}(?:\.{DNS_LABEL})*")
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
MACHINE_RE = re.compile(r"q35|pc|pc-(?:q35|i440fx)-[0-9]{1,2}\.[0-9]{1,2}(?:\+pve[0-9]{1,3})?")
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
    "pci": "boot.pci_realloc",
}
# Minimum driver branch for each CUDA major.minor a guest may ask for (NVIDIA's compatibility
# table: CUDA 12.8 needs >= 570, CUDA 13.x needs >= 580).
CUDA_MIN_DRIVER = {"12.8": 570, "12.9": 575, "13.0": 580, "13.1": 580}
SECRET_WORDS = re.compile(r"token|passw|secret|credential|api_?key|private", re.IGNORECASE)
URL_USERINFO_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]{0,15}://)[^/@\s]*@")
MAX_TEXT = 4096  # no spec string is longer (bounds messages and regex work)
MAX_SHOWN = 60  # characters of a value shown in a message


# One line per grammar, for README's inventory reference (python -m gpuhost.docs). Every match
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
    "; & | < > ( ) or #; managed names (compared with - = _) are refused",
    "pcie_acs_override": "comma-separated downstream, multifunction, id:vvvv:dddd (hex, at most "
    f"{ACS_MAX_IDS} ids), each once",
    "guest name": "lowercase DNS name: labels of a-z0-9- (no - at either end, 1-63 characters) "
    "joined by dots, at most 253 characters",
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
    "machine type (machine)": "q35, pc-q35-X.Y or pc-q35-X.Y+pveN (pc, pc-i440fx-X.Y only "
    "without GPUs)",
    "git repository (kernel.build.repo)": "https://host[:port]/path, ssh://[user@]host[:port]/path, "
    "user@host:path or an absolute path; no credentials, no .. components",
    "git ref (kernel.build.ref)": "A-Za-z0-9._+- components joined by /, no .., not starting "
    "with - or ., not ending with . or .lock",
    "kernel config (kernel.build.config)": "names CONFIG_[A-Z0-9_]+; values y, m, n, an integer, "
    "0xHEX or text of the kernel-parameter value characters plus inner spaces",
    "requirement (venvs[].packages, constraints)": "one PEP 508 requirement (packaging's parser), "
    "no credentials in a URL, no $, backticks or backslashes",
    "types": "strict: ints are ints (True, 1.0 and '200' are not), bools are True/False, "
    "strings are strings, lists are lists",
}


def mask_secrets(text: str) -> str:
    """Credentials inside URLs -> '***': 'https://u:p@host/x' -> 'https://***@host/x'."""
    return URL_USERINFO_RE.sub(lambda m: f"{m['scheme']}***@", text)


def is_secret_name(name: object) -> bool:
    return isinstance(name, str) and bool(SECRET_WORDS.search(name))


def show(value: object, limit: int = MAX_SHOWN) -> str:
    """A bounded, secret-free repr of ``value`` for messages."""
    if isinstance(value, str):
        text = mask_secrets(value)
        if len(text) <= limit:
            return repr(text)
        return f"{text[:limit]!r}... ({len(value)} characters)"
    if isinstance(value, dict):
        items = list(value.items())
        parts = [
            f"{show(k, 30)}: {'***' if is_secret_name(k) else show(v, 30)}" for k, v in items[:4]
        ]
        more = f", ... ({len(items)} items)" if len(items) > 4 else ""
        return "{" + ", ".join(parts) + more + "}"
    if isinstance(value, list | tuple):
        parts = [show(v, 30) for v in value[:4]]
        more = f", ... ({len(value)} items)" if len(value) > 4 else ""
        text = ", ".join(parts) + more
        return f"[{text}]" if isinstance(value, list) else f"({text})"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({type(value).__name__})"


def _describe_char(ch: str) -> str:
    names = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL byte"}
    if ch in names:
        return names[ch]
    if ch == " ":
        return "a space"
    if not ch.isascii():
        return f"the non-ASCII character {ch!r} (U+{ord(ch):04X})"
    if not ch.isprintable():
        return f"the control character U+{ord(ch):04X}"
    return repr(ch)


def _first_bad(value: str, allowed: str, offset: int = 0) -> str:
    """' (it contains X at position N)' for the first character outside the class ``allowed``."""
    match = re.search(f"[^{allowed}]", value)
    if match is None:
        return ""
    return f" (it contains {_describe_char(match[0])} at position {offset + match.start()})"


def _bounded(value: str, what: str, limit: int = MAX_TEXT) -> None:
    if len(value) > limit:
        raise ValueError(f"a {what} of {len(value)} characters is too long (at most {limit})")


def _grammar(pattern: re.Pattern[str], what: str, fix: str, allowed: str, limit: int = 256):
    """An after-validator: the whole string must match ``pattern``."""

    def check(value: str) -> str:
        _bounded(value, what, limit)
        if not pattern.fullmatch(value):
            raise ValueError(f"{show(value)} is not a {what}{_first_bad(value, allowed)}; {fix}")
        return value

    return AfterValidator(check)


# --- value types ---------------------------------------------------------------------------------

KernelRelease = Annotated[
    str,
    _grammar(
        KERNEL_RE,
        "Proxmox kernel release",
        "write it as `uname -r` prints it, e.g. '6.14.8-2-bpo12-pve' or '6.8.12-9-pve'",
        "0-9a-z.-",
        64,
    ),
]
DriverVersion = Annotated[
    str,
    _grammar(DRIVER_RE, "NVIDIA driver version", "write NNN.NN[.NN], e.g. '595.71.05'", "0-9.", 16),
]
GccVersion = Annotated[
    str, _grammar(GCC_RE, "GCC version", "write X.Y.Z, e.g. '12.2.0'", "0-9.", 16)
]


def _cuda_known(value: str) -> str:
    if value not in CUDA_MIN_DRIVER:
        raise ValueError(
            f"CUDA {value} is not supported by gpuhost; choose one of {', '.join(CUDA_MIN_DRIVER)}"
        )
    return value


CudaVersion = Annotated[
    str,
    _grammar(CUDA_RE, "CUDA version", "write major.minor, e.g. '12.8'", "0-9.", 8),
    AfterValidator(_cuda_known),
]
PythonVersion = Annotated[
    str, _grammar(PYTHON_RE, "Python version", "write 3.X or 3.X.Y, e.g. '3.12'", "0-9.", 12)
]
ModuleName = Annotated[
    str,
    _grammar(
        MODULE_RE,
        "kernel module name",
        "use lowercase letters, digits and '_' (e.g. 'vfio_pci', not 'vfio-pci')",
        "a-z0-9_",
        64,
    ),
]
MachineType = Annotated[
    str,
    _grammar(
        MACHINE_RE,
        "QEMU machine type",
        "write 'q35', 'pc-q35-X.Y' or 'pc-q35-X.Y+pveN' (or 'pc'/'pc-i440fx-X.Y' for a VM "
        "without GPUs)",
        "a-z0-9.+-",
        32,
    ),
]
Username = Annotated[
    str,
    _grammar(
        USER_RE,
        "user name",
        "use lowercase letters, digits, '_' and '-', e.g. 'root'",
        "a-z0-9_-",
        32,
    ),
]


def _dns_name(value: str) -> str:
    _bounded(value, "name", 253)
    if DNS_NAME_RE.fullmatch(value):
        return value
    if DNS_NAME_RE.fullmatch(value.lower()):
        raise ValueError(
            f"{show(value)} is not a valid guest name; names are lowercase DNS names: "
            f"write {value.lower()!r}"
        )
    raise ValueError(
        f"{show(value)} is not a valid guest name{_first_bad(value, 'a-z0-9.-')}; use a DNS name: "
        "lowercase letters, digits and '-' (not at either end), labels of up to 63 separated by '.'"
    )


def _hostname(value: str) -> str:
    _bounded(value, "host name", 253)
    if HOSTNAME_RE.fullmatch(value):
        return value
    if re.fullmatch(r"[0-9A-Fa-f:.]+", value):
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            pass
    raise ValueError(
        f"{show(value)} is not a host name or IP address{_first_bad(value, 'A-Za-z0-9.:-')}; "
        "write e.g. 'ct200.lan' or '10.0.0.20'"
    )


def _abs_path(value: str) -> str:
    _bounded(value, "path", 1024)
    if ABS_PATH_RE.fullmatch(value):
        return value
    if not value.startswith("/"):
        why = "it is not absolute"
    elif "//" in value:
        why = "it contains '//'"
    elif value.endswith("/"):
        why = "it ends with '/'"
    elif re.search(r"(^|/)\.\.?(/|$)", value):
        why = "it contains a '.' or '..' component"
    else:
        why = _first_bad(value, "A-Za-z0-9._+@/-").strip(" ()") or "not a path"
    raise ValueError(
        f"{show(value)} is not an absolute, normalised path ({why}); write e.g. '/opt/venvs/vllm' "
        "(ASCII letters, digits and ._+@- in each component)"
    )


def _patch_path(value: str) -> str:
    _bounded(value, "path", 1024)
    if REL_PATH_RE.fullmatch(value) and ".." not in value.split("/"):
        return value
    raise ValueError(
        f"{show(value)} is not a normalised path relative to files/ (no leading '/', no '.' or "
        "'..' components, no '//' or trailing '/', ASCII letters, digits and ._+@-); write e.g. "
        "'patches/acs-override.patch'"
    )


def _env_value(value: str) -> str:
    # never echo the value: environments carry tokens
    _bounded(value, "environment value")
    if ENV_VALUE_RE.fullmatch(value):
        return value
    why = _first_bad(value, ENV_VALUE_CHARS).strip(" ()") or "it starts or ends with a space"
    raise ValueError(
        f"not a valid environment value ({why}); values are printable ASCII without quotes, "
        "backslashes, '$', backticks, '%' or control characters (they are written into systemd "
        "Environment= lines, env files and LXC config lines)"
    )


def _env_name(value: str) -> str:
    _bounded(value, "environment variable name", 128)
    if not ENV_NAME_RE.fullmatch(value):
        raise ValueError(
            f"{show(value)} is not an environment variable name"
            f"{_first_bad(value, 'A-Za-z0-9_')}; use letters, digits and '_', not starting with a "
            "digit, e.g. 'NCCL_P2P_DISABLE'"
        )
    return value


def _kernel_param(value: str) -> str:
    _bounded(value, "kernel parameter", 1024)
    if not CMDLINE_RE.fullmatch(value):
        name = value.split("=", 1)[0]
        if CMDLINE_NAME_RE.fullmatch(name):
            bad = _first_bad(value[len(name) + 1 :], CMDLINE_VALUE_CHARS, len(name) + 1)
        else:
            bad = _first_bad(name, "A-Za-z0-9_.-") or " (the name must not start with '.' or '-')"
        raise ValueError(
            f"{show(value)} is not one kernel parameter{bad}; write name[=value] with a name of "
            "[A-Za-z0-9_.-] and a value of printable ASCII without spaces, quotes, $, backticks, "
            "backslashes, ; & | < > ( ) or # (one parameter per item)"
        )
    key = cmdline_key(value)
    if key in MANAGED_CMDLINE_KEYS:
        raise ValueError(
            f"{show(value)} is managed by gpuhost; use {MANAGED_CMDLINE_KEYS[key]} instead "
            "(the fields boot.iommu, boot.iommu_passthrough, boot.acs_override, boot.pci_realloc "
            "own these parameters)"
        )
    return value


def cmdline_key(param: str) -> str:
    """The parameter's name as the kernel compares it ('-' and '_' are the same)."""
    return param.split("=", 1)[0].replace("-", "_")


def _acs_override(value: str) -> str:
    _bounded(value, "pcie_acs_override value", 512)
    tokens = value.split(",")
    bad = [t for t in tokens if not ACS_TOKEN_RE.fullmatch(t)]
    fix = (
        "write a comma-separated list of 'downstream', 'multifunction' and 'id:vvvv:dddd' "
        "(vendor:device in hex), e.g. 'downstream,multifunction'"
    )
    if bad:
        why = _first_bad(value, "a-zA-Z0-9:,").strip(" ()") or show(bad[0])
        raise ValueError(f"{show(value)} is not a pcie_acs_override value ({why}); {fix}")
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"{show(value)} names an item twice; {fix}")
    if sum(t.startswith("id:") for t in tokens) > ACS_MAX_IDS:
        raise ValueError(
            f"{show(value)} names more than {ACS_MAX_IDS} devices (the Proxmox patch keeps "
            f"{ACS_MAX_IDS})"
        )
    return value


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


DnsName = Annotated[str, AfterValidator(_dns_name)]
Hostname = Annotated[str, AfterValidator(_hostname)]
AbsPath = Annotated[str, AfterValidator(_abs_path)]
PatchPath = Annotated[str, AfterValidator(_patch_path)]
EnvName = Annotated[str, AfterValidator(_env_name)]
EnvValue = Annotated[str, AfterValidator(_env_value)]
KernelParam = Annotated[str, AfterValidator(_kernel_param)]
AcsOverride = Annotated[str, AfterValidator(_acs_override)]
GitRepo = Annotated[str, AfterValidator(_git_repo)]
GitRef = Annotated[str, AfterValidator(_git_ref)]
PipRequirement = Annotated[str, AfterValidator(_requirement)]
ConfigName = Annotated[str, AfterValidator(_config_name)]
ConfigValue = Annotated[str, AfterValidator(_config_value)]
MAX_ITEMS = 256  # no list or mapping in a spec is longer


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def normalize_bdf(value: str) -> str:
    """'41:00.0' or '0000:41:00.0' -> '0000:41:00.0'; anything else is an error."""
    match = BDF_RE.fullmatch(value) if len(value) <= 16 else None
    if not match:
        raise ValueError(
            f"{show(value)} is not a PCI address{_first_bad(value, '0-9a-fA-F:.')}; write "
            "domain:bus:device.function, e.g. '0000:41:00.0'"
        )
    domain = (match["domain"] or "0000").lower()
    return f"{domain}:{match['bus'].lower()}:{match['dev'].lower()}.{match['fn']}"


# --- kernel and toolchain -----------------------------------------------------------------------


class KernelBuild(Model):
    """A kernel built from the Proxmox kernel sources (pve-kernel)."""

    repo: GitRepo = Field(
        description="Git URL (https://, ssh://, user@host:path) or absolute local path of the "
        "pve-kernel sources; no credentials in the URL."
    )
    ref: GitRef = Field("bookworm-6.14", description="Branch, tag or commit to build.")
    config: dict[ConfigName, ConfigValue] = Field(
        default_factory=dict,
        max_length=MAX_ITEMS,
        description="Kernel config fragment, CONFIG_* name -> y, m, n, a number or plain text.",
    )
    patches: list[PatchPath] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="Extra patch files applied in order, as normalised paths relative to files/ "
        "(e.g. 'patches/acs.patch').",
    )


class KernelSpec(Model):
    """The kernel the host must boot."""

    version: KernelRelease = Field(
        description="Kernel release as `uname -r` prints it, e.g. '6.14.8-2-bpo12-pve'."
    )
    source: Literal["package", "build"] = Field(
        "package",
        description="'package': install proxmox-kernel-<version> from the host's apt sources; "
        "'build': build it from `build`.",
    )
    build: KernelBuild | None = Field(
        None, description="Source build recipe; required for source='build'."
    )
    keep: list[KernelRelease] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="Known-good kernels that must stay installed and bootable (the running "
        "kernel is always kept).",
    )


class ToolchainSpec(Model):
    """One compiler for the kernel and every out-of-tree module: a mismatch bricks the host."""

    gcc: GccVersion = Field(
        "12.2.0",
        description="GCC version (X.Y.Z) that must build the kernel and the NVIDIA modules.",
    )


# --- NVIDIA driver ------------------------------------------------------------------------------


class DriverSpec(Model):
    """The NVIDIA driver on the host; every GPU guest's userspace must match it exactly."""

    version: DriverVersion = Field(description="Driver version, e.g. '595.71.05'.")
    open: bool = Field(
        True,
        description="Build the open kernel modules. Required for Blackwell and newer GPUs.",
    )

    @property
    def branch(self) -> int:
        return int(self.version.split(".")[0])


# --- boot parameters and modules -------------------------------------------------------------


class BootSpec(Model):
    """Kernel command line parameters gpuhost manages (GRUB or systemd-boot, detected)."""

    iommu: bool = Field(
        True,
        description="The IOMMU must be on. Intel: writes intel_iommu=on. AMD: the IOMMU is on by "
        "default and amd_iommu=on is not a valid kernel option, so nothing is written. A value on "
        "the host's command line that turns the IOMMU off (intel_iommu=off, amd_iommu=off) is "
        "refused; any other value the host has is kept.",
    )
    iommu_passthrough: bool | None = Field(
        None,
        description="iommu=pt: host-driver devices get identity (untranslated) IOMMU domains. None "
        "(auto) adds it unless SEV-SNP is active and boot.snp is 'keep' (SNP forbids identity "
        "domains, and iommu=pt turns SNP off at boot). true on such a host needs boot.snp "
        "'give_up'.",
    )
    snp: Literal["keep", "give_up"] = Field(
        "keep",
        description="On a host where SEV-SNP is active: 'keep' keeps SNP, so no identity IOMMU "
        "domains (no iommu=pt); P2P through the translating IOMMU is not relied on and GPU "
        "guests get NCCL_P2P_DISABLE=1. 'give_up' allows iommu=pt, which turns SNP off at boot "
        "('SNP: IOMMU disabled or configured in passthrough mode'): SEV-SNP guests can no longer "
        "run. Ignored where SNP is not active.",
    )
    acs_override: AcsOverride | None = Field(
        None,
        description="pcie_acs_override value, to split IOMMU groups a board lumps together "
        "(Proxmox kernel patch): a comma-separated list of 'downstream', 'multifunction' and "
        "'id:vvvv:dddd' (vendor:device in hex, up to 16). None leaves it off.",
    )
    pci_realloc: bool = Field(
        False, description="Add pci=realloc (fixes BAR allocation for large-BAR GPUs)."
    )
    extra: list[KernelParam] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="Other parameters to ensure, one name[=value] per item (e.g. 'pcie_aspm=off'; "
        "printable ASCII, no spaces, quotes, $, backticks, backslashes, ; & | < > ( ) or #). "
        "Parameters gpuhost manages (intel_iommu, amd_iommu, iommu, iommu.passthrough, "
        "iommu.strict, pcie_acs_override, pci) are refused here: use their fields. Other "
        "parameters on the host's command line are kept; one with the same name as an item here "
        "is replaced.",
    )


class ModulesSpec(Model):
    """Module options and boot-time module loading."""

    uvm_disable_hmm: bool = Field(
        True,
        description="options nvidia_uvm uvm_disable_hmm=1: CUDA fails to initialise in LXC "
        "containers without it.",
    )
    blacklist_nouveau: bool = Field(True, description="Blacklist nouveau so it never claims a GPU.")
    vfio_modules: list[ModuleName] = Field(
        default_factory=lambda: ["vfio", "vfio_iommu_type1", "vfio_pci"],
        max_length=64,
        description="Modules loaded at boot when any GPU goes to a VM ([a-z0-9_]+).",
    )


# --- guests ---------------------------------------------------------------------------------------

MAX_GPU_INDEX = 1023


def _gpu_ref(value: object) -> object:
    if type(value) is int:
        if not 0 <= value <= MAX_GPU_INDEX:
            raise ValueError(
                f"GPU index {value} is out of range; nvidia-smi indexes start at 0 "
                f"(at most {MAX_GPU_INDEX})"
            )
        return value
    if isinstance(value, str):
        return normalize_bdf(value)
    raise ValueError(
        f"{show(value)} is not a GPU; give a PCI address string ('0000:41:00.0') or an "
        "nvidia-smi index (an int; true/false and floats are not indexes)"
    )


GpuRef = Annotated[
    int | str,
    BeforeValidator(_gpu_ref),
    Field(description="A GPU by PCI address (BDF) or nvidia-smi index."),
]


def _gpus_tag(value: object) -> str:
    return "rest" if isinstance(value, str) else "list"


GpuList = Annotated[
    Annotated[list[GpuRef], Tag("list"), Field(max_length=MAX_GPU_INDEX + 1)]
    | Annotated[Literal["rest"], Tag("rest")],
    Discriminator(
        _gpus_tag,
        custom_error_type="gpu_list",
        custom_error_message="give a list of PCI addresses/nvidia-smi indexes, or 'rest'",
    ),
]


class Venv(Model):
    """A uv virtual environment in a guest (filled in by the CUDA/venv issue)."""

    path: AbsPath = Field(description="Absolute, normalised path of the venv in the guest.")
    python: PythonVersion = Field("3.12", description="Python version uv installs for it.")
    cuda: CudaVersion | None = Field(
        None, description="CUDA toolkit this venv builds against (sets CUDA_HOME)."
    )
    packages: list[PipRequirement] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="Requirements to install (PEP 508; no credentials in URLs).",
    )
    constraints: list[PipRequirement] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="Pins every install must honour, e.g. 'torch==2.9.1' (PEP 508).",
    )


class GuestBase(Model):
    name: DnsName = Field(
        description="Guest name (container hostname / VM name): a lowercase DNS name."
    )
    gpus: GpuList = Field(
        default_factory=list,
        description="GPUs for this guest: BDFs ('0000:41:00.0'), nvidia-smi indexes, or 'rest' "
        "for every GPU no other guest names.",
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        max_length=MAX_ITEMS,
        description="Environment for GPU workloads in the guest (e.g. NCCL_P2P_DISABLE). Names "
        "[A-Za-z_][A-Za-z0-9_]*; values printable ASCII without quotes, backslashes, $, "
        "backticks, % or control characters, no leading/trailing space, up to 4096 characters.",
    )


class LxcAccess(Model):
    """How pyinfra/testinfra reach the container itself."""

    ssh_hostname: Hostname | None = Field(
        None, description="Address to SSH to; None: reach it through `pct exec` on the host."
    )
    ssh_user: Username = Field("root", description="SSH user in the container.")
    ssh_port: int = Field(22, ge=1, le=65535, description="SSH port.")


GuestId = Annotated[int, Field(ge=100, le=999_999_999)]


class LxcGuest(GuestBase):
    """An LXC container that uses GPUs through the host's nvidia driver (bind-mounted nodes)."""

    kind: Literal["lxc"] = "lxc"
    ctid: GuestId = Field(description="Container id (pct).")
    access: LxcAccess = Field(default_factory=LxcAccess, description="How to reach the container.")
    devices: Literal["devN", "raw"] = Field(
        "devN",
        description="How GPU device nodes are granted: 'devN' (Proxmox resolves majors at "
        "start, PVE >= 8.1) or 'raw' (lxc.cgroup2 rules written from the live majors).",
    )
    cuda: list[CudaVersion] = Field(
        default_factory=list,
        max_length=16,
        description="CUDA toolkits to install side by side, e.g. ['12.8', '13.0'].",
    )
    venvs: list[Venv] = Field(
        default_factory=list, max_length=64, description="uv venvs to create."
    )

    @property
    def guest_id(self) -> int:
        return self.ctid


class VmGuest(GuestBase):
    """A QEMU VM that gets whole GPUs through vfio-pci passthrough (hostpciN)."""

    kind: Literal["vm"] = "vm"
    vmid: GuestId = Field(description="VM id (qm).")
    machine: MachineType | None = Field(
        None,
        description="Machine type to set: 'q35', 'pc-q35-X.Y' or 'pc-q35-X.Y+pveN' ('pc', "
        "'pc-i440fx-X.Y' only for a VM without GPUs). None keeps the VM's configured type, which "
        "must then already be q35 for GPU passthrough.",
    )

    @property
    def guest_id(self) -> int:
        return self.vmid


Guest = Annotated[LxcGuest | VmGuest, Field(discriminator="kind")]
GUEST_KINDS: dict[str, type[GuestBase]] = {"lxc": LxcGuest, "vm": VmGuest}


class P2PSpec(Model):
    """Which GPU pairs must be able to do peer-to-peer DMA."""

    expected: Literal["auto", "none", "all"] = Field(
        "auto",
        description="'auto': what the driver itself answers (`nvidia-smi topo -p2p r` and `w`: "
        "OK), downgraded to none where IOMMU translation or SEV-SNP makes P2P unsafe; 'none' or "
        "'all' to state it.",
    )
    unsafe_iommu: bool = Field(
        False,
        description="Manual override: the IOMMU translates P2P DMA unsafely on this host: expect "
        "no P2P and set NCCL_P2P_DISABLE=1 for GPU guests (automatic where SEV-SNP is active and "
        "boot.snp is 'keep').",
    )


# --- checks across fields, on the raw data ---------------------------------------------------------
# pydantic runs model validators only when every field validated; these run on the raw input
# so that a duplicate id is reported together with a misspelt field elsewhere.


def _valid(value: object, check: Any) -> Any:
    try:
        return check(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _ref_key(ref: object) -> object:
    if type(ref) is int and 0 <= ref <= MAX_GPU_INDEX:
        return ref
    return _valid(ref, normalize_bdf)


Problem = tuple[tuple[int | str, ...], str, object]  # location, message, the value (or NO_VALUE)
NO_VALUE = object()


def cross_field_problems(data: object) -> list[Problem]:
    """Every problem that spans fields, found on the raw data (values that are invalid on their
    own are left to the field checks)."""
    if not isinstance(data, dict):
        return []
    problems: list[Problem] = []
    kernel = data.get("kernel")
    if isinstance(kernel, dict):
        source, build = kernel.get("source", "package"), kernel.get("build")
        if source == "build" and build is None:
            problems.append(
                (
                    ("kernel", "build"),
                    "source='build' needs a `build` recipe (repo, ref, config)",
                    NO_VALUE,
                )
            )
        if source == "package" and build is not None:
            problems.append(
                (
                    ("kernel", "build"),
                    "`build` is only used with source='build'; remove it or set source",
                    NO_VALUE,
                )
            )
    boot = data.get("boot")
    extra = boot.get("extra") if isinstance(boot, dict) else None
    if isinstance(extra, list):
        seen: dict[str, int] = {}
        for j, param in enumerate(extra[:MAX_ITEMS]):
            if _valid(param, _kernel_param) is None:
                continue
            key = cmdline_key(param)
            if key in seen:
                problems.append(
                    (
                        ("boot", "extra", j),
                        f"{show(param)} sets {key} again (also boot.extra[{seen[key]}]); give each "
                        "parameter once",
                        NO_VALUE,
                    )
                )
            seen.setdefault(key, j)
    driver = data.get("driver")
    version = driver.get("version") if isinstance(driver, dict) else None
    branch = int(version.split(".")[0]) if _valid(version, DRIVER_RE.fullmatch) else None
    guests = data.get("guests")
    if isinstance(guests, list):
        problems += _guest_problems(guests, version, branch)
    return problems


def _guest_problems(guests: list[Any], version: object, branch: int | None) -> list[Problem]:
    problems: list[Problem] = []
    seen_ids: dict[int, str] = {}
    seen_names: dict[str, str] = {}
    seen_gpus: dict[object, str] = {}
    rest: list[str] = []
    for i, guest in enumerate(guests[:MAX_ITEMS]):
        if not isinstance(guest, dict):
            continue
        where = f"guests[{i}]"
        kind = guest.get("kind")
        id_field = {"lxc": "ctid", "vm": "vmid"}.get(kind) if isinstance(kind, str) else None
        guest_id = guest.get(id_field) if id_field else None
        if type(guest_id) is int:
            if guest_id in seen_ids:
                problems.append(
                    (
                        ("guests", i),
                        f"id {guest_id} is already used by {seen_ids[guest_id]}; containers and "
                        "VMs share one id space on a Proxmox node",
                        NO_VALUE,
                    )
                )
            seen_ids.setdefault(guest_id, where)
        name = _valid(guest.get("name"), _dns_name)
        if name is not None:
            if name in seen_names:
                problems.append(
                    (
                        ("guests", i),
                        f"name {name!r} is used twice (also by {seen_names[name]})",
                        NO_VALUE,
                    )
                )
            seen_names.setdefault(name, where)
        gpus = guest.get("gpus", [])
        if gpus == "rest":
            rest.append(where)
        elif isinstance(gpus, list):
            mine: set[object] = set()
            for ref in gpus[: MAX_GPU_INDEX + 1]:
                key = _ref_key(ref)
                if key is None:
                    continue
                if key in mine:
                    problems.append(
                        (("guests", i), f"the same GPU {key!r} is listed twice", NO_VALUE)
                    )
                elif key in seen_gpus:
                    problems.append(
                        (
                            ("guests", i),
                            f"GPU {key!r} is already given to {seen_gpus[key]}; a GPU has one owner",
                            NO_VALUE,
                        )
                    )
                mine.add(key)
                seen_gpus.setdefault(key, where)
            machine = guest.get("machine")
            if (
                kind == "vm"
                and gpus
                and _valid(machine, MACHINE_RE.fullmatch)
                and "q35" not in machine
            ):
                problems.append(
                    (
                        ("guests", i, "machine"),
                        f"{show(machine)} is not q35; PCIe GPU passthrough (hostpci pcie=1) needs "
                        "'q35' (or 'pc-q35-<version>')",
                        machine,
                    )
                )
        if kind == "lxc":
            problems += _cuda_problems(i, guest, version, branch)
    if len(rest) > 1:
        problems.append(
            (
                ("guests",),
                f"only one guest may take 'rest' of the GPUs, not {' and '.join(rest)}",
                NO_VALUE,
            )
        )
    return problems


def _cuda_problems(
    i: int, guest: dict[str, Any], version: object, branch: int | None
) -> list[Problem]:
    problems: list[Problem] = []
    cuda = guest.get("cuda", [])
    known = [c for c in cuda[:16] if _valid(c, _cuda_known)] if isinstance(cuda, list) else []
    for item in known:
        if branch is not None and branch < CUDA_MIN_DRIVER[item]:
            problems.append(
                (
                    ("guests", i, "cuda"),
                    f"CUDA {item} needs driver {CUDA_MIN_DRIVER[item]} or newer, but driver.version "
                    f"is {version}",
                    NO_VALUE,
                )
            )
    venvs = guest.get("venvs")
    for j, venv in enumerate(venvs[:64] if isinstance(venvs, list) else []):
        wanted = venv.get("cuda") if isinstance(venv, dict) else None
        if _valid(wanted, _cuda_known) and isinstance(cuda, list) and wanted not in known:
            problems.append(
                (
                    ("guests", i, "venvs", j, "cuda"),
                    f"CUDA {wanted} is not installed in this guest; add {wanted!r} to "
                    f"guests[{i}].cuda",
                    wanted,
                )
            )
    return problems


class HostSpec(Model):
    """A Proxmox VE host that carries NVIDIA GPUs."""

    kernel: KernelSpec = Field(description="The kernel to boot.")
    toolchain: ToolchainSpec = Field(default_factory=ToolchainSpec, description="The one compiler.")
    driver: DriverSpec = Field(description="The NVIDIA driver.")
    boot: BootSpec = Field(default_factory=BootSpec, description="Kernel command line.")
    modules: ModulesSpec = Field(default_factory=ModulesSpec, description="Module options.")
    guests: list[Guest] = Field(
        default_factory=list, max_length=MAX_ITEMS, description="Containers and VMs that get GPUs."
    )
    p2p: P2PSpec = Field(default_factory=P2PSpec, description="Expected P2P capability.")

    @model_validator(mode="wrap")
    @classmethod
    def _every_problem(cls, data: Any, handler: Any) -> HostSpec:
        cross = [
            {
                "type": PydanticCustomError(
                    "cross_field" if value is NO_VALUE else "cross_value", msg
                ),
                "loc": loc,
                "input": None if value is NO_VALUE else value,
            }
            for loc, msg, value in cross_field_problems(data)
        ]
        try:
            spec = handler(data)
        except ValidationError as exc:
            if not cross:
                raise
            field_errors = [
                {
                    "type": PydanticCustomError(e["type"], e["msg"]),
                    "loc": e["loc"],
                    "input": e["input"],
                }
                for e in exc.errors(include_url=False)
            ]
            raise ValidationError.from_exception_data(
                cls.__name__, [*field_errors, *cross]
            ) from None
        if cross:
            raise ValidationError.from_exception_data(cls.__name__, cross)
        return spec

    def to_json(self) -> dict[str, Any]:
        """For pyinfra's JSON output (`pyinfra INVENTORY debug-inventory`)."""
        return self.model_dump(mode="json")

    @property
    def lxc_guests(self) -> list[LxcGuest]:
        return [g for g in self.guests if isinstance(g, LxcGuest)]

    @property
    def vm_guests(self) -> list[VmGuest]:
        return [g for g in self.guests if isinstance(g, VmGuest)]
