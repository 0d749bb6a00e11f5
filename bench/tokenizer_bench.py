#!/usr/bin/env python3
"""HF tokenizers baseline for bench/tokenizer_bench.sh: encodes each line of a file, one call
per line, on one thread, and prints the same JSON fields as tokenizer_bench.cpp.

  tokenizer_bench.py (--tokenizer FILE | --gpt2 VOCAB MERGES) --input lines.txt [--repeat N]
"""
import argparse
import json
import os
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"

import tokenizers  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer")
    ap.add_argument("--gpt2", nargs=2)
    ap.add_argument("--input", required=True)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    with open(args.input, encoding="utf-8", newline="\n") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    t_load = time.perf_counter()
    if args.gpt2:
        tok = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(*args.gpt2))
        tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok = tokenizers.Tokenizer.from_file(args.tokenizer)
    load_s = time.perf_counter() - t_load
    n_bytes = sum(len(line.encode("utf-8")) for line in lines) * args.repeat
    tokens = 0
    checksum = 0
    t0 = time.perf_counter()
    for _ in range(args.repeat):
        for line in lines:
            ids = tok.encode(line, add_special_tokens=False).ids
            tokens += len(ids)
    seconds = time.perf_counter() - t0
    # The checksum pass is outside the timing: it is slow in Python.
    for _ in range(args.repeat):
        for line in lines:
            for i in tok.encode(line, add_special_tokens=False).ids:
                checksum = (checksum * 1000003 + i) % (1 << 64)
    print(json.dumps({"impl": "hf-tokenizers " + tokenizers.__version__, "bytes": n_bytes,
                      "lines": len(lines) * args.repeat, "tokens": tokens,
                      "seconds": round(seconds, 3), "MB_per_s": round(n_bytes / seconds / 1e6, 2),
                      "tokens_per_s": round(tokens / seconds), "load_s": round(load_s, 2),
                      "checksum": checksum}))


if __name__ == "__main__":
    main()
