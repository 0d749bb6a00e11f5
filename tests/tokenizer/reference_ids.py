#!/usr/bin/env python3
"""Reference token ids from HF `tokenizers` (the Rust implementation users compare against),
or from `transformers` for tokenizer_config.json behaviour, for the C++ tokenizer tests.

Input: a JSON file holding a list of strings. Output (stdout): JSON with, per text, the ids
and the decoded ids (special tokens kept), plus vocabulary facts.

  reference_ids.py --texts texts.json --tokenizer tokenizer.json [--add-special-tokens]
  reference_ids.py --texts texts.json --gpt2 vocab.json merges.txt
  reference_ids.py --texts texts.json --transformers DIR
"""
import argparse
import json
import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", required=True)
    ap.add_argument("--tokenizer", help="tokenizer.json, loaded with tokenizers.Tokenizer")
    ap.add_argument("--gpt2", nargs=2, metavar=("VOCAB", "MERGES"),
                    help="GPT-2 vocab.json + merges.txt, byte-level BPE without added tokens")
    ap.add_argument("--transformers", help="directory for transformers.AutoTokenizer")
    ap.add_argument("--add-special-tokens", action="store_true")
    args = ap.parse_args()
    with open(args.texts, encoding="utf-8") as f:
        texts = json.load(f)

    out = {}
    if args.transformers:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(args.transformers)
        out["ids"] = [tok(t).input_ids for t in texts]
        out["bos_id"] = tok.bos_token_id
        out["eos_id"] = tok.eos_token_id
        out["vocab_size"] = len(tok)
    else:
        import tokenizers
        if args.gpt2:
            tok = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(*args.gpt2))
            tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = tokenizers.decoders.ByteLevel()
        else:
            tok = tokenizers.Tokenizer.from_file(args.tokenizer)
        encodings = [tok.encode(t, add_special_tokens=args.add_special_tokens) for t in texts]
        out["ids"] = [e.ids for e in encodings]
        out["decoded"] = [tok.decode(e.ids, skip_special_tokens=False) for e in encodings]
        out["vocab_size"] = tok.get_vocab_size(with_added_tokens=True)
        out["version"] = tokenizers.__version__
    json.dump(out, fp=__import__("sys").stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
