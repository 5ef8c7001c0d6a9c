"""Torch modules for the catalog's architectures, one module per entry of
`models.layers.layer_table(arch)`, so that a pipeline stage `[first, last)` of a
Plan is exactly the modules with those indices and the profiler can time each
table row on its own.

Every layer is a standalone `nn.Module` built from an `Arch`:

    transformers (gpt / bert / moe / llama)   wide_resnet
      0      Embedding                          0      Stem
      1..L   TransformerBlock (MoE FFN or not)  1..B   Bottleneck
      L+1    Head                               B+1    ResNetHead

`tp_degree` builds the shapes one tensor-parallel rank holds (attention heads,
FFN width, experts' FFN width, vocabulary rows, inner conv channels divided by
tp_degree) with no communication in forward: the profiler times the local
compute and adds the table's `tp_comm` itself. The runners build the full-size
module (tp_degree=1) and shard it with `torch.distributed.tensor.parallel`;
forward passes therefore never hard-code a head count and reshape with -1 so the
same code runs on full, sharded-by-DTensor and tp_degree-shaped weights.

Differences from the parameter table (why they exist):
- the head owns its output projection even for families whose table counts it
  tied to the embedding: pipeline stages would otherwise need a cross-stage
  weight, and checkpoints could not move between plans with and without
  pipelining (the set of parameter names must not depend on the plan);
- llama uses RMSNorm (weight only: h per norm) where the table counts 2h;
- BatchNorm has weight and bias as parameters (the table counts 4 per channel,
  running statistics included; it counts none for the stem's BatchNorm).

`scaled_arch` shrinks an architecture for CPU tests; the modules are the same
at full size.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint, noop_context_fn

from models.catalog import Arch
from models.layers import layer_table

__all__ = [
    "Embedding", "TransformerBlock", "Attention", "MLP", "MoE", "Head", "Stem", "Bottleneck", "ResNetHead",
    "RMSNorm", "build_layer", "build_layers", "layer_kinds", "scaled_arch", "LayerStack", "synthetic_batch",
    "loss_fn", "is_causal",
]


def _div(n: int, tp: int, what: str) -> int:
    if n % tp:
        raise ValueError(f"{what} = {n} is not divisible by tp_degree {tp}")
    return n // tp


def is_causal(arch: Arch) -> bool:
    return arch.family in ("gpt", "moe", "llama")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _norm(arch: Arch) -> nn.Module:
    return RMSNorm(arch.hidden) if arch.family == "llama" else nn.LayerNorm(arch.hidden)


# ---------------------------------------------------------------------------- transformer


class Embedding(nn.Module):
    """Token embedding (+ learned positions except for llama, which the table
    counts without them). Input token ids [b, s] -> hidden [b, s, h].
    With tp_degree > 1 the module holds rows [vocab_start, vocab_start + vocab/tp)
    and returns the partial sum a vocabulary-parallel embedding all-reduces."""

    def __init__(self, arch: Arch, tp_degree: int = 1, tp_rank: int = 0) -> None:
        super().__init__()
        self.tp_degree = tp_degree
        rows = _div(arch.vocab, tp_degree, "vocab")
        self.vocab_start = tp_rank * rows
        self.tok = nn.Embedding(rows, arch.hidden)
        self.pos = None if arch.family == "llama" else nn.Embedding(arch.seq_len, arch.hidden)
        nn.init.normal_(self.tok.weight, std=0.02)
        if self.pos is not None:
            nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.tp_degree > 1:
            local = tokens - self.vocab_start
            outside = (local < 0) | (local >= self.tok.num_embeddings)
            x = self.tok(local.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0.0)
        else:
            x = self.tok(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return x


class Attention(nn.Module):
    """Multi-head attention with grouped-query K/V (kv_heads < heads); no biases
    (the table counts none). Heads are split over tp ranks."""

    def __init__(self, arch: Arch, tp_degree: int = 1) -> None:
        super().__init__()
        h, nh = arch.hidden, arch.heads
        kv = arch.kv_heads or nh
        self.head_dim = h // nh
        self.rep = nh // kv
        self.causal = is_causal(arch)
        self.q = nn.Linear(h, _div(nh, tp_degree, "heads") * self.head_dim, bias=False)
        self.k = nn.Linear(h, _div(kv, tp_degree, "kv_heads") * self.head_dim, bias=False)
        self.v = nn.Linear(h, kv // tp_degree * self.head_dim, bias=False)
        self.o = nn.Linear(nh // tp_degree * self.head_dim, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: the same code runs on full weights and on tensor-parallel shards
        q = self.q(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if self.rep > 1:
            k = k.repeat_interleave(self.rep, dim=1)
            v = v.repeat_interleave(self.rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """GELU MLP (2 matrices) or LLaMA's SwiGLU (3 matrices); the FFN width is
    split over tp ranks (w1/w3 column-, w2 row-parallel)."""

    def __init__(self, arch: Arch, tp_degree: int = 1) -> None:
        super().__init__()
        h, f = arch.hidden, _div(arch.ffn_size, tp_degree, "ffn")
        self.gated = arch.gated_mlp
        self.w1 = nn.Linear(h, f, bias=False)
        self.w3 = nn.Linear(h, f, bias=False) if self.gated else None
        self.w2 = nn.Linear(f, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class MoE(nn.Module):
    """Top-k routed experts (GShard-style, no capacity limit, no auxiliary loss).
    Each expert is an MLP, so tensor parallelism splits every expert's FFN width
    the same way as a dense MLP; the router is replicated."""

    def __init__(self, arch: Arch, tp_degree: int = 1) -> None:
        super().__init__()
        self.top_k = min(arch.moe_top_k, arch.num_experts)
        self.router = nn.Linear(arch.hidden, arch.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(arch, tp_degree) for _ in range(arch.num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        gates = F.softmax(self.router(flat), dim=-1)
        weight, chosen = gates.topk(self.top_k, dim=-1)
        weight = weight / weight.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            # every expert runs (possibly on zero tokens) so that tensor-parallel
            # ranks issue the same collectives in the same order
            y = expert(flat[token]) * weight[token, slot].unsqueeze(-1)
            out = out.index_add(0, token, y)
        return out.view(shape)


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + ffn(norm(x)); ffn is MoE for
    the table's `moe_block` rows."""

    def __init__(self, arch: Arch, moe: bool = False, tp_degree: int = 1) -> None:
        super().__init__()
        self.attn_norm = _norm(arch)
        self.attn = Attention(arch, tp_degree)
        self.ffn_norm = _norm(arch)
        self.ffn: nn.Module = MoE(arch, tp_degree) if moe else MLP(arch, tp_degree)
        std = 0.02 / math.sqrt(2 * arch.num_layers)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # output projections scaled down with depth (GPT-2) keep the residual stream stable
                nn.init.normal_(p, std=std if name.endswith(("o.weight", "w2.weight")) else 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class Head(nn.Module):
    """Final norm + output projection to vocabulary logits (rows split over tp ranks)."""

    def __init__(self, arch: Arch, tp_degree: int = 1) -> None:
        super().__init__()
        self.norm = _norm(arch)
        self.out = nn.Linear(arch.hidden, _div(arch.vocab, tp_degree, "vocab"), bias=False)
        nn.init.normal_(self.out.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


# ---------------------------------------------------------------------------- wide-resnet


def _resnet_blocks(arch: Arch) -> list[tuple[int, int, int, int]]:
    """(cin, width, cout, stride) per bottleneck, in the table's layout."""
    counts = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}[arch.resnet_depth]
    out, cin = [], arch.base_channels
    for stage, n in enumerate(counts):
        width = arch.base_channels * 2 ** stage
        cout = 2 * width * arch.width_factor
        for b in range(n):
            out.append((cin, width, cout, 2 if b == 0 and stage > 0 else 1))
            cin = cout
    return out


class Stem(nn.Module):
    """7x7/2 convolution, BN, ReLU and 3x3/2 max-pool: images [b, 3, H, W] -> [b, c0, H/4, W/4]."""

    def __init__(self, arch: Arch, tp_degree: int = 1) -> None:
        super().__init__()
        # the table does not shard the stem (tp_params = 0): tp_degree is accepted for a uniform signature
        self.conv = nn.Conv2d(3, arch.base_channels, 7, stride=2, padding=3, bias=False)
        self.bn = nn.BatchNorm2d(arch.base_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(F.relu(self.bn(self.conv(x))), 3, stride=2, padding=1)


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride) -> 1x1 bottleneck with a 1x1 projection shortcut on the
    first block of a stage. With tp_degree > 1 it holds one rank's shard of the
    scheme the table assumes (all conv weights sharded): conv1 and conv3/shortcut
    split their output channels, conv2 its input channels."""

    def __init__(self, arch: Arch, index: int, tp_degree: int = 1) -> None:
        super().__init__()
        cin, width, cout, stride = _resnet_blocks(arch)[index]
        w_loc = _div(width, tp_degree, "block width")
        c_loc = _div(cout, tp_degree, "block output channels")
        self.conv1 = nn.Conv2d(cin, w_loc, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(w_loc)
        self.conv2 = nn.Conv2d(w_loc, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_loc, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_loc)
        self.down = None
        if cin != cout or stride != 1:
            self.down = nn.Sequential(nn.Conv2d(cin, c_loc, 1, stride=stride, bias=False), nn.BatchNorm2d(c_loc))
        self.tp_degree = tp_degree

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        if self.down is not None:
            skip = self.down(x)
        else:
            skip = x[:, : y.shape[1]] if self.tp_degree > 1 else x
        return F.relu(y + skip)


class ResNetHead(nn.Module):
    """Global average pool + classifier."""

    def __init__(self, arch: Arch, tp_degree: int = 1) -> None:
        super().__init__()
        self.fc = nn.Linear(_resnet_blocks(arch)[-1][2], arch.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=(2, 3)))


# ---------------------------------------------------------------------------- assembly


def layer_kinds(arch: Arch) -> tuple[str, ...]:
    return layer_table(arch).kinds


def build_layer(arch: Arch, index: int, tp_degree: int = 1, seed: int | None = None) -> nn.Module:
    """The module of table row `index`. With `seed`, its initial weights depend
    only on (seed, index), so every pipeline split of a model starts from the
    same weights."""
    kinds = layer_kinds(arch)
    if not 0 <= index < len(kinds):
        raise IndexError(f"layer {index} out of range: {arch.name} has {len(kinds)} layers")
    kind = kinds[index]
    with torch.random.fork_rng(devices=[]) if seed is not None else _nullctx():
        if seed is not None:
            torch.manual_seed(seed * 100_003 + index)
        if kind == "embed":
            return Embedding(arch, tp_degree)
        if kind in ("block", "moe_block"):
            return TransformerBlock(arch, moe=kind == "moe_block", tp_degree=tp_degree)
        if kind == "head":
            return ResNetHead(arch, tp_degree) if arch.family == "wide_resnet" else Head(arch, tp_degree)
        if kind == "stem":
            return Stem(arch, tp_degree)
        if kind == "conv_block":
            return Bottleneck(arch, index - 1, tp_degree)
    raise ValueError(f"unknown layer kind {kind!r}")


class _nullctx:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class LayerStack(nn.Module):
    """Layers `[first, last)` of an architecture, keyed by their global index so
    parameter names (`layers.7.attn.q.weight`) are the same whichever stage
    holds them: checkpoints move between pipeline splits by name."""

    def __init__(self, arch: Arch, first: int = 0, last: int | None = None, tp_degree: int = 1,
                 seed: int | None = 0, recompute: bool = False) -> None:
        super().__init__()
        # a plan's rematerialisation (Plan.recompute): the planner chooses it where the plan's activations
        # do not fit otherwise, so a runner that ignored it would run out of memory on the GPUs it priced
        self.recompute = recompute
        n = len(layer_kinds(arch))
        last = n if last is None else last
        if not 0 <= first < last <= n:
            raise ValueError(f"layer range [{first}, {last}) is not inside [0, {n}) for {arch.name}")
        self.first, self.last = first, last
        self.layers = nn.ModuleDict({str(i): build_layer(arch, i, tp_degree, seed) for i in range(first, last)})
        # each layer's batch norms, found once (a plain list: not registered twice, and deepcopy maps it along)
        self._norms = [[m for m in layer.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
                       for layer in self.layers.values()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        remat = self.recompute and torch.is_grad_enabled()
        for layer, norms in zip(self.layers.values(), self._norms, strict=True):
            # only each layer's input is kept for backward, which runs the layer's forward again (the
            # non-reentrant form: it composes with FSDP2's hooks, DTensor and the pipeline schedule)
            x = checkpoint(layer, x, use_reentrant=False, context_fn=_recompute_contexts(norms)) if remat else layer(x)
        return x


def _recompute_contexts(norms: list[nn.Module]):
    """checkpoint's (forward, recomputation) contexts for a layer with batch norms `norms`: the recomputed forward
    runs in training mode, so batch norm would fold its batch into the running statistics a second time; the
    recomputation puts them back as the forward left them (a rematerialising plan's state is then the plain
    plan's, checkpoints included)."""
    if not norms:
        return noop_context_fn
    return lambda: (contextlib.nullcontext(), _restored_buffers(norms))


@contextlib.contextmanager
def _restored_buffers(modules: list[nn.Module]):
    kept = [(m, {k: v.clone() for k, v in m.named_buffers(recurse=False) if v is not None}) for m in modules]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, bufs in kept:
                for k, v in bufs.items():
                    getattr(m, k).copy_(v)


def build_layers(arch: Arch, tp_degree: int = 1, seed: int | None = 0) -> LayerStack:
    return LayerStack(arch, 0, None, tp_degree, seed)


# ---------------------------------------------------------------------------- data


def training_precision(device: torch.device | str) -> torch.dtype:
    """The precision a training step's matrix products run at, in the runners and in the profiler alike (a
    profile taken at another precision than the steps it prices is off by the ratio of the two): bf16 on GPUs,
    as the estimator's fp16/bf16 cost model prices them; fp32 on CPUs, which have no fast low-precision kernels."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def training_autocast(device: torch.device | str):
    """Autocast to `training_precision` (off where that is fp32)."""
    dtype = training_precision(device)
    low = dtype != torch.float32
    return torch.autocast(torch.device(device).type, dtype=dtype if low else torch.bfloat16, enabled=low)


def training_dtype(device: torch.device | str) -> str:
    """The name of `training_precision` on this device (ModelProfile.dtype)."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[training_precision(device)]


def synthetic_batch(arch: Arch, step: int, batch: int, seed: int = 0,
                    device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic (inputs, labels) of global step `step`; every rank and every
    plan sees the same global batch. Labels are a fixed function of the inputs
    so the loss falls and runs can be compared step by step."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    if arch.family == "wide_resnet":
        x = torch.randn(batch, 3, arch.image_size, arch.image_size, generator=g)
        proj = torch.randn(3, arch.num_classes, generator=torch.Generator().manual_seed(seed))
        y = (x.mean(dim=(2, 3)) @ proj).argmax(-1)
    else:
        x = torch.randint(0, arch.vocab, (batch, arch.seq_len), generator=g)
        y = (x * 31 + 7) % arch.vocab
    return x.to(device), y.to(device)


def loss_fn(output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over samples (and tokens) for both families."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), labels.reshape(-1))


# ---------------------------------------------------------------------------- scaling


def scaled_arch(arch: Arch, max_hidden: int = 64, max_layers: int = 4, seq_len: int = 32,
                max_heads: int = 4, max_vocab: int = 512, max_experts: int = 4, image_size: int = 32,
                max_channels: int = 8, max_width_factor: int = 2, num_classes: int = 10) -> Arch:
    """A small architecture of the same family and structure (GQA ratio, gated
    MLP, MoE routing, FFN/hidden ratio, bottleneck layout) for CPU runs. Sizes
    stay divisible by 2 and 4 so tensor parallelism up to 4 works on them,
    except kv_heads which keeps at least 2 (tp <= 2 on GQA models).
    Wide-ResNet keeps depth 50 (the smallest the catalog describes: 18 layers)."""
    if arch.family == "wide_resnet":
        return arch.model_copy(update=dict(
            name=f"{arch.name}@c{min(arch.base_channels, max_channels)}", resnet_depth=50,
            base_channels=min(arch.base_channels, max_channels),
            width_factor=min(arch.width_factor, max_width_factor),
            image_size=min(arch.image_size, image_size), num_classes=min(arch.num_classes, num_classes)))
    heads = min(arch.heads, max_heads)
    hidden = min(arch.hidden, max_hidden)
    hidden -= hidden % (4 * heads) if hidden >= 4 * heads else 0
    kv = None
    if arch.kv_heads is not None and arch.kv_heads != arch.heads:
        kv = max(min(heads, 2), heads // (arch.heads // arch.kv_heads))
    ffn = None
    if arch.ffn is not None:
        ffn = max(8, round(arch.ffn * hidden / arch.hidden / 8) * 8)
    experts = min(arch.num_experts, max_experts)
    layers = min(arch.num_layers, max_layers)
    return Arch.model_validate({
        **arch.model_dump(),
        "name": f"{arch.name}@h{hidden}l{layers}",
        "num_layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv, "ffn": ffn,
        "vocab": min(arch.vocab, max_vocab), "seq_len": min(arch.seq_len, seq_len),
        "num_experts": experts, "moe_top_k": min(arch.moe_top_k, experts),
    })
