#!/usr/bin/env python3
"""Writes tokenizer.json variants built with HF `tokenizers` from GPT-2's vocab.json and
merges.txt, one per pipeline feature the real files do not exercise (ByteLevel with its own
regex and prefix space, every Split behaviour, Digits, normalizers, added tokens with
lstrip/rstrip/single_word/normalized, templates). The C++ tests load each and compare ids with
`tokenizers` on the same file.

  make_variants.py VOCAB MERGES OUT_DIR   -> OUT_DIR/<name>.json, names printed one per line
"""
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers as pre
from tokenizers import processors

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def base(vocab, merges, **bpe):
    tok = Tokenizer(models.BPE.from_file(vocab, merges, **bpe))
    tok.decoder = decoders.ByteLevel()
    return tok


def byte_level(**kw):
    return pre.ByteLevel(add_prefix_space=kw.get("add_prefix_space", False),
                         use_regex=kw.get("use_regex", False))


def split_then_bytes(pattern, behavior, invert=False):
    return pre.Sequence([pre.Split(pattern, behavior=behavior, invert=invert), byte_level()])


def main():
    vocab, merges, out = sys.argv[1:4]
    variants = {}

    t = base(vocab, merges)
    t.pre_tokenizer = pre.ByteLevel(add_prefix_space=False)
    t.add_special_tokens(["<|endoftext|>"])
    variants["gpt2_bytelevel_regex"] = t

    t = base(vocab, merges)
    t.pre_tokenizer = pre.ByteLevel(add_prefix_space=True)
    t.post_processor = processors.ByteLevel(trim_offsets=True)
    variants["gpt2_prefix_space"] = t

    t = base(vocab, merges, ignore_merges=True)
    t.pre_tokenizer = pre.Sequence([pre.Split(Regex(LLAMA3), "isolated"),
                                    byte_level(add_prefix_space=True)])
    variants["split_then_prefix_space"] = t

    for behavior in ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]:
        t = base(vocab, merges)
        t.pre_tokenizer = split_then_bytes(Regex(r"\s+|[,.;]"), behavior)
        variants["split_regex_" + behavior] = t
    t = base(vocab, merges)
    t.pre_tokenizer = split_then_bytes(" ", "merged_with_next")
    variants["split_string_merged_with_next"] = t
    t = base(vocab, merges)
    t.pre_tokenizer = split_then_bytes(Regex(r"\p{L}+"), "isolated", invert=True)
    variants["split_invert"] = t

    # Oniguruma's meanings (HF's regex engine) where PCRE2's differ: `$` and `^` at every line
    # end and start, `\h` a hex digit, POSIX classes over Unicode, zero-width matches.
    for name, pattern in [("dollar", r"$"), ("caret", r"^"), ("line_ends", r"[a-z]+$|^\s"), ("end_z", r"\s*\Z"),
                          ("hex_h", r"\h+"), ("posix_alpha", r"[[:alpha:]]+"), ("posix_punct", r"[[:punct:]]+"),
                          ("posix_space", r"[[:space:]]+"), ("lookahead_zero_width", r"(?=\s)"), ("word_boundary", r"\b"),
                          ("word", r"\w+"), ("posix_alnum_class", r"[[:alnum:]_']+"), ("dot_all", r"(?m:a.)"),
                          ("posix_case", r"[[:upper:]][[:lower:]]*"), ("posix_xdigit_blank", r"[[:xdigit:]]+|[[:blank:]]+")]:
        t = base(vocab, merges)
        t.pre_tokenizer = split_then_bytes(Regex(pattern), "isolated")
        variants["oniguruma_" + name] = t

    # A Replace normalizer's regex matching the empty string inside a text (a camelCase boundary):
    # HF inserts the content there.
    t = base(vocab, merges)
    t.normalizer = normalizers.Replace(Regex(r"(?<=[a-z])(?=[A-Z])"), " ")
    t.pre_tokenizer = byte_level(use_regex=True)
    variants["replace_zero_width"] = t

    t = base(vocab, merges)
    t.pre_tokenizer = pre.Sequence([pre.Digits(individual_digits=True), byte_level(use_regex=True)])
    variants["digits_individual"] = t
    t = base(vocab, merges)
    t.pre_tokenizer = pre.Sequence([pre.Digits(individual_digits=False), byte_level(use_regex=True)])
    variants["digits_grouped"] = t

    t = base(vocab, merges)
    t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Strip(),
                                         normalizers.Replace(Regex(r"\d+"), "#"),
                                         normalizers.Replace("e", "E")])
    t.pre_tokenizer = byte_level(use_regex=True)
    variants["normalizers"] = t
    t = base(vocab, merges)
    t.normalizer = normalizers.NFD()
    t.pre_tokenizer = byte_level(use_regex=True)
    variants["nfd"] = t

    t = base(vocab, merges)
    t.normalizer = normalizers.Replace("x", "y")
    t.pre_tokenizer = byte_level(use_regex=True)
    t.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True),
                          AddedToken("[SW]", single_word=True)])
    t.add_tokens([AddedToken("hello", normalized=True), AddedToken("yes", normalized=True),
                  AddedToken("<|im_start|>", normalized=False, rstrip=True)])
    t.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A <mask>", special_tokens=[("<|endoftext|>", 50256), ("<mask>", 50257)])
    variants["added_tokens_template"] = t

    t = base(vocab, merges)
    t.pre_tokenizer = byte_level(use_regex=True)
    t.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 1))
    variants["roberta_processing"] = t

    for name, tok in variants.items():
        tok.save(f"{out}/{name}.json")
        print(name)


if __name__ == "__main__":
    main()
