"""Reference renderings for tests/data/test_sft_data.cpp: conversations -> token ids (and, where a
template marks them, the assistant-token mask) with transformers' apply_chat_template on the real
tokenizer files.

  sft_reference.py TOKENIZER_DIR MODE IN.json OUT.json
    MODE qwen3   the tokenizer's own chat template (Qwen3's), ids only
    MODE chatml  plain ChatML written here as a Jinja template, with {% generation %} around each
                 assistant content + <|im_end|>: ids and return_assistant_tokens_mask
    MODE llama3  ids from the tokenizer's own Llama 3 template (its unconditional trailing
                 generation prompt cut off), mask from the same template written here with
                 {% generation %} around content|trim + <|eot_id|>; both renderings must agree
IN.json: a list of conversations (lists of {"role", "content"}); OUT.json: [{"ids", "mask"}].
"""
import json
import sys

from transformers import AutoTokenizer

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ m['content'] + '<|im_end|>' }}{% endif %}{{ '\\n' }}{% endfor %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{% else %}{{ m['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}"
)
GENERATION_PROMPT = "<|start_header_id|>assistant<|end_header_id|>\n\n"


def with_mask(tok, conv, template):
    out = tok.apply_chat_template(conv, chat_template=template, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def main():
    tok_dir, mode, in_path, out_path = sys.argv[1:5]
    tok = AutoTokenizer.from_pretrained(tok_dir)
    results = []
    for conv in json.load(open(in_path, encoding="utf-8")):
        if mode == "qwen3":
            ids = list(tok.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"])
            results.append({"ids": ids, "mask": None})
        elif mode == "chatml":
            ids, mask = with_mask(tok, conv, CHATML)
            results.append({"ids": ids, "mask": mask})
        elif mode == "llama3":
            text = tok.apply_chat_template(conv, tokenize=False)
            assert text.endswith(GENERATION_PROMPT), repr(text[-80:])
            ids = tok(text[: -len(GENERATION_PROMPT)], add_special_tokens=False)["input_ids"]
            ids2, mask = with_mask(tok, conv, LLAMA3)
            assert ids == ids2, "the hand-written Llama 3 template disagrees with the tokenizer's own"
            results.append({"ids": ids, "mask": mask})
        else:
            raise SystemExit("unknown mode " + mode)
    json.dump(results, open(out_path, "w"))


if __name__ == "__main__":
    main()
