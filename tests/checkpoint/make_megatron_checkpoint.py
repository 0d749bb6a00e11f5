#!/usr/bin/env python3
"""Fixture: write real Megatron-LM checkpoints of a tiny Llama-style GPT, plus a reference loss.

Uses megatron-core itself (CPU only, gloo) so the C++ checkpoint reader is tested against
bytes produced by the reference implementation rather than by our own understanding of it.

Output layout (each sub-directory is what `--save <dir>` would contain in megatron.training):
  <out>/torch_dist/latest_checkpointed_iteration.txt      "1"
  <out>/torch_dist/iter_0000001/{.metadata,__<rank>_<n>.distcp,common.pt,metadata.json}
  <out>/torch/latest_checkpointed_iteration.txt           "1"
  <out>/torch/iter_0000001/mp_rank_XX/model_optim_rng.pt  (one per TP rank)
  <out>/reference.json   model shape, token batch, labels, per-token and mean loss
  <out>/data_text_document.{bin,idx}   with --data: an indexed dataset; reference.json then also
                         holds "batch_losses", the losses on the first two training batches
                         megatron-core's GPTDataset draws from it (split 100,0,0, --seed): the
                         checkpoint's iteration 1 consumed the first, a resumed run's iteration
                         2 takes the second

Usage:
  python make_megatron_checkpoint.py --out /tmp/ckpt [--format both] [--tp 1|2] [--pp 1|2 [--vpp 1|2]]
      [--moe [--moe-every-layer] [--ep 1|2]] [--mla] [--mtp] [--data]
With --tp 2 the TP=1 torch_dist checkpoint is written first, then loaded (resharded by
megatron) into a TP=2 model, so both variants hold the same global weights and loss. --ep 2 does
the same for two expert-parallel ranks (under <out>/ep2/; legacy mp_rank_00_000 and _001), --pp 2
for two pipeline stages (legacy only, under <out>/pp2/: mp_rank_00_000 and _001; with --vpp 2 each
holds two virtual chunks, model0 and model1).

--mla gives it DeepSeek's multi-latent attention (MLA_ARGS); with --moe, a tiny DeepSeek-V3.
--moe makes the GPT a mixture of experts as DeepSeek-V3 routes (3 layers, the middle one dense:
moe_layer_freq [1,0,1]; 4 experts of which 2 per token, sigmoid scores, a random expert bias, a
top-k scaling factor; a shared expert with Qwen2-MoE's sigmoid gate), its experts SequentialMLP
(the local spec; TEGroupedMLP saves the same torch_dist keys).
"""
import argparse
import contextlib
import faulthandler
import json
import os
import shutil
import socket
import sys
import time
import warnings
from argparse import Namespace

warnings.filterwarnings("ignore")  # megatron warns loudly about missing TE/apex
import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output root directory (recreated)")
    p.add_argument("--format", choices=["torch_dist", "torch", "both"], default="both")
    p.add_argument("--tp", type=int, choices=[1, 2], default=1,
                   help="2 additionally writes TP=2 checkpoints under <out>/tp2/")
    p.add_argument("--ep", type=int, choices=[1, 2], default=1,
                   help="2 additionally writes expert-parallel (EP=2) torch_dist and legacy checkpoints under <out>/ep2/")
    p.add_argument("--pp", type=int, choices=[1, 2], default=1,
                   help="2 additionally writes a legacy checkpoint of two pipeline stages under <out>/pp2/")
    p.add_argument("--vpp", type=int, choices=[1, 2], default=1,
                   help="with --pp 2: each stage holds 2 virtual pipeline chunks (needs --num-layers 4)")
    p.add_argument("--moe", action="store_true", help="a mixture-of-experts GPT (see above)")
    p.add_argument("--mla", action="store_true",
                   help="DeepSeek's multi-latent attention (see MLA_ARGS) in place of GQA")
    p.add_argument("--mtp", action="store_true",
                   help="one multi-token prediction depth (DeepSeek-V3's); reference.json then holds its loss, mtp_loss")
    p.add_argument("--moe-every-layer", action="store_true",
                   help="with --moe: all 3 layers MoE (moe_layer_freq 1), so torch_dist stacks them over layers and experts")
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--ffn-hidden-size", type=int, default=128)
    p.add_argument("--num-attention-heads", type=int, default=4)
    p.add_argument("--num-query-groups", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=128)
    p.add_argument("--seq-length", type=int, default=16)
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--rotary-base", type=int, default=10000)
    p.add_argument("--norm-epsilon", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--data", action="store_true",
                   help="also write an indexed dataset and the loss on GPTDataset's first training batch")
    return p.parse_args(argv)


