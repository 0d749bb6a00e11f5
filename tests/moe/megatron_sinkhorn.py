"""Megatron-Core's sinkhorn routing (TopKRouter.sinkhorn_load_balancing, megatron/core/transformer/moe/
router.py, with moe_utils.sinkhorn) on logits written by tests/moe/test_router.cpp.

  python megatron_sinkhorn.py LOGITS,OUT,TOKENS,EXPERTS,TOPK,TRAINING ...
LOGITS: TOKENS x EXPERTS float32, raw. Writes OUT: the routed weights, TOKENS x EXPERTS float32 raw (0
where a token is not routed). One case per argument (megatron-core is imported once for all). The method runs unchanged on a stand-in for the router object: it reads
only topk, training and config.moe_aux_loss_coeff.
"""
import sys
import warnings
from types import SimpleNamespace

import torch

warnings.filterwarnings("ignore")  # megatron-core's notes that TransformerEngine and Apex are absent
from megatron.core.transformer.moe.router import TopKRouter  # noqa: E402

for case in sys.argv[1:]:
    logits_path, out_path, tokens, experts, topk, training = case.split(",")
    logits = torch.from_file(logits_path, size=int(tokens) * int(experts), dtype=torch.float32).view(int(tokens), int(experts))
    router = SimpleNamespace(topk=int(topk), training=training == "1", config=SimpleNamespace(moe_aux_loss_coeff=0.0))
    scores, routing_map = TopKRouter.sinkhorn_load_balancing(router, logits)
    assert torch.equal(routing_map, scores != 0)
    scores.float().contiguous().numpy().tofile(out_path)
