"""The pydantic types of inventory values: each one a grammar from gpuhost/spec/grammar.py, matched
against the whole string, with a message that names the bad character and the fix."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import (
    AfterValidator,
)

from gpuhost.redact import show
from gpuhost.spec.grammar import (
    ABS_PATH_RE,
    ACS_MAX_IDS,
    ACS_TOKEN_RE,
    BDF_RE,
    CMDLINE_NAME_RE,
    CMDLINE_RE,
    CMDLINE_VALUE_CHARS,
    CUDA_MIN_DRIVER,
    CUDA_RE,
    DNS_NAME_RE,
    DRIVER_RE,
    ENV_NAME_RE,
    ENV_VALUE_CHARS,
    ENV_VALUE_RE,
    GCC_RE,
    GPU_MODEL_RE,
    GUEST_NAME_RE,
    HOSTNAME_RE,
    KERNEL_RE,
    LINK_RE,
    MACHINE_RE,
    MANAGED_CMDLINE_KEYS,
    MAX_TEXT,
    MODULE_RE,
    PCI_OWNED_OPTION,
    PYTHON_RE,
    USER_RE,
)


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


def check_cuda_known(value: str) -> str:
    if value not in CUDA_MIN_DRIVER:
        raise ValueError(
            f"CUDA {value} is not supported by gpuhost; choose one of {', '.join(CUDA_MIN_DRIVER)}"
        )
    return value


CudaVersion = Annotated[
    str,
    _grammar(CUDA_RE, "CUDA version", "write major.minor, e.g. '12.8'", "0-9.", 8),
    AfterValidator(check_cuda_known),
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
GpuModel = Annotated[
    str,
    _grammar(
        GPU_MODEL_RE,
        "GPU model",
        "write the model as nvidia-smi names it, e.g. 'NVIDIA H200'",
        "A-Za-z0-9 ._()/-",
        96,
    ),
]
LinkClass = Annotated[
    str,
    _grammar(
        LINK_RE,
        "link class",
        "write a `nvidia-smi topo -m` class: NV<n> (e.g. NV18), PIX, PXB, PHB, NODE or SYS",
        "A-Z0-9",
        6,
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


def check_dns_name(value: str) -> str:
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


def check_guest_name(value: str) -> str:
    _bounded(value, "name", 253)
    if GUEST_NAME_RE.fullmatch(value):
        return value
    raise ValueError(
        f"{show(value)} is not a valid guest name{_first_bad(value, 'A-Za-z0-9.-')}; use a DNS "
        "name: letters, digits and '-' (not at either end), labels of up to 63 separated by '.'"
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


def check_kernel_param(value: str) -> str:
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
    if key == "pci" and PCI_OWNED_OPTION in pci_options(value):
        raise ValueError(
            f"{show(value)} sets pci's {PCI_OWNED_OPTION} option, which gpuhost manages; use "
            "boot.pci_realloc instead, and keep pci's other options here (e.g. 'pci=noaer')"
        )
    if key in MANAGED_CMDLINE_KEYS:
        raise ValueError(
            f"{show(value)} is managed by gpuhost; use {MANAGED_CMDLINE_KEYS[key]} instead "
            "(the fields boot.iommu, boot.iommu_passthrough, boot.acs_override, boot.pci_realloc "
            "own these parameters)"
        )
    return value


def pci_options(param: str) -> set[str]:
    """The option names of a `pci=` parameter ('pci=realloc=off,noaer' -> realloc, noaer)."""
    return {t.partition("=")[0] for t in param.partition("=")[2].split(",") if t}


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


DnsName = Annotated[str, AfterValidator(check_dns_name)]
GuestName = Annotated[str, AfterValidator(check_guest_name)]
Hostname = Annotated[str, AfterValidator(_hostname)]
AbsPath = Annotated[str, AfterValidator(_abs_path)]
EnvName = Annotated[str, AfterValidator(_env_name)]
EnvValue = Annotated[str, AfterValidator(_env_value)]
KernelParam = Annotated[str, AfterValidator(check_kernel_param)]
AcsOverride = Annotated[str, AfterValidator(_acs_override)]
MAX_ITEMS = 256  # no list or mapping in a spec is longer

MAX_GPU_INDEX = 1023  # nvidia-smi indexes a spec may name


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
