# The next session's GPU calls, most wanted first (written 2026-12-07, sixth session).
# Restore the lab: git checkout <the lab commit named in NOTES> -- lab && git rm -r -q --cached lab
# Build: cmake --build build/dev-gpu; the seg library and the ring probe (commands in lab/run_r.sh's
# head and lab/run_q.sh's head). Wheels in .whl (lab/dev.sh).
#   call 1: bash lab/run_r.sh (issue 36: WR with its fixed costs taken out (32-bit sums, one bulk
#           copy of the operand, cta_produce's loads ahead), then the ring ceiling probe). Trimmed to
#           2 WR variants x modes 3/0/2/5; widen probe_seg.py's run_wr lists (NW 8/16 x CH 2/4/8,
#           mode 4 spin 2000) when the device time allows. Expected: mode 0 and 2 toward the copies'
#           1.02-1.06x if the fixed costs were the sums and the staging (segment-wr-measured).
#   call 2 (an H200 only): `pyq2 bench --synthetic bonsai-2-27b --whole --json F` at HEAD, commit
#           F as results/pyq2-bench-27b-whole-<date>-h200.json, run tools/bench/perf_page.py
#           (the page and README still show 2026-12-04's H200 run, before libpq2's attention).
echo "see the comments: run lab/run_r.sh, then the H200 bench"