def patch_megatron_for_cpu():
    """Minimal patches so megatron-core's forward runs without CUDA."""
    from megatron.core.tensor_parallel import random as mrandom

    # The CUDA RNG tracker's fork() saves/restores torch.cuda RNG state around dropout
    # (attention_dropout in DotProductAttention). Dropout is 0 here, so no random numbers are
    # drawn and forking is a no-op semantically; make it a plain context manager.
    mrandom.CudaRNGStatesTracker.fork = contextlib.contextmanager(lambda self, name=None: (yield))
    # RotaryEmbedding.get_emb moves inv_freq to torch.cuda.current_device() on first use (and a
    # few other call sites build tensors there). Answer "cpu" so everything stays on the host.
    torch.cuda.current_device = lambda: "cpu"
    # The MoE router's logits go through a fused TE GEMM (router_gating_linear); without TE the
    # plain linear in the router's dtype computes the same product.
    from megatron.core.transformer.moe import router as mrouter
    mrouter.router_gating_linear = lambda inp, weight, bias, dtype: torch.nn.functional.linear(
        inp.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))
    # multi_latent_attention imports Transformer Engine's wrappers, which without TE are None, and
    # then checks isinstance against them: tell it TE is absent.
    from megatron.core.transformer import multi_latent_attention
    multi_latent_attention.HAVE_TE = False
    # The torch_dist writer "preloads" tensors to host with non_blocking copies and then calls
    # torch.cuda.synchronize(); the tensors already live on the CPU, so there is nothing to wait for.
    torch.cuda.synchronize = lambda *_, **__: None
    # Each forked torch_dist writer process calls _process_memory() (debug logging only), which
    # raises without psutil *before* signalling completion, so the parent waits forever.
    try:
        import psutil  # noqa: F401
    except ImportError:
        from megatron.core.dist_checkpointing.strategies import filesystem_async
        filesystem_async._process_memory = lambda: 0


# The --moe model's routing, as megatron.training's arguments name it (num_experts is
# TransformerConfig's num_moe_experts); lists where Megatron-LM's parser gives lists.
MOE_ARGS = dict(
    num_experts=4, moe_ffn_hidden_size=32, moe_router_topk=2, moe_layer_freq=[1, 0, 1],
    moe_shared_expert_intermediate_size=48, moe_shared_expert_gate=True, moe_router_score_function="sigmoid",
    moe_router_enable_expert_bias=True, moe_router_bias_update_rate=1e-3, moe_router_topk_scaling_factor=2.5,
    moe_router_pre_softmax=False, moe_router_num_groups=None, moe_router_group_topk=None,
    moe_router_load_balancing_type=["seq_aux_loss"], moe_aux_loss_coeff=[1e-3], moe_z_loss_coeff=None,
    moe_expert_capacity_factor=None, moe_token_dispatcher_type="allgather", moe_grouped_gemm=False,
    moe_router_dtype="fp32", moe_permute_fusion=False,
)


# --mla: DeepSeek-V3's attention (a query latent too), its YaRN rotary embedding stretching the
# context 4x with mscale_all_dim set, so the softmax scale moves as well; qk_layernorm gives the
# latents their norms.
MLA_ARGS = dict(
    multi_latent_attention=True, group_query_attention=False, num_query_groups=None, q_lora_rank=32, kv_lora_rank=16,
    qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16, rope_type="yarn", rotary_scaling_factor=4.0, mscale=1.0,
    mscale_all_dim=1.0, qk_layernorm=True,
)


class CausalCoreAttention(torch.nn.Module):
    """Causal softmax attention where megatron-core's local DotProductAttention cannot go: MLA's
    keys are wider than its values (k_channels != v_channels), which only Transformer Engine's
    attention takes. Everything MLA-specific (the latents, their norms, YaRN, the mscale'd softmax
    scale it hands in) stays megatron-core's; this is softmax(q k^T * scale) v over [s, b, n, d]."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, softmax_scale=None, **_):
        super().__init__()
        self.softmax_scale = softmax_scale

    def forward(self, query, key, value, attention_mask, **_):
        s, b = query.shape[:2]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, n, s, d]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)  # [s, b, n * dv]


def moe_args(a):
    """MOE_ARGS with --moe-every-layer's moe_layer_freq."""
    return {**MOE_ARGS, "moe_layer_freq": 1} if a.moe_every_layer else dict(MOE_ARGS)


