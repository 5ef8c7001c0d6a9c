"""The interval-indexed LP relaxation whose optimum bounds the average JCT of every schedule from below
(docs/BOUND.md has the proof). Built as numpy COO arrays and solved by HiGHS; the reported bound is
the Lagrangian value of HiGHS's row duals, which is a lower bound whatever the solver's status.

Time is cut into cells of one scheduling interval from the simulator's origin. A job's time after its
release is split into blocks of cells aligned to powers of two, each at most `epsilon` times the job's
age at the block's start (fine near the arrival, geometric later), and a last block from the horizon
on that no capacity limits. Capacity holds on every power-of-two block that contains a job's block:
the GPU-time of the jobs' blocks inside it is at most the type's GPUs times its length.

Columns per job j: C (completion), M (work-weighted mean of the blocks' starts), X[g] (share of the
work done on grid g), y[g, b] (time on grid g in block b); per (block, type): U (GPU-time inside it).
Rows per job: sum X = 1; X[g] = sum_b y[g, b] / p[g]; M = sum y[g, b] start[b] / p[g];
sum_g y[g, b] <= usable length of b; C >= release + sum_g p[g] X[g] (one grid at a time);
C - M >= sum_h min(p[g], p[h]) X[h] - p[g] / 2 for each grid g (the work's mean is at least this
far before C). Per block and type: U = GPU-time of the block's own y plus its children's U, U <= cap.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from arena_opt.bound.instance import BoundInstance


class BoundOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epsilon: PositiveFloat = Field(0.5, le=1.0, description="a job's block is at most this times its age")
    cells_per_interval: PositiveInt = Field(1, description="cells per scheduling interval (finer: tighter, larger)")
    grid_cuts: bool = Field(True, description="C - M >= tangent of the work's spread at every grid, "
                                              "not only at the fastest (p_min / 2)")
    horizon_s: PositiveFloat | None = Field(None, description="capacity is modelled up to here (default: "
                                                              "from the work; doubled while work spills past it)")
    max_doublings: int = Field(3, ge=0)
    tail_tol: float = Field(1e-4, ge=0.0, description="double the horizon only while more than this share of "
                                                       "the work lies past it (any horizon's LP is a bound)")
    first_epsilon: PositiveFloat | None = Field(1.0, le=1.0, description="solve this coarser LP first where "
                                                                         "epsilon is finer: a valid bound if "
                                                                         "the finer LP runs out of time")
    time_limit_s: PositiveFloat = 900.0
    threads: PositiveInt = 2
    method: str = Field("full", pattern="^(colgen|full)$",
                        description="colgen: simplex on a growing subset of the time columns, priced against "
                                    "all of them; full: every column at once")
    solver: str = Field("ipm", pattern="^(choose|simplex|ipm)$", description="HiGHS solver of method full")
    max_add: PositiveInt = Field(20000, description="columns added per column-generation round at most")
    gap: float = Field(1e-5, ge=0.0, description="column generation stops when the bound is within this "
                                                  "fraction of the restricted LP's value")


@dataclass
class BoundResult:
    avg_jct_bound_s: float | None  # the bound: valid lower bound on the average JCT of the jobs below
    lp_objective_s: float | None  # the LP's primal value as an average JCT (= the bound when optimal)
    status: str
    jobs: int
    rejected: int
    contention_free_s: float  # mean over jobs of release - submit + p_min: what the LP cannot go below
    horizon_s: float
    tail_work: float  # share of all work the LP put past the horizon (0: the horizon did not bind)
    columns: int
    rows: int
    nonzeros: int
    build_s: float
    solve_s: float
    options: dict = field(default_factory=dict)
    colgen_rounds: int = 0
    completion_s: dict[str, float] = field(default_factory=dict)  # job -> the LP's C - submit
    passes: list[dict] = field(default_factory=list)  # every LP solved: epsilon, horizon, status, bound, size, s

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.pop("completion_s")
        return d


@dataclass
class _Model:
    cost: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    row_lo: np.ndarray
    row_hi: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    c_cols: np.ndarray  # column of each job's C
    y_work: tuple  # (columns of y, coefficient into work share, in tail?) for the tail share
    y_job: np.ndarray  # job (commodity) of each y column of y_work
    y_first: np.ndarray  # y columns column generation starts from (each job alone, from its release)


def _blocks(c0: int, horizon: int, eps: float, p_min: float) -> list[tuple[int, int, int]]:
    """A job's blocks (first cell, end cell, level) from cell c0 to the horizon. Each is at most eps times
    the larger of the age at its start and the job's shortest run (at least one cell), which is at most
    eps times the job's JCT; and it ends on a multiple of 2^level, so it lies in the dyadic block
    (level, first // 2^level) whose capacity row counts it."""
    out = []
    c = c0
    while c < horizon:
        limit = max(1.0, eps * max(c - c0, p_min))
        level = int(math.floor(math.log2(limit)))
        end = min(horizon, (c >> level) + 1 << level)
        out.append((c, end, level))
        c = end
    return out


def _horizon_cells(inst: BoundInstance, cell: float, opts: BoundOptions, doubling: int) -> int:
    if opts.horizon_s is not None:
        h = opts.horizon_s / cell
    else:
        # the last release, the longest run and the whole GPU-work spread over all GPUs: rarely binding,
        # and the LP stays valid when it binds (the tail block has no capacity limit)
        work = sum(min(g.gpus * g.seconds for g in j.grids) for j in inst.jobs)
        last = max(j.release for j in inst.jobs) - inst.origin
        longest = max(j.p_min for j in inst.jobs)
        h = (last + longest + work / max(1, sum(inst.capacity.values()))) / cell
    return 2 ** max(0, math.ceil(math.log2(max(h, 1.0))) + doubling)


def build(inst: BoundInstance, opts: BoundOptions, horizon: int) -> _Model:
    cell = inst.interval_s / opts.cells_per_interval  # time unit of the model: one cell
    types = sorted(inst.capacity)
    tix = {t: i for i, t in enumerate(types)}
    n = len(inst.jobs)
    # --- columns: C[j], M[j] first, then per job X[g], then y, then U
    col_lo, col_hi, cost = [], [], []
    r_rows, r_cols, r_vals = [], [], []
    row_lo, row_hi = [], []

    def add_rows(k: int, lo, hi) -> int:
        first = len(row_lo)
        row_lo.extend(np.broadcast_to(lo, (k,)).tolist())
        row_hi.extend(np.broadcast_to(hi, (k,)).tolist())
        return first

    def add_cols(k: int, lo, hi, c=0.0) -> int:
        first = len(col_lo)
        col_lo.extend(np.broadcast_to(lo, (k,)).tolist())
        col_hi.extend(np.broadcast_to(hi, (k,)).tolist())
        cost.extend(np.broadcast_to(c, (k,)).tolist())
        return first

    def nz(rows, cols, vals) -> None:
        rows, cols = np.atleast_1d(rows), np.atleast_1d(cols)
        r_rows.append(np.broadcast_to(rows, np.broadcast_shapes(rows.shape, cols.shape)).ravel())
        r_cols.append(np.broadcast_to(cols, np.broadcast_shapes(rows.shape, cols.shape)).ravel())
        r_vals.append(np.broadcast_to(np.asarray(vals, dtype=float),
                                      np.broadcast_shapes(rows.shape, cols.shape)).ravel())

    rel = np.array([(j.release - inst.origin) / cell for j in inst.jobs])
    pmax = np.array([max(g.seconds for g in j.grids) / cell for j in inst.jobs])
    pmin = np.array([j.p_min / cell for j in inst.jobs])
    c_first = add_cols(n, rel + pmin, horizon + 2 * pmax + rel, 1.0 / n)
    m_first = add_cols(n, rel, np.maximum(float(horizon), rel))
    # block bookkeeping for capacity: (level, index) -> id
    block_id: dict[tuple[int, int], int] = {}
    ys_cols, ys_block, ys_type, ys_gpus, ys_tail, ys_inv_p, ys_first = [], [], [], [], [], [], []
    ys_job = []
    for j, job in enumerate(inst.jobs):
        p = np.array([g.seconds / cell for g in job.grids])
        gpus = np.array([g.gpus for g in job.grids], dtype=float)
        gt = np.array([tix[g.gpu_type] for g in job.grids])
        k = len(p)
        x0 = add_cols(k, 0.0, 1.0)
        xs = np.arange(x0, x0 + k)
        r = add_rows(1, 1.0, 1.0)  # sum X = 1
        nz(r, xs, 1.0)
        # busy: C - sum p X >= release
        r = add_rows(1, rel[j], np.inf)
        nz(r, c_first + j, 1.0)
        nz(r, xs, -p)
        # spread of the work before C: tangent at every grid (or only the fastest)
        cut_at = p if opts.grid_cuts else p[[int(np.argmin(p))]]
        rc = add_rows(len(cut_at), -cut_at / 2, np.inf)
        rr = np.arange(rc, rc + len(cut_at))
        nz(rr, c_first + j, 1.0)
        nz(rr, m_first + j, -1.0)
        nz(rr[:, None], xs[None, :], -np.minimum(cut_at[:, None], p[None, :]))
        # blocks
        c0 = int(math.floor(rel[j] + 1e-12))
        blocks = _blocks(c0, horizon, opts.epsilon, pmin[j]) if c0 < horizon else []
        starts = np.array([max(float(c), rel[j]) for c, _, _ in blocks] + [max(float(horizon), rel[j])])
        ends = np.array([float(e) for _, e, _ in blocks] + [np.inf])
        usable = ends - starts
        nb = len(starts)
        # y[g, b], b fastest-moving
        # a job spends at most p[g] on grid g in all: a finite box for every y (see _lagrangian)
        y0 = add_cols(k * nb, 0.0, np.minimum(usable[None, :], p[:, None]).ravel())
        ycols = np.arange(y0, y0 + k * nb).reshape(k, nb)
        inv_p = np.repeat(1.0 / p, nb).reshape(k, nb)
        # X[g] - sum_b y / p = 0
        rx = add_rows(k, 0.0, 0.0)
        nz(np.arange(rx, rx + k), xs, 1.0)
        nz(np.repeat(np.arange(rx, rx + k), nb), ycols.ravel(), -inv_p.ravel())
        # M - sum y start / p = 0
        rm = add_rows(1, 0.0, 0.0)
        nz(rm, m_first + j, 1.0)
        nz(rm, ycols.ravel(), -(inv_p * starts[None, :]).ravel())
        # one grid at a time: sum_g y[g, b] <= usable; implied where usable >= the longest run (the y of a
        # job sum to at most that) and in the unbounded tail
        fin = np.isfinite(usable)
        one = usable < p.max()
        if k > 1 and one.any():
            ro = add_rows(int(one.sum()), -np.inf, usable[one])
            nz(np.tile(np.arange(ro, ro + int(one.sum())), k), ycols[:, one].ravel(), 1.0)
        ids = []
        for c, _, level in blocks:
            ids.append(block_id.setdefault((level, c >> level), len(block_id)))
        ids.append(-1)  # tail
        ys_cols.append(ycols.ravel())
        ys_block.append(np.tile(np.array(ids), k))
        ys_type.append(np.repeat(gt, nb))
        ys_gpus.append(np.repeat(gpus, nb))
        ys_tail.append(np.tile(~fin, k))
        ys_inv_p.append(inv_p.ravel())
        ys_job.append(np.full(k * nb, j))
        # the master starts with the job alone on its fastest grid from its release, and every grid's tail
        fastest = (p == p.min())[:, None]
        ys_first.append(((fastest & (starts[None, :] < rel[j] + 2 * p.min())) | ~fin[None, :]).ravel())
    ycol = np.concatenate(ys_cols)
    yblk = np.concatenate(ys_block)
    ytyp = np.concatenate(ys_type)
    ygpu = np.concatenate(ys_gpus)
    ytail = np.concatenate(ys_tail)
    yinvp = np.concatenate(ys_inv_p)
    # --- capacity tree: close the used blocks under parents up to the root
    top = horizon.bit_length() - 1
    used = set(block_id)
    frontier_ = list(used)
    while frontier_:
        nxt = []
        for lvl, idx in frontier_:
            if lvl < top:
                par = (lvl + 1, idx // 2)
                if par not in used:
                    used.add(par)
                    nxt.append(par)
        frontier_ = nxt
    for key in sorted(used):
        block_id.setdefault(key, len(block_id))
    nblk = len(block_id)
    keys = np.array(sorted(block_id, key=block_id.get))  # row b = block with id b
    # which (block, type) pairs need a U: those with a y of that type in the subtree
    has = np.zeros((nblk, len(types)), dtype=bool)
    sel = yblk >= 0
    has[yblk[sel], ytyp[sel]] = True
    order = np.argsort(keys[:, 0])  # children before parents
    parent = np.full(nblk, -1)
    for b in order:
        lvl, idx = keys[b]
        if lvl < top:
            parent[b] = block_id[(lvl + 1, idx // 2)]
    for b in order:
        if parent[b] >= 0:
            has[parent[b]] |= has[b]
    ub, ut = np.nonzero(has)
    u_index = -np.ones((nblk, len(types)), dtype=np.int64)
    cap = np.array([inst.capacity[t] for t in types], dtype=float)
    length = 2.0 ** keys[:, 0]
    u0 = add_cols(len(ub), 0.0, cap[ut] * length[ub])
    u_index[ub, ut] = np.arange(u0, u0 + len(ub))
    ur0 = add_rows(len(ub), 0.0, 0.0)
    u_row = -np.ones((nblk, len(types)), dtype=np.int64)
    u_row[ub, ut] = np.arange(ur0, ur0 + len(ub))
    nz(u_row[ub, ut], u_index[ub, ut], 1.0)
    child = parent[ub] >= 0
    nz(u_row[parent[ub[child]], ut[child]], u_index[ub[child], ut[child]], -1.0)
    nz(u_row[yblk[sel], ytyp[sel]], ycol[sel], -ygpu[sel])
    rows = np.concatenate(r_rows).astype(np.int64)
    cols = np.concatenate(r_cols).astype(np.int64)
    vals = np.concatenate(r_vals)
    return _Model(np.array(cost), np.array(col_lo, dtype=float), np.array(col_hi, dtype=float),
                  np.array(row_lo, dtype=float), np.array(row_hi, dtype=float), rows, cols, vals,
                  np.arange(c_first, c_first + n), (ycol, yinvp, ytail), np.concatenate(ys_job),
                  ycol[np.concatenate(ys_first)])


def _lagrangian(m: _Model, y: np.ndarray) -> float:
    """min over D of c x + y (s - A x), s in [row_lo, row_hi]: a lower bound on the LP for any y, for any
    set D of columns that holds the LP's optimum. D is the column box, and for each job's time columns
    also "their shares y / p sum to at most 1" (every schedule's image and every LP point sum them to
    exactly 1): without it a job's many time columns of negative reduced cost each count at their box's
    top, which sank the bound of early column-generation rounds far below zero. Duals of the wrong sign
    for an infinite row side are set to 0 (any y is allowed)."""
    y = np.where((y > 0) & ~np.isfinite(m.row_lo), 0.0, y)
    y = np.where((y < 0) & ~np.isfinite(m.row_hi), 0.0, y)
    row_term = np.where(y > 0, y * np.where(np.isfinite(m.row_lo), m.row_lo, 0.0),
                        y * np.where(np.isfinite(m.row_hi), m.row_hi, 0.0)).sum()
    aty = np.bincount(m.cols, weights=m.vals * y[m.rows], minlength=len(m.cost))
    d = m.cost - aty
    ycol, yinvp, _ = m.y_work
    box = np.ones(len(d), dtype=bool)
    box[ycol] = False
    col_term = np.where(d[box] > 0, d[box] * m.lo[box], d[box] * m.hi[box]).sum()
    return float(row_term + col_term + _share_knapsack(d[ycol] / yinvp, m.hi[ycol] * yinvp, m.y_job))


def _share_knapsack(per_share: np.ndarray, cap: np.ndarray, job: np.ndarray) -> float:
    """sum over jobs of min sum e s, 0 <= s <= cap, sum s <= 1 (s: share of the work, e: reduced cost per
    share): per job the most negative shares first (a fractional knapsack; the lower bounds are 0)."""
    neg = per_share < 0
    e, c, jb = per_share[neg], cap[neg], job[neg]
    if len(e) == 0:
        return 0.0
    order = np.lexsort((e, jb))
    e, c, jb = e[order], c[order], jb[order]
    cum = np.cumsum(c)
    first = np.r_[True, jb[1:] != jb[:-1]]
    base = np.maximum.accumulate(np.where(first, cum - c, 0.0))  # share taken by the job's earlier columns
    before = cum - c - base
    take = np.clip(1.0 - before, 0.0, c)
    return float((e * take).sum())


def _passes(opts: BoundOptions) -> list[BoundOptions]:
    """The LPs solve() runs in turn: the coarse one first where it is coarser (a valid bound early), then
    the one asked for."""
    if opts.first_epsilon is not None and opts.first_epsilon > opts.epsilon:
        return [opts.model_copy(update={"epsilon": opts.first_epsilon, "max_doublings": 0}), opts]
    return [opts]


def solve(inst: BoundInstance, opts: BoundOptions | None = None) -> BoundResult:
    opts = opts or BoundOptions()
    cell = inst.interval_s / opts.cells_per_interval
    mean_submit = float(np.mean([j.submit for j in inst.jobs]))
    cfree = float(np.mean([j.release - j.submit + j.p_min for j in inst.jobs]))
    to_s = inst.origin - mean_submit
    t_build = t_solve = 0.0
    deadline = time.perf_counter() + opts.time_limit_s
    rounds = 0
    kept = None  # every LP below bounds the average JCT: keep the highest valid one
    log = []
    for po in _passes(opts):
        for doubling in range(po.max_doublings + 1):
            horizon = _horizon_cells(inst, cell, po, doubling)
            t0 = time.perf_counter()
            m = build(inst, po, horizon)
            t1 = time.perf_counter()
            if po.method == "full":
                word, obj, x, lag = _run_full(m, po, deadline - t1)
            else:
                word, obj, x, lag, rounds = _run_colgen(m, po, deadline)
            t2 = time.perf_counter()
            t_build += t1 - t0
            t_solve += t2 - t1
            tail = 0.0
            if x is not None:
                ycol, yinvp, ytail = m.y_work
                tail = float((x[ycol[ytail]] * yinvp[ytail]).sum() / len(inst.jobs))
            valid = lag is not None and math.isfinite(lag)
            log.append({"epsilon": po.epsilon, "horizon_s": horizon * cell, "status": word,
                        "bound_s": lag * cell + to_s if valid else None, "columns": len(m.cost),
                        "rows": len(m.row_lo), "nonzeros": len(m.vals), "build_s": t1 - t0, "solve_s": t2 - t1,
                        "tail_work": tail})
            if kept is None or (valid and (kept[0] is None or lag > kept[0])):
                kept = (lag if valid else None, word, obj, x, m, horizon, tail)
            # a doubled horizon is a larger LP: try it only where work spilled past this one and the time
            # left is at least twice what this one took
            if (po.horizon_s is not None or tail <= po.tail_tol or word != "optimal"
                    or deadline - time.perf_counter() < 2 * (t2 - t0)):
                break
        if time.perf_counter() > deadline:
            break
    lag, word, obj, x, m, horizon, tail = kept
    bound = lag * cell + to_s if lag is not None and math.isfinite(lag) else None
    comp = {}
    if x is not None:
        comp = {j.id: float(x[m.c_cols[i]] * cell + inst.origin - j.submit) for i, j in enumerate(inst.jobs)}
    res = BoundResult(avg_jct_bound_s=bound, lp_objective_s=obj * cell + to_s if obj is not None else None,
                      status=word, jobs=len(inst.jobs), rejected=len(inst.rejected), contention_free_s=cfree,
                      horizon_s=horizon * cell, tail_work=tail, columns=len(m.cost), rows=len(m.row_lo),
                      nonzeros=len(m.vals), build_s=t_build, solve_s=t_solve, options=opts.model_dump(),
                      completion_s=comp, passes=log)
    res.colgen_rounds = rounds
    return res


def _lp(m: _Model, cols: np.ndarray, csc: tuple):
    """The HighsLp of the model restricted to `cols` (all rows)."""
    import highspy

    inf = highspy.kHighsInf
    starts_full, index_full, value_full = csc
    sub_starts, sub_index, sub_value = _csc_slice(cols, starts_full, index_full, value_full)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(cols), len(m.row_lo)
    lp.sense_ = highspy.ObjSense.kMinimize
    lp.col_cost_ = m.cost[cols]
    lp.col_lower_ = np.where(np.isfinite(m.lo[cols]), m.lo[cols], -inf)
    lp.col_upper_ = np.where(np.isfinite(m.hi[cols]), m.hi[cols], inf)
    lp.row_lower_ = np.where(np.isfinite(m.row_lo), m.row_lo, -inf)
    lp.row_upper_ = np.where(np.isfinite(m.row_hi), m.row_hi, inf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = len(cols), len(m.row_lo)
    lp.a_matrix_.start_ = sub_starts.astype(np.int32)
    lp.a_matrix_.index_ = sub_index.astype(np.int32)
    lp.a_matrix_.value_ = sub_value
    return lp


def _csc(m: _Model) -> tuple:
    order = np.lexsort((m.rows, m.cols))
    starts = np.zeros(len(m.cost) + 1, dtype=np.int64)
    np.cumsum(np.bincount(m.cols, minlength=len(m.cost)), out=starts[1:])
    return starts, m.rows[order], m.vals[order]


def _csc_slice(cols: np.ndarray, starts: np.ndarray, index: np.ndarray, value: np.ndarray):
    counts = starts[cols + 1] - starts[cols]
    sub_starts = np.zeros(len(cols) + 1, dtype=np.int64)
    np.cumsum(counts, out=sub_starts[1:])
    # positions of the selected columns' entries: each column's range, concatenated
    pos = np.repeat(starts[cols] - sub_starts[:-1], counts) + np.arange(sub_starts[-1])
    return sub_starts, index[pos], value[pos]


_STATUS = {"Optimal": "optimal", "Time limit reached": "time_limit"}


def _run_full(m: _Model, opts: BoundOptions, time_left: float):
    """Every column at once: (status, objective, column values, Lagrangian bound)."""
    from arena_opt.milp.solve import _highs, highs_solution, run_highs

    lp = _lp(m, np.arange(len(m.cost)), _csc(m))
    # HiGHS compares its time limit with the instance's run time summed over every run so far (measured:
    # a second LP on the shared instance stopped after limit - first run's seconds), so add that sum
    word, info, col = run_highs(lp, time_limit_s=_highs().getRunTime() + max(1.0, time_left), mip_gap=0.0,
                                threads=opts.threads,
                                options={"solver": opts.solver})
    sol = highs_solution()
    lag = _lagrangian(m, np.asarray(sol.row_dual)) if sol is not None and sol.dual_valid else None
    obj = info.objective_function_value if col is not None else None
    return _STATUS.get(word, word), obj, col, lag


def _run_colgen(m: _Model, opts: BoundOptions, deadline: float):
    """Column generation over the y columns: simplex on a subset (warm-started as columns are added),
    each round priced against every column. Every round's duals give a Lagrangian bound over all the
    columns, so the bound is valid even when time runs out; when no column prices out it is the LP's
    optimum. Returns (status, objective, full column values, best bound, rounds)."""
    from arena_opt.milp.solve import shared_highs

    csc = _csc(m)
    is_y = np.zeros(len(m.cost), dtype=bool)
    is_y[m.y_work[0]] = True
    in_master = ~is_y
    in_master[m.y_first] = True
    cols = np.flatnonzero(in_master)
    h = shared_highs(time_limit_s=max(1.0, deadline - time.perf_counter()), threads=opts.threads,
                     options={"solver": "simplex"})
    with h:
        h.model.passModel(_lp(m, cols, csc))
        best, rounds, word, obj, x = -math.inf, 0, "not run", None, None
        while True:
            h.model.setOptionValue("time_limit", h.model.getRunTime() + max(1.0, deadline - time.perf_counter()))
            h.model.run()
            rounds += 1
            word = _STATUS.get(h.model.modelStatusToString(h.model.getModelStatus()), "other")
            sol = h.model.getSolution()
            if word != "optimal" or not sol.dual_valid:
                break
            duals = np.asarray(sol.row_dual)
            best = max(best, _lagrangian(m, duals))
            x = np.zeros(len(m.cost))
            x[cols] = np.asarray(sol.col_value)
            obj = h.model.getInfo().objective_function_value
            d = m.cost - np.bincount(m.cols, weights=m.vals * duals[m.rows], minlength=len(m.cost))
            cand = np.flatnonzero(~in_master & (d < -1e-9))
            if len(cand) == 0 or obj - best <= opts.gap * abs(obj):
                break
            if time.perf_counter() > deadline:
                word = "time_limit"
                break
            if len(cand) > opts.max_add:
                cand = cand[np.argpartition(d[cand], opts.max_add)[: opts.max_add]]
            cand.sort()
            in_master[cand] = True
            cols = np.concatenate([cols, cand])
            st, ix, va = _csc_slice(cand, *csc)
            h.model.addCols(len(cand), m.cost[cand], m.lo[cand], m.hi[cand], len(ix), st[:-1].astype(np.int32),
                            ix.astype(np.int32), va)
    return word, obj, x, (best if math.isfinite(best) else None), rounds
