#!/usr/bin/env python3
"""Megatron's TikTokenizer as the reference for the C++ one.

  tiktoken_reference.py vocab --from-hf tokenizer.json --out vocab.json
      Writes Megatron's tiktoken vocabulary (a JSON list of {rank, token_bytes, token_str})
      from a byte-level BPE tokenizer.json (Llama 3's): its tokens as raw bytes, the 256 single
      bytes first as Megatron requires (ranks 0-255 = bytes 0-255), the rest in the file's
      order, so merges keep their relative priority.

  tiktoken_reference.py ids --vocab vocab.json --texts texts.json [--pattern v1|v2]
          [--vocab-size N] [--num-special N] [--special-tokens T ...]
      Prints JSON: per text, megatron-core's TikTokenTokenizer.text_to_ids and tiktoken's decode
      of those ids, plus the tokenizer's vocab_size, bos_id, eos_id and eod (tiktoken from PyPI).
"""
import argparse
import base64
import json
import sys


def gpt2_byte_decoder():
    """GPT-2's byte-level alphabet: printable bytes map to themselves, the rest to U+0100 on."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def write_vocab(tokenizer_json, out):
    with open(tokenizer_json, encoding="utf-8") as f:
        model = json.load(f)["model"]
    decoder = gpt2_byte_decoder()
    by_id = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [bytes(decoder[ch] for ch in token) for token, _ in by_id]
    singles = [bytes([b]) for b in range(256)]
    assert set(singles) <= set(tokens), "a byte-level vocabulary holds every single byte"
    ordered = singles + [t for t in tokens if len(t) > 1]
    entries = [{"rank": i, "token_bytes": base64.b64encode(t).decode("ascii"),
                "token_str": t.decode("utf-8", errors="replace")} for i, t in enumerate(ordered)]
    with open(out, "w", encoding="utf-8") as f:
        json.dump(entries, f)


def reference_ids(args):
    from megatron.core.tokenizers.text.libraries.tiktoken_tokenizer import TikTokenTokenizer

    kwargs = {"pattern": args.pattern, "num_special_tokens": args.num_special}
    if args.vocab_size:
        kwargs["vocab_size"] = args.vocab_size
    if args.special_tokens:
        kwargs["special_tokens"] = args.special_tokens
    tok = TikTokenTokenizer(args.vocab, **kwargs)
    with open(args.texts, encoding="utf-8") as f:
        texts = json.load(f)
    ids = [tok.text_to_ids(t) for t in texts]
    # megatron-core 0.16.1's ids_to_text decodes token by token, so a character split across two
    # tokens becomes U+FFFD; Megatron-LM's main branch decodes with tiktoken's decode (the bytes
    # joined first), as the C++ tokenizer does.
    out = {"ids": ids, "decoded": [tok.tokenizer.decode(i) for i in ids], "vocab_size": tok.vocab_size,
           "bos_id": tok.bos_id, "eos_id": tok.eos_id, "eod": tok.eod}
    json.dump(out, sys.stdout, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command", required=True)
    v = sub.add_parser("vocab")
    v.add_argument("--from-hf", required=True)
    v.add_argument("--out", required=True)
    r = sub.add_parser("ids")
    r.add_argument("--vocab", required=True)
    r.add_argument("--texts", required=True)
    r.add_argument("--pattern", default="v2")
    r.add_argument("--vocab-size", type=int, default=0)
    r.add_argument("--num-special", type=int, default=1000)
    r.add_argument("--special-tokens", nargs="+")
    args = ap.parse_args()
    if args.command == "vocab":
        write_vocab(args.from_hf, args.out)
    else:
        reference_ids(args)


if __name__ == "__main__":
    main()
