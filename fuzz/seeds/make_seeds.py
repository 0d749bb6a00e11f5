"""Seed inputs for the fuzz targets that need generated files (fuzz/corpus/<target>/).

    python3 fuzz/seeds/make_seeds.py MEGATRON_BINARY LLAMA3_TOKENIZER_DIR

Needs torch, safetensors, transformers and sentencepiece (Python). Run once when a target is
added or its input format changes; the seeds are committed, so campaigns and the test suite need
none of this. The hand-written seeds (chat lines, flags) are plain files in the corpus.
"""
import base64
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus")


def put(target, name, data):
    os.makedirs(os.path.join(root, target), exist_ok=True)
    with open(os.path.join(root, target, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors_seeds():
    import torch
    from safetensors.torch import save

    tensors = {"w": torch.randn(2, 3), "b": torch.randn(3).to(torch.bfloat16), "ids": torch.arange(4, dtype=torch.int64)}
    put("safetensors", "mixed.safetensors", save(tensors))
    put("safetensors", "fp16.safetensors", save({"a": torch.ones(2, 2, dtype=torch.float16), "e": torch.zeros(0, 4)}))
    # Our own writer's form: the crc32 of the data section in the metadata.
    plain = save({"x": torch.arange(6, dtype=torch.float32).reshape(2, 3)})
    n = struct.unpack("<Q", plain[:8])[0]
    header = json.loads(plain[8 : 8 + n])
    data = plain[8 + n :]
    header["__metadata__"] = {"crc32": "%08x" % (zlib.crc32(data) & 0xFFFFFFFF), "format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    put("safetensors", "crc32.safetensors", struct.pack("<Q", len(text)) + text + data)


def hf_config_seeds():
    import transformers as tf

    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    mla = dict(small, num_key_value_heads=4)  # a key and value per head
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    configs = {
        "llama.json": tf.LlamaConfig(**small, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
        "qwen2.json": tf.Qwen2Config(**small, tie_word_embeddings=True),
        "qwen3.json": tf.Qwen3Config(**small, head_dim=16),
        "mistral.json": tf.MistralConfig(**small),
        "mixtral.json": tf.MixtralConfig(**small, num_local_experts=4, num_experts_per_tok=2),
        "qwen2_moe.json": tf.Qwen2MoeConfig(**small, **moe, shared_expert_intermediate_size=32),
        "qwen3_moe.json": tf.Qwen3MoeConfig(**small, **moe, mlp_only_layers=[0]),
        "deepseek_v2.json": tf.DeepseekV2Config(**mla, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                                n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None,
                                                qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8),
        "deepseek_v3.json": tf.DeepseekV3Config(**mla, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                                n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24,
                                                qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_group=2, topk_group=1,
                                                rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                                              "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
    }
    for name, config in configs.items():
        put("hf_config", name, config.to_json_string())


def tiktoken_seeds():
    ranks = [bytes([b]) for b in range(256)] + [b"he", b"ll", b"hell", b"hello", b" w", b"or", b" wor", b"ld", b" world"]
    entries = [{"rank": r, "token_bytes": base64.b64encode(t).decode(), "token_str": t.decode("latin-1")} for r, t in enumerate(ranks)]
    put("tiktoken", "small.json", json.dumps(entries))


def sentencepiece_seeds():
    import sentencepiece as spm

    text = "\n".join(["hello world", "the quick brown fox jumps over the lazy dog", "caf\u00e9 \u6570\u5b57 12345"] * 20)
    for kind, size in (("bpe", 320), ("unigram", 40)):
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(text.split("\n")), model_writer=model, vocab_size=size,
                                       model_type=kind, byte_fallback=(kind == "bpe"), minloglevel=2,
                                       normalization_rule_name="identity")
        put("sentencepiece", kind + ".model", model.getvalue())


def sft_dataset_seeds(megatron, tokenizer_dir):
    lines = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]},
             {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"},
                           {"role": "assistant", "content": "4"}]},
             {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}]
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "chat.jsonl"), "w") as f:
            f.write("\n".join(json.dumps(l) for l in lines) + "\n")
        subprocess.run([megatron, "preprocess", "--sft", "--input", os.path.join(tmp, "chat.jsonl"), "--output-prefix",
                        os.path.join(tmp, "sft"), "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer_dir,
                        "--seq-length", "16", "--chat-template", "llama3"], check=True, stdout=subprocess.DEVNULL)
        parts = []
        for name in ("input_ids_document.idx", "input_ids_document.bin", "loss_mask_document.idx", "loss_mask_document.bin"):
            with open(os.path.join(tmp, "sft_" + name), "rb") as f:
                parts.append(f.read())
        put("sft_dataset", "llama3_seq16", b"\n#### next ####\n".join(parts))


if __name__ == "__main__":
    megatron, tokenizer_dir = sys.argv[1], sys.argv[2]
    safetensors_seeds()
    hf_config_seeds()
    tiktoken_seeds()
    sentencepiece_seeds()
    sft_dataset_seeds(megatron, tokenizer_dir)
