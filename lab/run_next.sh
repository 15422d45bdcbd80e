# The next session's GPU calls, most wanted first (written 2026-12-07, fifth session).
# Restore the lab: git checkout <the lab commit named in NOTES> -- lab && git rm -r -q --cached lab
# Build: cmake --build build/dev-gpu; bash lab/e2/build.sh (call 1). Wheels in .whl (lab/dev.sh).
#   call 1: bash lab/run_o.sh  (issue 37, E2 at 128 tokens under the 40/232 split, the one E route
#           never timed: bits, times beside n128s6 / p96s6 / cuBLAS, Nsight Compute; carry .whl
#           build/lab-e2/libpq2.so). If it does not beat n128s6 by the 1.3x the issue asks, issue
#           37 has every route measured: resolve it with the gap (NOTES e1-e3-ncu has the figures).
#   call 2 (an H200 only): `pyq2 bench --synthetic bonsai-2-27b --whole --json F` at HEAD, commit
#           F as results/pyq2-bench-27b-whole-<date>-h200.json, run tools/bench/perf_page.py
#           (the page and README still show 2026-12-04's H200 run, before libpq2's attention).
echo "see the comments: run lab/run_o.sh, then the H200 bench"
