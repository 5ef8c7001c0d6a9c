"""Architectures of the models Arena evaluates, plus LLaMA-style models.

Transformer and MoE sizes follow Alpa's benchmark suites (the models behind
Arena's measured tables); Wide-ResNet follows Alpa's wide-ResNet suite
(bottleneck ResNet-50/101 with a channel base and width factor).
Parameter counts are computed from the shapes (`models.layers.param_count`), never typed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, PositiveInt, model_validator

from models.hashed import HashedOnce

Family = Literal["gpt", "bert", "moe", "wide_resnet", "llama"]


class Arch(HashedOnce):
    """One trainable model. Transformer fields are used by gpt/bert/moe/llama,
    the ResNet fields by wide_resnet."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(min_length=1)
    family: Family
    # transformer
    num_layers: PositiveInt = 1
    hidden: PositiveInt = 1
    heads: PositiveInt = 1
    kv_heads: PositiveInt | None = None  # grouped-query attention; None = heads
    ffn: PositiveInt | None = None  # None = 4 * hidden
    vocab: PositiveInt = 1
    seq_len: PositiveInt = 1
    gated_mlp: bool = False  # SwiGLU (3 matrices) as in LLaMA
    flash_attention: bool = False  # fused attention stores no s x s score matrices
    num_experts: PositiveInt = 1  # MoE: experts per MoE layer
    moe_every: PositiveInt = 1  # MoE: every k-th block has an expert FFN (Alpa: every second block)
    moe_top_k: PositiveInt = 2  # tokens routed to k experts (GShard top-2)
    # wide-resnet
    image_size: PositiveInt = 224
    resnet_depth: Literal[50, 101, 152] = 50
    base_channels: PositiveInt = 64
    width_factor: PositiveInt = 1
    num_classes: PositiveInt = 1000

    @model_validator(mode="after")
    def _check_shapes(self) -> "Arch":
        if self.family != "wide_resnet":
            if self.hidden % self.heads:
                raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
            if self.kv_heads is not None and self.heads % self.kv_heads:
                raise ValueError(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        return self

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden


def _gpt(name: str, family: Family, layers: int, hidden: int, heads: int, vocab: int = 51200,
         seq: int = 1024) -> Arch:
    return Arch(name=name, family=family, num_layers=layers, hidden=hidden, heads=heads,
                vocab=vocab, seq_len=seq)


def _moe(name: str, layers: int, hidden: int, heads: int, experts: int) -> Arch:
    # Alpa's MoE (alpa/model/moe.py, Arena's moe_trainer.py): experts in every second block,
    # FFN width 8 x hidden; with these the parameter counts match the size labels
    return Arch(name=name, family="moe", num_layers=layers, hidden=hidden, heads=heads,
                vocab=32000, seq_len=1024, num_experts=experts, ffn=8 * hidden, moe_every=2)


def _wresnet(name: str, depth: Literal[50, 101, 152], channels: int, width: int) -> Arch:
    return Arch(name=name, family="wide_resnet", resnet_depth=depth, base_channels=channels,
                width_factor=width)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int) -> Arch:
    return Arch(name=name, family="llama", num_layers=layers, hidden=hidden, heads=heads,
                kv_heads=kv, ffn=ffn, vocab=32000, seq_len=4096, gated_mlp=True, flash_attention=True)


_ALL = [
    # GPT/BERT-style (Alpa suite_manual_gpt shapes; "bert" in Arena's traces uses the same shapes)
    *(_gpt(f"{fam}-{sz}", fam, *shape)  # type: ignore[arg-type]
      for fam in ("gpt", "bert")
      for sz, shape in {"350M": (24, 1024, 16), "760M": (24, 1536, 16), "1.3B": (24, 2048, 32),
                        "2.6B": (32, 2560, 32), "6.7B": (32, 4096, 32), "15B": (48, 5120, 40),
                        "39B": (48, 8192, 64)}.items()),
    # MoE (Alpa suite_auto_moe shapes)
    _moe("moe-380M", 8, 768, 16, 8),
    _moe("moe-690M", 8, 768, 16, 16),
    _moe("moe-1.3B", 16, 768, 16, 16),
    _moe("moe-2.4B", 16, 1024, 16, 16),
    _moe("moe-10B", 16, 1536, 16, 32),
    _moe("moe-27B", 16, 2048, 16, 48),
    _moe("moe-70B", 32, 2048, 16, 64),
    # Wide-ResNet: Alpa suite_wresnet channel bases and width factors; the artifact does not
    # record Alpa's exact block layout, so depths are chosen for parameter counts that match
    # the size labels (tests/test_models.py checks them within 15%).
    _wresnet("wide_resnet-250M", 101, 160, 2),
    _wresnet("wide_resnet-500M", 101, 224, 2),
    _wresnet("wide_resnet-1B", 101, 320, 2),
    _wresnet("wide_resnet-2B", 101, 448, 2),
    _wresnet("wide_resnet-4B", 101, 640, 2),
    _wresnet("wide_resnet-6.8B", 50, 320, 16),
    _wresnet("wide_resnet-13B", 152, 320, 16),
    # LLaMA-style (LLaMA-2 shapes)
    _llama("llama-7B", 32, 4096, 32, 32, 11008),
    _llama("llama-13B", 40, 5120, 40, 40, 13824),
    _llama("llama-70B", 80, 8192, 64, 8, 28672),
]

ARCHITECTURES: dict[str, Arch] = {a.name: a for a in _ALL}


def arena_model_name(trace_name: str) -> str:
    """Map Arena's `{model}__{size}` trace names onto catalog names (`bert__2.6B` -> `bert-2.6B`)."""
    return trace_name.replace("__", "-")


def get_arch(name: str) -> Arch:
    key = arena_model_name(name)
    try:
        return ARCHITECTURES[key]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(ARCHITECTURES))}") from None
