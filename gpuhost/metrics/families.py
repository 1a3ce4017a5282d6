"""Every metric family gpuhost writes: name, type, labels and help. The renderer refuses a sample
of a family not registered here, the alert rules and the dashboard are checked against it
(tests/unit/test_monitoring_files.py) and docs/reference/metrics.md is generated from it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    type: str  # "gauge": every value gpuhost writes is the state at the audit's time
    labels: tuple[str, ...]
    help: str


FAMILIES: dict[str, Family] = {}


def _family(name: str, labels: tuple[str, ...], help: str) -> str:
    if name in FAMILIES:
        raise ValueError(f"metric family {name} registered twice")
    FAMILIES[name] = Family(name, "gauge", labels, help)
    return name


HOST = ("host",)
GUEST = ("host", "guest")
CHECK = ("host", "guest", "check")
GPU = ("host", "gpu")

# --- the audit ---------------------------------------------------------------------------------
CHECK_OK = _family(
    "gpuhost_check_ok",
    CHECK,
    "1 when the audit check passed, 0 when it failed; written only for checks that apply "
    "(gpuhost_check_applicable). guest is empty for host checks.",
)
CHECK_APPLICABLE = _family(
    "gpuhost_check_applicable",
    CHECK,
    "1 when the audit check applies to this host or guest, 0 when it is not applicable.",
)
CHECK_FINDINGS = _family(
    "gpuhost_check_findings",
    CHECK,
    "Number of findings (ways the host differs from the Plan) of an applicable check.",
)
CHECKS = _family(
    "gpuhost_checks",
    ("host", "status"),
    "Number of audit checks per status: passed, failed, not_applicable.",
)
AUDIT_DURATION = _family(
    "gpuhost_audit_duration_seconds", HOST, "Seconds the audit took (reads and checks)."
)
AUDIT_TIMESTAMP = _family(
    "gpuhost_audit_last_run_timestamp_seconds",
    HOST,
    "Unix time the audit finished; an alert fires when it grows old or is absent.",
)
PLAN_OK = _family(
    "gpuhost_audit_plan_ok",
    HOST,
    "1 when a Plan was made from the spec and the host; 0 when it was refused (every check "
    "then fails with the reason).",
)
# --- versions ----------------------------------------------------------------------------------
DRIVER_INFO = _family(
    "gpuhost_driver_info",
    ("host", "driver", "module", "userspace", "gsp_firmware"),
    "Always 1. driver: the version the spec names; module: the loaded nvidia module "
    "(/proc/driver/nvidia/version); userspace: the host's libcuda; gsp_firmware: the GSP "
    "firmware the GPUs run (/proc/driver/nvidia/gpus/*/information), comma-separated when they "
    "differ. An empty label: not there.",
)
UVM_MAJOR = _family(
    "gpuhost_nvidia_uvm_major",
    HOST,
    "The nvidia-uvm character device major in /proc/devices now (it moves across boots).",
)
# --- guests ------------------------------------------------------------------------------------
GUEST_UP = _family(
    "gpuhost_guest_up",
    GUEST,
    "1 when the GPU container could be read (pct exec or its SSH), 0 when not (stopped...).",
)
GUEST_USERSPACE = _family(
    "gpuhost_guest_userspace_info",
    ("host", "guest", "userspace"),
    "Always 1, per GPU container read: the version of the libcuda in it (empty: none).",
)
GUEST_GPUS_PLANNED = _family("gpuhost_guest_gpus_planned", GUEST, "GPUs the Plan gives the guest.")
GUEST_GPU_NODES = _family(
    "gpuhost_guest_gpu_nodes",
    GUEST,
    "The container's planned GPU nodes (/dev/nvidiaN) present inside it with the host's live "
    "numbers.",
)
GUEST_CUDA_DEVICES = _family(
    "gpuhost_guest_cuda_devices",
    GUEST,
    "GPUs CUDA enumerates inside the container (0 when CUDA does not initialise); absent when "
    "the probe could not run.",
)
# --- GPUs (nvidia-smi --query-gpu) --------------------------------------------------------------
TELEMETRY_UP = _family(
    "gpuhost_gpu_telemetry_up", HOST, "1 when nvidia-smi answered the telemetry query, 0 when not."
)
GPU_INFO = _family(
    "gpuhost_gpu_info",
    ("host", "gpu", "index", "uuid", "name", "vbios", "guest"),
    "Always 1, per GPU nvidia-smi shows on the host: gpu is its PCI address, guest the guest "
    "the Plan gives it to (empty: the host's).",
)
GPU_TEMPERATURE = _family("gpuhost_gpu_temperature_celsius", GPU, "GPU core temperature.")
GPU_MEMORY_TEMPERATURE = _family(
    "gpuhost_gpu_memory_temperature_celsius", GPU, "GPU memory (HBM) temperature."
)
GPU_POWER = _family("gpuhost_gpu_power_draw_watts", GPU, "Power draw of the board.")
GPU_POWER_LIMIT = _family("gpuhost_gpu_power_limit_watts", GPU, "Software power limit.")
GPU_MEMORY_USED = _family("gpuhost_gpu_memory_used_bytes", GPU, "Framebuffer memory in use.")
GPU_MEMORY_TOTAL = _family("gpuhost_gpu_memory_total_bytes", GPU, "Framebuffer memory in all.")
GPU_UTILIZATION = _family(
    "gpuhost_gpu_utilization_ratio", GPU, "Share of the last sample period a kernel ran (0..1)."
)
GPU_PERSISTENCE = _family(
    "gpuhost_gpu_persistence_mode", GPU, "1 when persistence mode is enabled, 0 when not."
)
GPU_ECC_MODE = _family("gpuhost_gpu_ecc_mode", GPU, "1 when ECC is enabled, 0 when not.")
GPU_ECC_ERRORS = _family(
    "gpuhost_gpu_ecc_errors",
    ("host", "gpu", "kind", "scope"),
    "ECC errors: kind corrected|uncorrected; scope volatile (since the driver loaded) or "
    "aggregate (the board's lifetime).",
)
GPU_RETIRED_PAGES = _family(
    "gpuhost_gpu_retired_pages",
    ("host", "gpu", "cause"),
    "Framebuffer pages retired, by cause single_bit_ecc|double_bit (pre-Ampere boards; absent "
    "where nvidia-smi reports [N/A], as on Hopper).",
)
GPU_RETIRED_PENDING = _family(
    "gpuhost_gpu_retired_pages_pending", GPU, "1 when a page retirement waits for a reset."
)
GPU_REMAPPED_ROWS = _family(
    "gpuhost_gpu_remapped_rows",
    ("host", "gpu", "kind"),
    "Memory rows remapped, by kind correctable|uncorrectable (Ampere and later).",
)
GPU_REMAP_PENDING = _family(
    "gpuhost_gpu_remapped_rows_pending", GPU, "1 when a row remap waits for a GPU reset."
)
GPU_REMAP_FAILURE = _family(
    "gpuhost_gpu_remapped_rows_failure", GPU, "1 when a row remap failed (the board needs service)."
)

# nvidia-smi field -> (family, extra labels, scale to the family's unit)
TELEMETRY: dict[str, tuple[str, dict[str, str], float]] = {
    "temperature.gpu": (GPU_TEMPERATURE, {}, 1.0),
    "temperature.memory": (GPU_MEMORY_TEMPERATURE, {}, 1.0),
    "power.draw": (GPU_POWER, {}, 1.0),
    "power.limit": (GPU_POWER_LIMIT, {}, 1.0),
    "memory.used": (GPU_MEMORY_USED, {}, 1024.0 * 1024.0),  # MiB
    "memory.total": (GPU_MEMORY_TOTAL, {}, 1024.0 * 1024.0),
    "utilization.gpu": (GPU_UTILIZATION, {}, 0.01),  # %
    "persistence_mode": (GPU_PERSISTENCE, {}, 1.0),
    "ecc.mode.current": (GPU_ECC_MODE, {}, 1.0),
    "ecc.errors.corrected.volatile.total": (
        GPU_ECC_ERRORS,
        {"kind": "corrected", "scope": "volatile"},
        1.0,
    ),
    "ecc.errors.uncorrected.volatile.total": (
        GPU_ECC_ERRORS,
        {"kind": "uncorrected", "scope": "volatile"},
        1.0,
    ),
    "ecc.errors.uncorrected.aggregate.total": (
        GPU_ECC_ERRORS,
        {"kind": "uncorrected", "scope": "aggregate"},
        1.0,
    ),
    "retired_pages.single_bit_ecc.count": (GPU_RETIRED_PAGES, {"cause": "single_bit_ecc"}, 1.0),
    "retired_pages.double_bit.count": (GPU_RETIRED_PAGES, {"cause": "double_bit"}, 1.0),
    "retired_pages.pending": (GPU_RETIRED_PENDING, {}, 1.0),
    "remapped_rows.correctable": (GPU_REMAPPED_ROWS, {"kind": "correctable"}, 1.0),
    "remapped_rows.uncorrectable": (GPU_REMAPPED_ROWS, {"kind": "uncorrectable"}, 1.0),
    "remapped_rows.pending": (GPU_REMAP_PENDING, {}, 1.0),
    "remapped_rows.failure": (GPU_REMAP_FAILURE, {}, 1.0),
}