def moe_transformer_config(a, ep):
    """moe_args as TransformerConfig fields (empty for a dense model)."""
    if not a.moe:
        return {}
    m = moe_args(a)
    m["num_moe_experts"] = m.pop("num_experts")
    m["moe_router_load_balancing_type"] = m["moe_router_load_balancing_type"][0]
    m["moe_aux_loss_coeff"] = m["moe_aux_loss_coeff"][0]
    for unset in ("moe_router_num_groups", "moe_router_group_topk", "moe_z_loss_coeff", "moe_expert_capacity_factor"):
        m.pop(unset)
    return {**m, "expert_model_parallel_size": ep}


def megatron_args(a, tp, ep=1):
    """An argparse.Namespace like megatron.training's, with the fields a loader/converter reads.

    Non-primitive values are kept on purpose: real checkpoints pickle torch dtypes and the
    AttnBackend enum inside 'args', so a C++ unpickler must cope with those GLOBALs too."""
    from megatron.core.transformer.enums import AttnBackend

    kv = a.hidden_size // a.num_attention_heads
    args = Namespace(
        num_layers=a.num_layers, hidden_size=a.hidden_size, ffn_hidden_size=a.ffn_hidden_size,
        num_attention_heads=a.num_attention_heads, num_query_groups=a.num_query_groups,
        group_query_attention=a.num_query_groups != a.num_attention_heads, kv_channels=kv,
        vocab_size=a.vocab_size, padded_vocab_size=a.vocab_size, make_vocab_size_divisible_by=128,
        seq_length=a.seq_length, max_position_embeddings=a.seq_length,
        micro_batch_size=a.micro_batch_size, global_batch_size=a.micro_batch_size,
        normalization="RMSNorm", norm_epsilon=a.norm_epsilon, swiglu=True,
        add_bias_linear=False, add_qkv_bias=False, untie_embeddings_and_output_weights=True,
        position_embedding_type="rope", rotary_base=a.rotary_base, rotary_percent=1.0,
        rotary_interleaved=False, use_rotary_position_embeddings=True,
        apply_residual_connection_post_layernorm=False, qk_layernorm=False,
        attention_dropout=0.0, hidden_dropout=0.0, init_method_std=0.02, seed=a.seed,
        params_dtype=torch.float32, fp16=False, bf16=False, main_grads_dtype=torch.float32,
        main_params_dtype=torch.float32, attention_backend=AttnBackend.local,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=1,
        virtual_pipeline_model_parallel_size=None, expert_model_parallel_size=ep,
        context_parallel_size=1, sequence_parallel=False, num_experts=None,
        transformer_impl="local", use_dist_ckpt=None, ckpt_format=None,
        iteration=1, consumed_train_samples=a.micro_batch_size, consumed_valid_samples=0,
        use_distributed_optimizer=False, no_save_optim=True, no_save_rng=True,
    )
    if a.moe:
        vars(args).update(moe_args(a))
    if a.mla:
        vars(args).update(MLA_ARGS)
    if a.mtp:
        vars(args).update(mtp_num_layers=1, mtp_loss_scaling_factor=0.1)
    return args


