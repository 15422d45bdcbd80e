#!/usr/bin/env python3
"""`pyq2 generate` itself on a 27B-shaped GGUF file: the command as a user runs it, from the file
to text, timed.

Writes the preset's synthetic file (tools/bench/synthetic_gguf.py; or takes --model), then runs
`pyq2 generate FILE -p TEXT -n N --ignore-eos --json` as a child process with a prompt of about
--prompt tokens (a repeated sentence) --runs times (default 2: a machine's first run also
compiles the Triton kernels into Triton's on-disk cache, a later one finds them there), and
records each run's wall time (file loading included), its timings (load, time to first token,
prompt and decode tokens/s) and the start of its text; "timings" is the last run's. The
results are evidence for tools/bench/NOTES.md (kind "generate" in perf_page.py's EVIDENCE).
Needs a GPU for the 27B.

    python3 tools/bench/bench_generate.py --json tools/bench/results/generate-DATE-27b-h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SENTENCE = "The ship came back in the spring, and the town by the river woke up early. "


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a qwen35 GGUF file (default: write the preset's)")
    ap.add_argument("--preset", default="bonsai-2-27b")
    ap.add_argument("--prompt", type=int, default=2048, help="prompt tokens, about (default 2048)")
    ap.add_argument("-n", type=int, default=256, help="tokens to generate (default 256)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"))
    ap.add_argument("--runs", type=int, default=2, help="runs of the command (default 2)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory(prefix="pyq2-bench-generate-") as tmp:
        model = args.model
        write_s = None
        if model is None:
            model = os.path.join(tmp, f"synthetic-{args.preset}.gguf")
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, os.path.join(ROOT, "tools", "bench", "synthetic_gguf.py"),
                 args.preset, model], check=True, env=env,
            )  # fmt: skip
            write_s = time.perf_counter() - t0
        text = SENTENCE * max(1, args.prompt // 21)  # 21 tokens of the demo tokenizer
        cmd = [sys.executable, "-m", "pyq2", "generate", model, "-p", text, "-n", str(args.n),
               "--ignore-eos", "--device", args.device, "--json"]  # fmt: skip
        runs = []
        name = args.model or f"synthetic {args.preset} (tools/bench/synthetic_gguf.py)"
        for i in range(max(1, args.runs)):
            t0 = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            wall_s = time.perf_counter() - t0
            if p.returncode != 0:
                print(p.stderr, file=sys.stderr)
                return p.returncode
            out = json.loads(p.stdout)
            t, r = out["timings"], out["results"][0]
            runs.append({"command_wall_s": wall_s, "tokens": r["tokens"], "finish": r["finish"],
                         "timings": t})  # fmt: skip
            print(
                f"run {i + 1}: pyq2 generate on {name}: load {t['load_s']:.1f} s; "
                f"{t['prompt_tokens']}-token prompt, first token after "
                f"{t['time_to_first_token_s'] * 1e3:.1f} ms ({t['prompt_tokens_per_s']:.0f} "
                f"tokens/s); {r['tokens']} tokens at {t['decode_tokens_per_s']:.1f} tokens/s "
                f"({t['decode_graphs']} graphs captured in {t['decode_graphs_s'] * 1e3:.0f} ms "
                f"before); the command took {wall_s:.1f} s ({t['backend']})"
            )
    res = {
        "model": name,
        "write_s": write_s,
        "runs": runs,
        "command_wall_s": runs[-1]["command_wall_s"],
        "tokens": r["tokens"],
        "finish": r["finish"],
        "text_start": r["text"][:200],
        "timings": t,
        "commit": os.environ.get("PQ2_COMMIT"),
    }
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
