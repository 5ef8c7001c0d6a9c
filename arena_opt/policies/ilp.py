"""Small 0/1 programs for the baselines, handed to HiGHS as arrays (highspy, no modelling layer:
the baselines solve one per round and Pyomo's build costs 40-60x more than the arrays,
shared/MEASURED.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass
class IlpResult:
    x: np.ndarray | None
    status: str
    objective: float | None
    bound: float | None
    solve_s: float


class BinaryProgram:
    """maximize c.x  s.t.  lo_r <= sum_i a_ri x_i <= hi_r,  x in {0, 1} (bounds may fix variables)."""

    def __init__(self, num_vars: int):
        self.n = num_vars
        self.c = np.zeros(num_vars)
        self.lower = np.zeros(num_vars)
        self.upper = np.ones(num_vars)
        self._starts = [0]
        self._index: list[np.ndarray] = []
        self._value: list[np.ndarray] = []
        self._lo: list[float] = []
        self._hi: list[float] = []

    def add_row(self, index, value, lo: float = -np.inf, hi: float = np.inf) -> None:
        index = np.asarray(index, dtype=np.int32)
        if len(index) == 0:
            return
        value = np.broadcast_to(np.asarray(value, dtype=float), index.shape)
        self._index.append(index)
        self._value.append(np.array(value, dtype=float))
        self._starts.append(self._starts[-1] + len(index))
        self._lo.append(lo)
        self._hi.append(hi)

    def solve(self, time_limit_s: float = 10.0, mip_gap: float = 1e-4) -> IlpResult:
        import highspy

        if self.n == 0:
            return IlpResult(np.zeros(0), "empty", 0.0, 0.0, 0.0)
        inf = highspy.kHighsInf
        lp = highspy.HighsLp()
        lp.num_col_ = self.n
        lp.num_row_ = len(self._lo)
        lp.col_cost_ = self.c
        lp.col_lower_ = self.lower
        lp.col_upper_ = self.upper
        lp.row_lower_ = np.array([max(v, -inf) for v in self._lo], dtype=float)
        lp.row_upper_ = np.array([min(v, inf) for v in self._hi], dtype=float)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = np.array(self._starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.concatenate(self._index) if self._index else np.zeros(0, dtype=np.int32)
        lp.a_matrix_.value_ = np.concatenate(self._value) if self._value else np.zeros(0)
        lp.integrality_ = [highspy.HighsVarType.kInteger] * self.n
        lp.sense_ = highspy.ObjSense.kMaximize
        from arena_opt.milp.solve import run_highs

        t0 = time.perf_counter()
        status, info, col = run_highs(lp, time_limit_s=time_limit_s, mip_gap=mip_gap, threads=1)
        dt = time.perf_counter() - t0
        x = np.round(col).astype(np.int64) if col is not None else None
        bound = info.mip_dual_bound if np.isfinite(info.mip_dual_bound) else None
        obj = float(self.c @ x) if x is not None else None
        return IlpResult(x, status, obj, bound, dt)