def build_model(a, tp, ep=1, pp=1, vpp=1, vp_stage=None):
    """The model, or under pipeline parallelism (pp > 1) this rank's chunk `vp_stage` of it."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec, get_gpt_layer_local_spec, get_gpt_mtp_block_spec)
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config_class, mla = TransformerConfig, {}
    if a.mla:
        config_class = MLATransformerConfig
        mla = {k: v for k, v in MLA_ARGS.items() if k not in ("multi_latent_attention", "group_query_attention", "num_query_groups")}
    cfg = config_class(
        num_layers=a.num_layers, hidden_size=a.hidden_size, ffn_hidden_size=a.ffn_hidden_size,
        num_attention_heads=a.num_attention_heads, num_query_groups=a.num_query_groups,
        normalization="RMSNorm", layernorm_epsilon=a.norm_epsilon, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        bias_dropout_fusion=False, apply_rope_fusion=False, hidden_dropout=0.0,
        attention_dropout=0.0, init_method_std=0.02, use_cpu_initialization=True,
        params_dtype=torch.float32, tensor_model_parallel_size=tp, **moe_transformer_config(a, ep), **mla,
        **({"mtp_num_layers": 1, "mtp_loss_scaling_factor": 0.1} if a.mtp else {}),
        pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        pipeline_dtype=torch.float32,
    )
    if a.moe or a.mla:  # dense and MoE layers as moe_layer_freq says, experts as SequentialMLP
        spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization="RMSNorm")
        if a.mla:
            for layer in spec.layer_specs:
                layer.submodules.self_attention.submodules.core_attention = CausalCoreAttention
    else:
        spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    # CPU init draws every master weight from torch's default generator on every rank, so
    # seeding it here makes the model deterministic (and identical across TP ranks).
    torch.manual_seed(a.seed)
    from megatron.core import parallel_state as ps
    model = GPTModel(
        config=cfg, transformer_layer_spec=spec,
        vocab_size=a.vocab_size, max_sequence_length=a.seq_length,
        pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
        post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
        share_embeddings_and_output_weights=False, vp_stage=vp_stage,
        position_embedding_type="rope", rotary_base=a.rotary_base,
        mtp_block_spec=get_gpt_mtp_block_spec(cfg, spec, use_transformer_engine=False) if a.mtp else None,
    )
    # Norm weights init to exactly 1, which would hide a reader that skips/misplaces them.
    gen = torch.Generator().manual_seed(a.seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
        # The expert bias starts at zero too; a persistent buffer, saved with the weights.
        for name, b in model.named_buffers():
            if name.endswith("router.expert_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=gen))
    return model.eval()


def make_batch(a):
    gen = torch.Generator().manual_seed(a.seed + 2)
    data = torch.randint(0, a.vocab_size, (a.micro_batch_size, a.seq_length + 1), generator=gen)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()  # pretrain_gpt's tokens/labels


def compute_loss(model, tokens, labels, loss_mask=None):
    """Loss as pretrain_gpt.loss_func computes it: sum(losses * mask) / sum(mask)."""
    s = tokens.shape[1]
    # Same as get_ltor_masks_and_position_ids (no resets): True marks a masked position.
    attention_mask = (torch.tril(torch.ones(1, 1, s, s)) < 0.5)
    position_ids = torch.arange(s).unsqueeze(0).expand_as(tokens)
    if loss_mask is None:
        loss_mask = torch.ones(tokens.shape, dtype=torch.float)
    with torch.no_grad():
        per_token = model(tokens, position_ids, attention_mask, labels=labels).float()
    return per_token, (per_token.view(-1) * loss_mask.view(-1)).sum() / loss_mask.sum()


def mtp_loss(model, tokens, labels):
    """The MTP depth's mean loss on the batch (its tokens and labels one further ahead, the last
    position dropped), as megatron-core tracks it: only a training-mode forward computes it
    (dropout is 0 and nothing steps, so the model is unchanged)."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    model.train()
    compute_loss(model, tokens, labels)
    model.eval()
    value = MTPLossLoggingHelper.tracker["values"][0].item()
    MTPLossLoggingHelper.clean_loss_in_tracker()
    return value


def write_dataset(a, prefix):
    """Random documents (ids below vocab_size - 1, each closed by the EOD id vocab_size - 1) as
    megatron-core's own IndexedDatasetBuilder writes them."""
    import numpy
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    gen = numpy.random.default_rng(a.seed + 3)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    for _ in range(40):
        doc = gen.integers(0, a.vocab_size - 1, size=int(gen.integers(4, 3 * a.seq_length)))
        builder.add_document(numpy.append(doc, a.vocab_size - 1), [len(doc) + 1])
    builder.finalize(prefix + ".idx")


def batch_losses(model, a, prefix):
    """The losses pretrain_gpt computes on the first two global batches (micro_batch_size samples,
    one iteration, each) of the training split GPTDataset builds for two iterations, split
    100,0,0."""
    from collections import OrderedDict
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    class Tokenizer:  # the attributes GPTDataset reads
        eod = a.vocab_size - 1
        vocab_size = a.vocab_size
        unique_identifiers = OrderedDict(cls="FixtureTokenizer")

    config = GPTDatasetConfig(random_seed=a.seed, sequence_length=a.seq_length, blend=get_blend_from_list([prefix]),
                              split="100,0,0", path_to_cache=None, tokenizer=Tokenizer(), reset_position_ids=False,
                              reset_attention_mask=False, eod_mask_loss=False)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [2 * a.micro_batch_size, 0, 0], lambda: True, config).build()
    losses = []
    for batch in range(2):
        items = [train[batch * a.micro_batch_size + k] for k in range(a.micro_batch_size)]
        tokens = torch.stack([item["tokens"] for item in items]).long()
        labels = torch.stack([item["labels"] for item in items]).long()
        loss_mask = torch.stack([item["loss_mask"] for item in items]).float()
        losses.append(compute_loss(model, tokens, labels, loss_mask)[1].item())
    return losses


