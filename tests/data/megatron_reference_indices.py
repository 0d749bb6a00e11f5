#!/usr/bin/env python3
"""Reference indices and samples from megatron-core itself, for tests/data/test_gpt_dataset.cpp.

Usage: megatron_reference_indices.py SPEC OUT_DIR

SPEC is a text file, one case per line, fields separated by " | ":
  gpt | NAME | DATA_PATH (space separated) | SPLIT | TRAIN VALID TEST | SEQ_LENGTH | SEED | EOD |
      RESET_POSITION_IDS RESET_ATTENTION_MASK EOD_MASK_LOSS | NUM_GET
SPLIT "per_split" makes DATA_PATH three blends separated by ";", one per split ("-" for none),
built as blend_per_split (Megatron's --train-data-path, --valid-data-path, --test-data-path).
  numpy | NAME | SEEDS (space separated) | LENGTHS | MAXES
For a gpt case the datasets are built with BlendedMegatronDatasetBuilder + GPTDatasetConfig on
CPU (no cache directory for blends, which megatron-core only writes under torch.distributed),
and OUT_DIR/NAME/ receives, per split i that exists:
  split{i}-meta.txt: "kind gpt|blend", "size N", for a blend "datasets K"
  GPTDataset:   split{i}-{document,sample,shuffle}_index.npy as numpy.save writes them (the same
                bytes Megatron puts in its cache)
  blend:        split{i}-dataset_index.npy, split{i}-dataset_sample_index.npy and
                split{i}-d{j}-{document,sample,shuffle}_index.npy per contributing dataset
  split{i}-{tokens,labels,loss_mask,position_ids,attention_mask}.npy: int64 stacks of
                dataset[k] for k < NUM_GET (attention_mask 1 = masked)
A numpy case writes, per seed: NAME-state-{seed}.npy (get_state() key then pos; NAME-keystate-
{seed}.npy for the array seed [seed, seed ^ 0x5A5A5A5A, 3]), per seed and
length: NAME-shuffle-{seed}-{n}.npy (shuffled int64 arange) and NAME-shuffle32-{seed}-{n}.npy
(int32), per seed NAME-interval-{seed}.npy (randint(0, m + 1) for each max m, one state), and
NAME-sum.npy (float64 bits of numpy.sum over prefixes of a fixed weight list, as int64).
"""
import os
import sys
import warnings
from collections import OrderedDict

import numpy


def gpt_case(fields, out_dir):
    import torch
    from megatron.core.datasets.blended_dataset import BlendedDataset
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    name, data_path, split, sizes, seq_length, seed, eod, flags, num_get = fields
    sizes = [int(s) for s in sizes.split()]
    reset_position_ids, reset_attention_mask, eod_mask_loss = [f == "1" for f in flags.split()]

    class Tokenizer:
        """The tokenizer attributes GPTDataset reads; no pad, so Megatron pads with -1."""

        def __init__(self, eod):
            self.eod = eod
            self.vocab_size = 65536
            self.unique_identifiers = OrderedDict(cls="ReferenceStubTokenizer", eod=eod)

    if split == "per_split":
        # Each split's own blend (--train-data-path etc.), "-" for none, split by ";".
        own = [b.split() for b in data_path.split(";")]
        blend, blend_per_split, split = None, [None if b == ["-"] else get_blend_from_list(b) for b in own], None
    else:
        blend, blend_per_split = get_blend_from_list(data_path.split()), None
    config = GPTDatasetConfig(
        random_seed=int(seed),
        sequence_length=int(seq_length),
        blend=blend,
        blend_per_split=blend_per_split,
        split=split,
        path_to_cache=None,
        tokenizer=Tokenizer(int(eod)),
        reset_position_ids=reset_position_ids,
        reset_attention_mask=reset_attention_mask,
        eod_mask_loss=eod_mask_loss,
    )
    datasets = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
    case_dir = os.path.join(out_dir, name)
    os.makedirs(case_dir, exist_ok=True)
    path = lambda f: os.path.join(case_dir, f)

    def save_gpt(prefix, ds):
        numpy.save(path(prefix + "-document_index.npy"), ds.document_index, allow_pickle=True)
        numpy.save(path(prefix + "-sample_index.npy"), ds.sample_index, allow_pickle=True)
        numpy.save(path(prefix + "-shuffle_index.npy"), ds.shuffle_index, allow_pickle=True)

    for i, ds in enumerate(datasets):
        if ds is None:
            continue
        meta = []
        if isinstance(ds, BlendedDataset):
            meta += ["kind blend", f"size {len(ds)}", f"datasets {len(ds.datasets)}"]
            numpy.save(path(f"split{i}-dataset_index.npy"), ds.dataset_index, allow_pickle=True)
            numpy.save(path(f"split{i}-dataset_sample_index.npy"), ds.dataset_sample_index,
                       allow_pickle=True)
            for j, sub in enumerate(ds.datasets):
                save_gpt(f"split{i}-d{j}", sub)
        else:
            meta += ["kind gpt", f"size {len(ds)}"]
            save_gpt(f"split{i}", ds)
        with open(path(f"split{i}-meta.txt"), "w") as f:
            f.write("\n".join(meta) + "\n")
        items = [ds[k] for k in range(min(int(num_get), len(ds)))]
        for key in ["tokens", "labels", "loss_mask", "position_ids", "attention_mask"]:
            stack = numpy.stack([torch.as_tensor(item[key]).to(torch.int64).numpy() for item in items])
            if key == "attention_mask":
                stack = stack.reshape(len(items), int(seq_length), int(seq_length))
            numpy.save(path(f"split{i}-{key}.npy"), stack.astype(numpy.int64))


