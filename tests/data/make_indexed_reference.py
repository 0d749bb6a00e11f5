#!/usr/bin/env python3
"""Writes a Megatron indexed dataset (.bin/.idx) with numpy, the way Megatron-LM writes it.

Reference for tests/data/test_indexed_dataset.cpp: the C++ builder must produce the same bytes.
Mirrors megatron/core/datasets/indexed_dataset.py (IndexedDatasetBuilder.add_document called by
tools/preprocess_data.py without --split-sentences, then _IndexWriter.write) without importing
megatron or torch, so only numpy is needed.

Tokens come from --tokens ("1 2 3;4 5;" = three documents, the last one empty) or are drawn from
--seed; --tokens-out then saves them, one document per line, so the caller can rebuild the same
dataset.
"""
import argparse
import struct
import sys

import numpy

_INDEX_HEADER = b"MMIDIDX\x00\x00"
# Megatron's DType enum: the on-disk code of each numpy dtype.
_DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5,
                "float64": 6, "float32": 7, "uint16": 8}


def parse_tokens(text):
    return [[int(t) for t in doc.split()] for doc in text.split(";")]


def random_documents(seed, num_docs, vocab, max_len):
    rng = numpy.random.default_rng(seed)
    docs = []
    for _ in range(num_docs):
        n = int(rng.integers(0, max_len + 1))  # 0 gives an empty document, which Megatron allows
        docs.append([int(t) for t in rng.integers(0, vocab, size=n)])
    return docs


def write_dataset(prefix, dtype_name, documents):
    dtype = getattr(numpy, dtype_name)
    info = numpy.iinfo(dtype)
    sequence_lengths = []
    document_indices = [0]
    with open(prefix + ".bin", "wb") as data_file:
        for doc in documents:
            if any(t < info.min or t > info.max for t in doc):
                sys.exit(f"token out of range for {dtype_name} in document {doc}")
            # preprocess_data.py: one sequence per non-empty document, none for an empty one.
            lengths = [len(doc)] if doc else []
            data_file.write(numpy.array(doc, dtype=dtype).tobytes(order="C"))
            sequence_lengths.extend(lengths)
            document_indices.append(len(sequence_lengths))

    itemsize = numpy.int64(numpy.dtype(dtype).itemsize)
    pointers = []
    pointer = numpy.int64(0)
    for length in sequence_lengths:
        pointers.append(pointer.item())
        pointer += length * itemsize

    with open(prefix + ".idx", "wb") as idx_file:
        idx_file.write(_INDEX_HEADER)
        idx_file.write(struct.pack("<Q", 1))
        idx_file.write(struct.pack("<B", _DTYPE_CODES[dtype_name]))
        idx_file.write(struct.pack("<Q", len(sequence_lengths)))
        idx_file.write(struct.pack("<Q", len(document_indices)))
        idx_file.write(numpy.array(sequence_lengths, dtype=numpy.int32).tobytes(order="C"))
        idx_file.write(numpy.array(pointers, dtype=numpy.int64).tobytes(order="C"))
        idx_file.write(numpy.array(document_indices, dtype=numpy.int64).tobytes(order="C"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", required=True, help="output path prefix (.bin/.idx added)")
    parser.add_argument("--dtype", required=True, choices=["uint8", "int8", "int16", "uint16",
                                                          "int32", "int64"])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tokens", help='documents separated by ";", tokens by spaces')
    source.add_argument("--seed", type=int, help="draw random documents from this seed")
    parser.add_argument("--num-docs", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=50000)
    parser.add_argument("--max-len", type=int, default=64)
    parser.add_argument("--tokens-out", help="save the documents here, one per line")
    args = parser.parse_args()

    if args.tokens is not None:
        documents = parse_tokens(args.tokens)
    else:
        documents = random_documents(args.seed, args.num_docs, args.vocab, args.max_len)
    write_dataset(args.prefix, args.dtype, documents)
    if args.tokens_out:
        with open(args.tokens_out, "w") as f:
            for doc in documents:
                f.write(" ".join(str(t) for t in doc) + "\n")


if __name__ == "__main__":
    main()
