"""Checks across spec fields, made on the raw data so they are reported together with every
field error (pydantic runs model validators only after the fields validated)."""

from __future__ import annotations

from typing import Any

from gpuhost.redact import show
from gpuhost.spec.driver import version_problems
from gpuhost.spec.grammar import (
    CUDA_MIN_DRIVER,
    DRIVER_RE,
    MACHINE_RE,
    Q35_FIX,
    machine_is_q35,
)
from gpuhost.spec.values import (
    MAX_GPU_INDEX,
    MAX_ITEMS,
    check_cuda_known,
    check_guest_name,
    check_kernel_param,
    cmdline_key,
    normalize_bdf,
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
    for name, value, message in version_problems(data.get("driver")):
        problems.append((("driver", "source", name), message, value))
    boot = data.get("boot")
    extra = boot.get("extra") if isinstance(boot, dict) else None
    if isinstance(extra, list):
        seen: dict[str, int] = {}
        for j, param in enumerate(extra[:MAX_ITEMS]):
            if _valid(param, check_kernel_param) is None:
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
        name = _valid(guest.get("name"), check_guest_name)
        if name is not None:
            if name.lower() in seen_names:  # DNS names differ in more than case
                problems.append(
                    (
                        ("guests", i),
                        f"name {name!r} is used twice (also by {seen_names[name.lower()]})",
                        NO_VALUE,
                    )
                )
            seen_names.setdefault(name.lower(), where)
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
        valid = _valid(machine, MACHINE_RE.fullmatch) is not None
        if kind == "vm" and gpus and valid and not machine_is_q35(machine):
            problems.append(  # gpus 'rest' too: a VM that takes GPUs at all
                (
                    ("guests", i, "machine"),
                    f"{show(machine)} is not q35, and the VM gets GPUs: Proxmox refuses its "
                    f"hostpciN pcie=1 entries on any other machine type; {Q35_FIX} "
                    "(or 'pc-q35-<version>')",
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
    known = [c for c in cuda[:16] if _valid(c, check_cuda_known)] if isinstance(cuda, list) else []
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
        if _valid(wanted, check_cuda_known) and isinstance(cuda, list) and wanted not in known:
            problems.append(
                (
                    ("guests", i, "venvs", j, "cuda"),
                    f"CUDA {wanted} is not installed in this guest; add {wanted!r} to "
                    f"guests[{i}].cuda",
                    wanted,
                )
            )
    return problems