def numpy_case(fields, out_dir):
    name, seeds, lengths, maxes = fields
    path = lambda f: os.path.join(out_dir, f)
    for seed in [int(s) for s in seeds.split()]:
        state = numpy.random.RandomState(seed).get_state()
        numpy.save(path(f"{name}-state-{seed}.npy"),
                   numpy.concatenate([state[1].astype(numpy.int64), [state[2]]]))
        # An array seed goes through init_by_array.
        key = numpy.array([seed, seed ^ 0x5A5A5A5A, 3], dtype=numpy.int64)
        state = numpy.random.RandomState(key).get_state()
        numpy.save(path(f"{name}-keystate-{seed}.npy"),
                   numpy.concatenate([state[1].astype(numpy.int64), [state[2]]]))
        for n in [int(x) for x in lengths.split()]:
            for dtype, tag in [(numpy.int64, "shuffle"), (numpy.int32, "shuffle32")]:
                a = numpy.arange(n, dtype=dtype)
                numpy.random.RandomState(seed).shuffle(a)
                numpy.save(path(f"{name}-{tag}-{seed}-{n}.npy"), a.astype(numpy.int64))
        rs = numpy.random.RandomState(seed)
        draws = [rs.randint(0, int(m) + 1, dtype=numpy.int64) for m in maxes.split()]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            draws.append(rs.random_integers(-5, 5))
        draws.append(rs.randint(-(2**40), 2**40))
        numpy.save(path(f"{name}-interval-{seed}.npy"), numpy.array(draws, dtype=numpy.int64))
    weights = numpy.random.RandomState(7).uniform(0.001, 1000.0, size=300) ** 2
    sums = [numpy.sum(weights[:n]) for n in range(1, len(weights) + 1)]
    numpy.save(path(f"{name}-weights.npy"), weights.view(numpy.int64))
    numpy.save(path(f"{name}-sum.npy"), numpy.array(sums, dtype=numpy.float64).view(numpy.int64))


def main():
    spec, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    with open(spec) as f:
        for line in f:
            if not line.strip():
                continue
            fields = [x.strip() for x in line.split(" | ")]
            if fields[0] == "gpt":
                print(f"megatron_reference_indices.py: case {fields[1]}", file=sys.stderr)
                gpt_case(fields[1:], out_dir)
            elif fields[0] == "numpy":
                numpy_case(fields[1:], out_dir)
            else:
                sys.exit(f"unknown case kind {fields[0]!r}")


if __name__ == "__main__":
    main()
