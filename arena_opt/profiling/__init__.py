"""Disaggregated profiling: measure each layer of a model on one device (forward, backward,
optimizer step, activation memory, at several micro-batch sizes and tensor-parallel shard shapes),
benchmark collectives to fit alpha-beta link parameters, and write both to the profile database.

The database's format (`arena_opt.perf.profile_db`), the composition of a plan's iteration time from
it (`arena_opt.perf.profile_costs`) and the estimator's profile reader (`arena_opt.perf.profile_source`)
live in the cost model, so the scheduler reads profiles without importing this package.
Modules that run torch (`layers`, `commbench`, `measure`) import it inside; `cli` does not.
"""
