# The next GPU run (from the repository root on the device machine), about 8 minutes:
#   carry: build/dev-gpu/libpq2.so .whl lab/seg/libseg.so build/lab-e1/libpq2.so
# (build them here first: cmake -S . -B build/dev-gpu -DPQ2_CUDA=ON -DPQ2_CUDA_ARCHS=90a-real;
#  nvcc ... lab/seg/seg.cu as in NOTES segment-stream-v3-compile-only; bash lab/e1/build.sh;
#  the wheels as lab/dev.sh says)
source lab/dev.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 150 python lab/seg/probe_seg.py --rounds 2 --json $OUT/seg.json > $OUT/seg.log 2>&1; echo "seg rc $?"
tail -40 $OUT/seg.log
bash lab/e1/run_e1.sh --fast --budget-s 110 > /dev/null 2>&1; echo "e1 rc $?"
tail -40 $OUT/e1.log
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/runtime > $OUT/runtime.log 2>&1; echo "runtime tests rc $?"
tail -5 $OUT/runtime.log
timeout 40 python lab/prof_step.py > $OUT/prof_step.log 2>&1; echo "prof rc $?"
