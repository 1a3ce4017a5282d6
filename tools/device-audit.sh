#!/usr/bin/env bash
# Run the audit on the lent GPU machine (device tool): wheels carried in .devwheels (pip download
# for its Python), results under $OUT/audit-run.tgz. Usage there:
#   bash tools/device-audit.sh [INVENTORY HOST]   (default inventory/h200.py h200)
set -u
INV=${1:-inventory/h200.py} HOST=${2:-h200}
mkdir -p /tmp/site && for w in .devwheels/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/nvidia/bin:/tmp/site/bin
R=$OUT/r; mkdir -p $R
# the files a deploy would write (it cannot run here: no systemd, initramfs or reboot)
python3 tools/write-plan-files.py $INV $HOST modules devices > $R/write-plan-files.out 2>&1
python3 -c "from gpuhost.audit.observe import host_command; print(host_command())" > $R/audit-host.cmd; cp $R/audit-host.cmd /tmp/hc.sh
( time sh /tmp/hc.sh > $R/audit-host.out 2> $R/audit-host.err ) 2> $R/audit-host.time
echo "captured_at: $(date -u +%Y-%m-%dT%H:%M:%SZ)" > $R/CAPTURE-INFO; echo "uname: $(uname -a)" >> $R/CAPTURE-INFO
T="python3 -m pytest -p gpuhost.audit.plugin -p no:cacheprovider tests/audit --hosts=local://"
( time $T --inventory $INV --audit-json $R/$HOST-pass.json --junitxml $R/$HOST-pass.xml -rA ) > $R/$HOST-pass.log 2>&1
tail -30 $R/$HOST-pass.log; cat $R/audit-host.time
# the wrong inventories are written for the H200's facts
[ "$HOST" = h200 ] && for h in h200-driver h200-hmm h200-count; do
  $T --inventory tests/fixtures/inventories/audit/h200_wrong.py --audit-limit $h --audit-json $R/$h.json --junitxml $R/$h.xml > $R/$h.log 2>&1
  grep "^FAIL\|passed\|failed" $R/$h.log
done
( time python3 benchmarks/audit.py --inventory $INV --local --runs 5 ) > $R/bench.log 2>&1; cat $R/bench.log
tar czf $OUT/audit-run.tgz -C $OUT r
