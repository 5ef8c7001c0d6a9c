"""Per-layer cost table of an architecture: the one description of a model's
parameters, FLOPs and activations that the analytical estimator, the planner
and the profiler all read. Arrays, one entry per pipeline-splittable layer.

Activation sizes follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models") for fp16 training; conv layers
store each conv/BN/ReLU output once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from models.catalog import Arch

BYTES_FP16 = 2


@dataclass(frozen=True)
class LayerTable:
    """All values per layer; per-sample values are for one sample of the global batch."""

    kinds: tuple[str, ...]
    params: np.ndarray  # parameter count
    tp_params: np.ndarray  # of which are sharded by tensor parallelism
    flops_fwd: np.ndarray  # forward FLOPs per sample (backward = 2x)
    act_shard: np.ndarray  # stored activation bytes per sample that tp divides
    act_rep: np.ndarray  # stored activation bytes per sample replicated across tp
    act_in: np.ndarray  # input activation bytes per sample (kept under recompute; p2p size)
    tp_comm: np.ndarray  # bytes all-reduced per sample in forward under tp (same in backward)

    @property
    def num_layers(self) -> int:
        return len(self.kinds)

    @property
    def act_bytes(self) -> np.ndarray:
        return self.act_shard + self.act_rep


def _transformer(a: Arch) -> LayerTable:
    s, h, f, nh = a.seq_len, a.hidden, a.ffn_size, a.heads
    kv = a.kv_heads or nh
    attn = 2 * h * h + 2 * h * (h * kv // nh)
    mlp = (3 if a.gated_mlp else 2) * h * f
    rows: list[tuple] = []
    tied = a.family != "llama"
    emb = a.vocab * h + (0 if a.family == "llama" else s * h)
    rows.append(("embed", emb, a.vocab * h, 0.0, 0.0, s * h * BYTES_FP16, 0.0, 0.0))
    for i in range(a.num_layers):
        moe = a.family == "moe" and i % a.moe_every == a.moe_every - 1
        ffn_params = mlp * (a.num_experts if moe else 1) + (h * a.num_experts if moe else 0)
        ffn_flops = 2 * s * mlp * (a.moe_top_k if moe else 1)
        params = attn + ffn_params + 4 * h
        flops = 2 * s * attn + ffn_flops + 4 * s * s * h
        mlp_scale = f / (4 * h) * (a.moe_top_k if moe else 1)
        # Korthikanti: 34sh + 5as^2 per layer, of which 10sh stays replicated under tp;
        # the 16sh of MLP-internal activations scale with the FFN width and routing.
        act_shard = (8 + 16 * mlp_scale) * s * h + (0 if a.flash_attention else 5 * nh * s * s)
        act_rep = 10 * s * h
        # two tp all-reduces per block; MoE adds the dispatch/combine all-to-all
        comm = (2 + (2 if moe else 0)) * s * h * BYTES_FP16
        rows.append(("moe_block" if moe else "block", params, attn + ffn_params, flops, act_shard,
                     act_rep, s * h * BYTES_FP16, comm))
    head_params = 0 if tied else a.vocab * h
    # logits in fp32 plus their softmax gradient dominate the head's activations
    rows.append(("head", head_params + 2 * h, head_params, 2 * s * h * a.vocab,
                 s * a.vocab * 4 * 2, 0.0, s * h * BYTES_FP16, s * h * BYTES_FP16))
    return _table(rows)


def _wide_resnet(a: Arch) -> LayerTable:
    blocks = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}[a.resnet_depth]
    hw = (a.image_size // 4) ** 2  # after the 7x7/2 stem and 3x3/2 max-pool
    c0 = a.base_channels
    stem_out = c0
    rows: list[tuple] = []
    stem_hw = (a.image_size // 2) ** 2
    stem_p = 3 * 49 * c0
    rows.append(("stem", stem_p, 0, 2 * stem_p * stem_hw, 0.0, 3 * c0 * stem_hw * BYTES_FP16,
                 3 * a.image_size ** 2 * BYTES_FP16, 0.0))
    cin = stem_out
    for stage, n in enumerate(blocks):
        # the width factor widens the block's output (and so the next block's input)
        width = c0 * 2 ** stage
        cout = 2 * width * a.width_factor
        for b in range(n):
            if b == 0 and stage > 0:
                hw //= 4
            p = cin * width + 9 * width * width + width * cout + (cin * cout if b == 0 else 0)
            flops = 2 * p * hw
            # conv, BN and ReLU outputs of the two inner convs are channel-sharded under tp
            act_shard = 3 * 2 * width * hw * BYTES_FP16
            act_rep = 3 * cout * hw * BYTES_FP16
            rows.append(("conv_block", p + 4 * (2 * width + cout), p, flops, act_shard, act_rep,
                         cin * hw * BYTES_FP16, cout * hw * BYTES_FP16))
            cin = cout
    fc = cin * a.num_classes + a.num_classes
    rows.append(("head", fc, 0, 2 * fc, 0.0, cin * BYTES_FP16, cin * hw * BYTES_FP16, 0.0))
    return _table(rows)


def _table(rows: list[tuple]) -> LayerTable:
    cols = list(zip(*rows))
    arr = [np.asarray(c, dtype=np.float64) for c in cols[1:]]
    for x in arr:
        x.setflags(write=False)
    return LayerTable(tuple(cols[0]), *arr)


@lru_cache(maxsize=None)
def layer_table(arch: Arch) -> LayerTable:
    return _wide_resnet(arch) if arch.family == "wide_resnet" else _transformer(arch)


def param_count(arch: Arch) -> int:
    """Parameters of the whole model, summed over its layer table."""
    return int(layer_table(arch).params.sum())
