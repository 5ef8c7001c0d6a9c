"""Disaggregated profiling: measure each layer of a model on one device (forward, backward,
optimizer step, activation memory, at several micro-batch sizes and tensor-parallel shard shapes),
benchmark collectives to fit alpha-beta link parameters, store both in a versioned JSON database,
and compose any plan's iteration time from them with `arena_opt.perf.compose`.

Modules that run torch (`layers`, `commbench`, `measure`) import it inside; `db`, `compose`,
`colocation` and `cli` do not, so the scheduler can read profiles without torch.
"""
