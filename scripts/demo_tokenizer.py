"""A small byte-level BPE vocabulary for the demo corpus, trained with HF `tokenizers` (the
library behind every tokenizer.json). With the Llama 2 tokenizer's 32000 ids a model that
trains for minutes on 2 cores learns little more than word frequencies; 8192 ids fitted to
the corpus (most of its words one id each) leave it the capacity for phrases.

  python demo_tokenizer.py CORPUS.jsonl OUT_DIR [VOCAB_SIZE (default 8192)]
Writes OUT_DIR/tokenizer.json and tokenizer_config.json (EOS "<|endoftext|>"; ChatML's
"<|im_start|>" and "<|im_end|>" as special tokens).
"""
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

corpus, out = sys.argv[1], sys.argv[2]
vocab_size = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
os.makedirs(out, exist_ok=True)
tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
# ChatML's markers too, so that `megatron serve` finds a chat template (the model never saw them:
# it answers in the corpus's voice).
trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)


def texts():
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


tokenizer.train_from_iterator(texts(), trainer)
tokenizer.save(f"{out}/tokenizer.json")
with open(f"{out}/tokenizer_config.json", "w") as f:
    json.dump({"eos_token": "<|endoftext|>", "bos_token": None, "add_bos_token": False, "add_eos_token": False,
               "model_max_length": 1024}, f, indent=1)
print(f"   a {tokenizer.get_vocab_size()}-id byte-level BPE vocabulary in {out}/tokenizer.json")
