#!/usr/bin/env python3
"""Python baseline for bench/preprocess_bench.sh: the work of Megatron's preprocess_data.py
(read JSONL, json.loads, tokenize with HF `tokenizers`, append EOD, write the tokens) as a plain
loop, either one encode call per document on one thread, or encode_batch over chunks of
documents (Rust threads, RAYON_NUM_THREADS of them). Prints one JSON line.

  preprocess_bench.py --tokenizer tokenizer.json --input F.jsonl --out F.bin [--batch N] [--eod ID]
"""
import argparse
import json
import os
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=0, help="0: one encode per document; N: encode_batch of N")
    ap.add_argument("--eod", type=int, default=128001)
    args = ap.parse_args()
    if args.batch == 0:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        os.environ["RAYON_NUM_THREADS"] = "1"
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(args.tokenizer)
    t0 = time.perf_counter()
    n_bytes = 0
    tokens = 0
    with open(args.input, "rb") as f, open(args.out, "wb") as out:
        def emit(ids_list):
            nonlocal tokens
            for ids in ids_list:
                arr = np.array(ids + [args.eod], dtype=np.int32)
                tokens += arr.size
                arr.tofile(out)

        pending = []
        for raw in f:
            n_bytes += len(raw)
            text = json.loads(raw)["text"]
            if args.batch == 0:
                emit([tok.encode(text, add_special_tokens=False).ids])
            else:
                pending.append(text)
                if len(pending) == args.batch:
                    emit([e.ids for e in tok.encode_batch(pending, add_special_tokens=False)])
                    pending = []
        if pending:
            emit([e.ids for e in tok.encode_batch(pending, add_special_tokens=False)])
    seconds = time.perf_counter() - t0
    impl = "python hf-tokenizers " + tokenizers.__version__ + (
        " encode (1 thread)" if args.batch == 0
        else f" encode_batch({args.batch}) ({os.environ.get('RAYON_NUM_THREADS', 'all')} threads)")
    print(json.dumps({"impl": impl, "MB": round(n_bytes / 1e6, 2), "seconds": round(seconds, 2),
                      "MB/s": round(n_bytes / 1e6 / seconds, 2), "tokens": tokens}))


if __name__ == "__main__":
    main()