def write_tracker(save_dir):
    with open(os.path.join(save_dir, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("1")  # megatron writes str(iteration), no newline


def save_torch_dist(model, args, save_dir):
    from megatron.core import dist_checkpointing, parallel_state as ps
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy

    args = Namespace(**{**vars(args), "ckpt_format": "torch_dist", "use_dist_ckpt": True})
    ckpt_dir = os.path.join(save_dir, "iter_0000001")
    # Same metadata dict _build_sharded_state_dict_metadata builds for a non-distopt run;
    # minus the process group, it is also stored as common.pt['content_metadata'].
    meta = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True,
            "dp_cp_group": ps.get_data_parallel_group(with_context_parallel=True)}
    state = {"args": args, "checkpoint_version": 3.0, "iteration": 1,
             "model": model.sharded_state_dict(metadata=meta),
             "num_floating_point_operations_so_far": 0}
    if torch.distributed.get_rank() == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
    torch.distributed.barrier()
    content_meta = {k: v for k, v in meta.items() if k != "dp_cp_group"}
    dist_checkpointing.save(state, ckpt_dir, get_default_save_sharded_strategy("torch_dist"),
                            content_metadata=content_meta)
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        write_tracker(save_dir)


def save_legacy(model, args, save_dir):
    from megatron.core import parallel_state as ps

    args = Namespace(**{**vars(args), "ckpt_format": "torch", "use_dist_ckpt": False})
    # get_checkpoint_name without pipeline parallelism: mp_rank_{tp:02d}, and _{ep:03d} after it
    # under expert parallelism (each expert-parallel rank's file holds its own experts).
    name = f"mp_rank_{ps.get_tensor_model_parallel_rank():02d}"
    if ps.get_expert_model_parallel_world_size() > 1:
        name += f"_{ps.get_expert_model_parallel_rank():03d}"
    path = os.path.join(save_dir, "iter_0000001", name)
    os.makedirs(path, exist_ok=True)
    state = {"args": args, "checkpoint_version": 3.0, "iteration": 1,
             "model": model.state_dict_for_save_checkpoint(),
             "num_floating_point_operations_so_far": 0}
    torch.save(state, os.path.join(path, "model_optim_rng.pt"))
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        write_tracker(save_dir)


def pipeline_worker(rank, world, port, a, vpp, out, load_from):
    """Pipeline parallelism (PP = world, VPP = vpp chunks a rank): each stage loads its layers of
    the TP=1 torch_dist checkpoint (megatron-core resharding) and saves a legacy checkpoint,
    mp_rank_00_<stage>, with "model" (or "model0", "model1", ... for the chunks)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    patch_megatron_for_cpu()
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(pipeline_model_parallel_size=world,
                                 virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None)
    torch.set_num_threads(1)
    chunks = [build_model(a, 1, pp=world, vpp=vpp, vp_stage=v if vpp > 1 else None) for v in range(vpp)]
    # One load for all chunks: megatron-core checks every stored shard is read by some rank.
    from megatron.core import dist_checkpointing
    sd = {f"model{v}": chunk.sharded_state_dict(metadata={"singleton_local_shards": False}) for v, chunk in enumerate(chunks)}
    loaded = dist_checkpointing.load(sd, load_from)
    for v, chunk in enumerate(chunks):
        chunk.load_state_dict(loaded[f"model{v}"])
    args = Namespace(**{**vars(megatron_args(a, 1)), "ckpt_format": "torch", "use_dist_ckpt": False,
                        "pipeline_model_parallel_size": world, "virtual_pipeline_model_parallel_size": vpp if vpp > 1 else None})
    state = {"args": args, "checkpoint_version": 3.0, "iteration": 1, "num_floating_point_operations_so_far": 0}
    if vpp > 1:
        state.update({f"model{v}": chunk.state_dict_for_save_checkpoint() for v, chunk in enumerate(chunks)})
    else:
        state["model"] = chunks[0].state_dict_for_save_checkpoint()
    path = os.path.join(out, "torch", "iter_0000001", f"mp_rank_00_{ps.get_pipeline_model_parallel_rank():03d}")
    os.makedirs(path, exist_ok=True)
    torch.save(state, os.path.join(path, "model_optim_rng.pt"))
    torch.distributed.barrier()
    if rank == 0:
        write_tracker(os.path.join(out, "torch"))
    ps.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def load_torch_dist(model, ckpt_dir):
    from megatron.core import dist_checkpointing

    sd = {"model": model.sharded_state_dict(metadata={"singleton_local_shards": False})}
    model.load_state_dict(dist_checkpointing.load(sd, ckpt_dir)["model"])


def worker(rank, world, port, a, tp, out, load_from, ep=1):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    patch_megatron_for_cpu()
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))

    model = build_model(a, tp, ep)
    if load_from:
        load_torch_dist(model, load_from)
    tokens, labels = make_batch(a)
    per_token, loss = compute_loss(model, tokens, labels)
    mtp = {"mtp_loss": mtp_loss(model, tokens, labels)} if a.mtp else {}
    margs = megatron_args(a, tp, ep)
    if a.format in ("torch_dist", "both"):
        save_torch_dist(model, margs, os.path.join(out, "torch_dist"))
    if a.format in ("torch", "both"):
        save_legacy(model, margs, os.path.join(out, "torch"))
    if rank == 0:
        if a.data and tp == 1:
            prefix = os.path.join(out, "data_text_document")
            write_dataset(a, prefix)
            extra = {"batch_losses": batch_losses(model, a, prefix)}
        else:
            extra = {}
        ref = {"tensor_model_parallel_size": tp, "expert_model_parallel_size": ep, "loss": loss.item(), **extra, **mtp,
               "per_token_loss": per_token.tolist(), "tokens": tokens.tolist(),
               "labels": labels.tolist(), "loss_mask": "all ones",
               "model": {k: v for k, v in vars(margs).items() if isinstance(v, (int, float, str, bool))}}
        with open(os.path.join(out, "reference.json"), "w") as f:
            json.dump(ref, f, indent=1)
        print(f"[tp={tp} ep={ep}] loss = {loss.item():.8f}")
    ps.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    a = parse_args()
    if a.moe:
        a.num_layers = len(MOE_ARGS["moe_layer_freq"])
    # torch_dist's forked writer processes turn most failures into a silent hang of the parent;
    # fail loudly (with stacks) instead of stalling a test run.
    faulthandler.dump_traceback_later(300, exit=True)
    t0 = time.time()
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    # TP=2, PP=2 and EP=2 reshard from the TP=1 torch_dist checkpoint.
    tp1_fmt = "both" if a.tp == 2 or a.ep == 2 or a.pp == 2 else a.format
    worker(0, 1, free_port(), Namespace(**{**vars(a), "format": tp1_fmt}), 1, a.out, None)
    if a.tp == 2:
        out2 = os.path.join(a.out, "tp2")
        os.makedirs(out2)
        src = os.path.join(a.out, "torch_dist", "iter_0000001")
        torch.multiprocessing.spawn(worker, args=(2, free_port(), a, 2, out2, src), nprocs=2)
        l1 = json.load(open(os.path.join(a.out, "reference.json")))["loss"]
        l2 = json.load(open(os.path.join(out2, "reference.json")))["loss"]
        assert abs(l1 - l2) < 1e-5, f"TP=2 loss {l2} != TP=1 loss {l1}"
    if a.pp == 2:
        out2 = os.path.join(a.out, "pp2")
        src = os.path.join(a.out, "torch_dist", "iter_0000001")
        torch.multiprocessing.spawn(pipeline_worker, args=(2, free_port(), a, a.vpp, out2, src), nprocs=2)
    if a.ep == 2:
        out2 = os.path.join(a.out, "ep2")
        os.makedirs(out2)
        src = os.path.join(a.out, "torch_dist", "iter_0000001")
        ep_args = Namespace(**{**vars(a), "format": "both", "data": False})
        torch.multiprocessing.spawn(worker, args=(2, free_port(), ep_args, 1, out2, src, 2), nprocs=2)
        l1 = json.load(open(os.path.join(a.out, "reference.json")))["loss"]
        l2 = json.load(open(os.path.join(out2, "reference.json")))["loss"]
        assert abs(l1 - l2) < 1e-5, f"EP=2 loss {l2} != EP=1 loss {l1}"
    print(f"wrote {a.out} in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    sys.exit(main())
