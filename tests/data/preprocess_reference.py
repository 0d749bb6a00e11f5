#!/usr/bin/env python3
"""Reference for tests/data/test_preprocess.cpp: what Megatron-LM's tools/preprocess_data.py
writes for a JSONL file with a Hugging Face tokenizer, using the real pieces it is made of:
transformers' AutoTokenizer (HF `tokenizers` underneath) as megatron.core.tokenizers'
HuggingFaceTokenizer calls it, and megatron-core's own IndexedDatasetBuilder.

Megatron's Encoder: a string value is one sentence, a list value one sentence per element;
empty sentences are dropped; with --append-eod the EOD id (the tokenizer's eos_token) follows a
non-empty document; builder.add_document(ids, sentence_lengths). Token ids: without
--tokenizer-hf-include-special-tokens Megatron maps tokenize(text) to ids (no BOS/EOS); with it,
tokenizer(text).input_ids (post-processor specials, e.g. Llama 3's BOS).
Blank lines are skipped (Megatron itself would stop at them).

  preprocess_reference.py --input F.jsonl[.gz] --output-prefix P --tokenizer-model DIR
                          [--json-keys text ...] [--append-eod] [--include-special-tokens]
"""
import argparse
import gzip
import json
import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--output-prefix", required=True)
    ap.add_argument("--tokenizer-model", required=True)
    ap.add_argument("--json-keys", nargs="+", default=["text"])
    ap.add_argument("--append-eod", action="store_true")
    ap.add_argument("--include-special-tokens", action="store_true")
    args = ap.parse_args()

    tok = AutoTokenizer.from_pretrained(args.tokenizer_model)

    def tokenize(text):
        if args.include_special_tokens:
            return tok(text).input_ids
        return tok.convert_tokens_to_ids(tok.tokenize(text))

    eod = tok.convert_tokens_to_ids([tok.eos_token])[0]
    dtype = DType.optimal_dtype(len(tok))
    builders = {}
    for key in args.json_keys:
        prefix = f"{args.output_prefix}_{key}_document"
        builders[key] = (IndexedDatasetBuilder(prefix + ".bin", dtype=dtype), prefix + ".idx")

    opener = gzip.open if args.input.endswith(".gz") else open
    with opener(args.input, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            data = json.loads(line)
            for key in args.json_keys:
                value = data[key]
                sentences = value if isinstance(value, list) else [value]
                doc_ids, lens = [], []
                for sentence in sentences:
                    ids = tokenize(sentence)
                    if ids:
                        doc_ids.extend(ids)
                        lens.append(len(ids))
                if doc_ids and args.append_eod:
                    doc_ids.append(eod)
                    lens[-1] += 1
                builders[key][0].add_document(doc_ids, lens)
    for builder, idx in builders.values():
        builder.finalize(idx)


if __name__ == "__main__":
    main()
