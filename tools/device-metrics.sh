#!/usr/bin/env bash
# `gpuhost metrics --local` on the lent GPU machine (device tool), as the host's timer runs it:
# python3 -s with gpuhost and pydantic's wheels only (no pyinfra: the host's runtime has none),
# against the true spec and a planted-wrong one (driver 575). Results under $OUT/m.
# Usage there: bash tools/device-metrics.sh (the wheels in .devwheels, as tools/device-audit.sh)
set -u
F=tests/fixtures/specfiles  # inventory/h200.py and h200_wrong.py's h200-driver, as spec files
mkdir -p /tmp/site && for w in .devwheels/pydantic*.whl .devwheels/annotated_types*.whl .devwheels/typing_inspection*.whl; do
  python3 -m zipfile -e "$w" /tmp/site
done
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/nvidia/bin
R=$OUT/m; mkdir -p "$R"
echo "captured_at: $(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$R/CAPTURE-INFO"; echo "uname: $(uname -a)" >> "$R/CAPTURE-INFO"
python3 --version >> "$R/CAPTURE-INFO" 2>&1
M="python3 -s -m gpuhost.cli metrics --local --host-name h200"
( time $M --spec $F/h200.json --out "$R/h200.prom" ) > "$R/h200.log" 2>&1; echo "rc=$?" >> "$R/h200.log"
( time $M --spec $F/h200-driver.json --out "$R/h200-driver.prom" ) > "$R/h200-driver.log" 2>&1
echo "rc=$?" >> "$R/h200-driver.log"
for i in 1 2 3; do ( time $M --spec $F/h200.json --out /tmp/bench.prom ) 2>&1 | grep real; done > "$R/bench.log"
cat "$R/h200.log" "$R/h200-driver.log" "$R/bench.log"; grep -v '^#' "$R/h200.prom" | grep -v 'applicable\|findings' | head -60
grep 'check_ok.*} 0' "$R/h200-driver.prom"
