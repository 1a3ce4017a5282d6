"""nvidia-smi --query-gpu's memory-health fields as the real driver reports them per board kind
(tests/fixtures/captures/h200x1-telemetry: driver 580.159.04 on an H200)."""

from __future__ import annotations

import re

# Boards with HBM: `temperature.memory` is the "HBM memory temperature" (nvidia-smi
# --help-query-gpu, tests/fixtures/captures/h200x1-telemetry); GDDR boards read [N/A].
HBM_BOARD = re.compile(r"\b(A100|H100|H200|H20|GH200|B200|B300|GB200)\b")
# Ampere and later repair memory by row remapping and retire no pages: the real H200 reads
# retired_pages.* [N/A] and remapped_rows.* 0/0/No/No (h200x1-telemetry/query-gpu.csv).
ROW_REMAPPING = {"Ampere", "Hopper", "Blackwell"}


def memory_health(g: dict) -> dict[str, str]:
    """ECC counters (none: the twin's memory never errs; [N/A] with ECC off), retired pages and
    remapped rows as the architecture reports them."""
    na = "[N/A]"
    ecc = "0" if g["ecc"] else na
    remaps = g["architecture"] in ROW_REMAPPING
    return {
        "ecc.errors.corrected.volatile.total": ecc,
        "ecc.errors.uncorrected.volatile.total": ecc,
        "ecc.errors.uncorrected.aggregate.total": ecc,
        "retired_pages.single_bit_ecc.count": na if remaps else "0",
        "retired_pages.double_bit.count": na if remaps else "0",
        "retired_pages.pending": na if remaps else "No",
        "remapped_rows.correctable": "0" if remaps else na,
        "remapped_rows.uncorrectable": "0" if remaps else na,
        "remapped_rows.pending": "No" if remaps else na,
        "remapped_rows.failure": "No" if remaps else na,
    }
