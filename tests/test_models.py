import re

import pytest

from models import ARCHITECTURES, get_arch, layer_table, param_count
from models.catalog import Arch


def _label_params(name: str) -> float:
    num, unit = re.search(r"-([\d.]+)([MB])$", name).groups()
    return float(num) * (1e6 if unit == "M" else 1e9)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_param_count_matches_size_label(name):
    a = ARCHITECTURES[name]
    # labels are rounded marketing sizes; the computed count must land near them
    assert param_count(a) == pytest.approx(_label_params(name), rel=0.25)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_layer_table_consistent(name):
    t = layer_table(ARCHITECTURES[name])
    n = t.num_layers
    for arr in (t.params, t.tp_params, t.flops_fwd, t.act_shard, t.act_rep, t.act_in, t.tp_comm):
        assert arr.shape == (n,) and (arr >= 0).all()
    assert (t.tp_params <= t.params).all()
    assert t.flops_fwd.sum() > 0


def test_arena_names_map_to_catalog():
    assert get_arch("bert__2.6B").name == "bert-2.6B"
    assert get_arch("wide_resnet__6.8B").family == "wide_resnet"
    with pytest.raises(KeyError, match="unknown model"):
        get_arch("gpt__1T")


def test_invalid_arch_rejected():
    with pytest.raises(ValueError, match="divisible"):
        Arch(name="bad", family="gpt", hidden=100, heads=3)


def test_frozen_models_hash_once_as_pydantic_does():
    """Arch and GpuSpec keep their hash (models/hashed.py): pydantic's own value, the same for equal objects,
    and a copy with other fields hashes afresh."""
    import copy
    import pickle

    from pydantic._internal._model_construction import make_hash_func

    from arena_opt.gpus import BUILTIN_GPUS, GpuSpec

    for obj in (get_arch("bert-2.6B"), BUILTIN_GPUS["a100-40gb"]):
        cls = type(obj)
        assert cls in (Arch, GpuSpec)
        assert hash(obj) == make_hash_func(cls)(obj) == hash(obj)
        twin = cls.model_validate(obj.model_dump())
        assert twin == obj and hash(twin) == hash(obj)
        assert hash(pickle.loads(pickle.dumps(obj))) == hash(copy.deepcopy(obj)) == hash(obj)
        field = "name"
        other = obj.model_copy(update={field: obj.name + "-x"})
        assert other != obj and hash(other) == make_hash_func(cls)(other) != hash(obj)
        assert "_hash_once" not in obj.model_dump() and "_hash_once" not in vars(obj)
