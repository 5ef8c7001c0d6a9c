"""Workload catalog: one architecture definition per model, shared by the
performance estimator (`arena_opt.perf`) and the torch models of the runners."""

from models.catalog import ARCHITECTURES, Arch, get_arch, arena_model_name
from models.layers import LayerTable, layer_table, param_count

__all__ = ["ARCHITECTURES", "Arch", "get_arch", "arena_model_name", "LayerTable", "layer_table", "param_count"]
