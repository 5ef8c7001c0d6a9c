"""The base of frozen pydantic models that key hot dictionaries: their hash computed once per object.

Pydantic's hash of a frozen model hashes the tuple of all its fields on every call (2 us for an Arch);
a cold planning round keys its caches with (model, GPU, ...) tuples and hashed Arch and GpuSpec 25,000
times (about 8% of medium's grids + plans). The value is pydantic's own, so sets and dicts of these
models iterate as before. The cache lives in a slot, outside the fields and private attributes that
equality, dumps, copies and pickles read: a copy or an unpickled object hashes afresh."""

from __future__ import annotations

import operator

from pydantic import BaseModel

_GETTERS: dict[type, operator.itemgetter] = {}


class HashedOnce(BaseModel):
    __slots__ = ("_hash_once",)

    def __hash__(self) -> int:
        try:
            return self._hash_once
        except AttributeError:
            pass
        cls = type(self)
        get = _GETTERS.get(cls)
        if get is None:  # pydantic's make_hash_func: the field values in declaration order
            get = _GETTERS[cls] = operator.itemgetter(*cls.__pydantic_fields__)
        h = hash(get(self.__dict__))
        object.__setattr__(self, "_hash_once", h)
        return h
