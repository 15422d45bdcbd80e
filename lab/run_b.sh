# GPU run B: E1/E3 (issue 37) with --repro, the attention tiles probe and the runtime GPU tests
# (issue 35).
# carry: build/dev-gpu/libpq2.so .whl build/lab-e1/libpq2.so
source lab/dev.sh
export PYTHONUNBUFFERED=1
bash lab/e1/run_e1.sh --fast --budget-s 150 --repro > /dev/null 2>&1; echo "e1 rc $?"
(cd $OUT && ls child-* >/dev/null 2>&1 && tar czf e1-children.tgz child-* && rm -f child-*)
tail -40 $OUT/e1.log
timeout 120 python lab/attn/probe_attn.py --json $OUT/attn.json > $OUT/attn.log 2>&1; echo "attn rc $?"
grep -v '^check' $OUT/attn.log | tail -24
timeout 240 python -m pytest -q -p no:cacheprovider -m gpu tests/runtime > $OUT/runtime.log 2>&1; echo "runtime tests rc $?"
tail -8 $OUT/runtime.log
