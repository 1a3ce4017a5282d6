#!/usr/bin/env bash
# The CUDA probe's P2P evidence on the lent GPU machine (device tool), from a gpuhost checkout:
# `bash tools/capture-p2p.sh`. Writes, under $OUT: CAPTURE-INFO, cuda_probe.{cmd,out,err,rc}
# (gpuhost/probes/cuda_probe.py as the audit runs it: per pair, both-way peer access, integrity,
# gbps against the host-staged copy). For tests/fixtures/captures/h200x1-p2p/ (or -x2 where a
# machine with two GPUs is lent).
set -u
R=$OUT
{ echo "captured_at: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo "hostname: $(hostname)"; echo "uname: $(uname -a)"; nvidia-smi -L 2>&1; } > "$R/CAPTURE-INFO"
CMD="python3 gpuhost/probes/cuda_probe.py 4096 1048576 67108864"
echo "$CMD" > "$R/cuda_probe.cmd"
$CMD > "$R/cuda_probe.out" 2> "$R/cuda_probe.err"; echo $? > "$R/cuda_probe.rc"
cat "$R/CAPTURE-INFO" "$R/cuda_probe.out" "$R/cuda_probe.err"
