"""A linear program as named blocks, emitted to Pyomo or to highspy arrays under the same names.

Variables come in named blocks (one Pyomo `Var` each) and rows in named constraint families (one
Pyomo `Constraint` each), so the model a solver sees reads like its statement on paper. A family is
built whole with numpy as COO triplets (row within the family, model column, coefficient);
duplicate entries add up and zero coefficients are dropped, once, when the rows are gathered into
the CSR matrix that both emissions read. The level-1 MILP (model.py) and the baselines' 0/1 type
assignment (policies/type_assignment.py) are both stated this way and solved by `solve.solve_linear`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

KINDS = ("B", "I", "C")  # binary, integer >= 0, continuous >= 0


@dataclass
class VarBlock:
    name: str
    kind: str
    start: int  # model column of the block's first variable
    cost: np.ndarray  # objective coefficient of each variable
    labels: list | None = None  # Pyomo index of each variable (None: 0..size-1)

    @property
    def size(self) -> int:
        return len(self.cost)

    def col(self, i) -> np.ndarray:
        """Model columns of the block's variables `i` (positions within the block)."""
        return self.start + np.asarray(i, dtype=np.int64)


@dataclass
class Family:
    name: str
    labels: list | None  # Pyomo index of each row; None: one unindexed row
    row: np.ndarray  # COO entries: row within the family, model column, coefficient
    col: np.ndarray
    val: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @property
    def num_rows(self) -> int:
        return len(self.lo)


def _bounds(v, n: int, default: float) -> np.ndarray:
    return np.full(n, default, dtype=float) if v is None else np.broadcast_to(np.asarray(v, dtype=float), (n,)).copy()


@dataclass
class LinearModel:
    """maximize (or minimize) cost . x subject to lo <= A x <= hi, family by family."""

    sense: str = "max"
    blocks: list[VarBlock] = field(default_factory=list)
    families: list[Family] = field(default_factory=list)
    _csr: tuple | None = field(default=None, repr=False)

    @property
    def num_cols(self) -> int:
        return self.blocks[-1].start + self.blocks[-1].size if self.blocks else 0

    @property
    def num_rows(self) -> int:
        return sum(f.num_rows for f in self.families)

    def add_vars(self, name: str, kind: str, cost, labels: list | None = None) -> VarBlock:
        assert kind in KINDS and name not in {b.name for b in self.blocks} | {f.name for f in self.families}
        cost = np.asarray(cost, dtype=float).reshape(-1)
        assert labels is None or len(labels) == len(cost)
        b = VarBlock(name, kind, self.num_cols, cost, labels)
        self.blocks.append(b)
        return b

    def add_rows(self, name: str, row, col, val, lo=None, hi=None, labels: list | None = None) -> Family:
        """A family of len(labels) rows (one unindexed row when labels is None); `val` may be a scalar."""
        assert name not in {b.name for b in self.blocks} | {f.name for f in self.families}
        n = 1 if labels is None else len(labels)
        row = np.asarray(row, dtype=np.int64).reshape(-1)
        col = np.asarray(col, dtype=np.int64).reshape(-1)
        val = np.broadcast_to(np.asarray(val, dtype=float), row.shape).copy()
        assert len(col) == len(row) and (not len(row) or (row.min() >= 0 and row.max() < n))
        f = Family(name, labels, row, col, val, _bounds(lo, n, -np.inf), _bounds(hi, n, np.inf))
        self.families.append(f)
        self._csr = None
        return f

    # --- views the emissions share ----------------------------------------------------------------
    def kinds(self) -> np.ndarray:
        return np.concatenate([np.full(b.size, b.kind) for b in self.blocks]) if self.blocks else np.zeros(0, str)

    def cost(self) -> np.ndarray:
        return np.concatenate([b.cost for b in self.blocks]) if self.blocks else np.zeros(0)

    def upper(self) -> np.ndarray:
        return np.where(self.kinds() == "B", 1.0, np.inf)

    def row_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.families:
            return np.zeros(0), np.zeros(0)
        return np.concatenate([f.lo for f in self.families]), np.concatenate([f.hi for f in self.families])

    def row_ranges(self) -> dict[str, range]:
        """Rows of each family in the stacked matrix (the highspy emission's row numbers)."""
        out, r = {}, 0
        for f in self.families:
            out[f.name] = range(r, r + f.num_rows)
            r += f.num_rows
        return out

    def row_names(self) -> list[str]:
        return [f.name if f.labels is None else f"{f.name}[{_label(lab)}]" for f in self.families
                for lab in (f.labels if f.labels is not None else [None])]

    def col_names(self) -> list[str]:
        return [f"{b.name}[{_label(lab)}]" for b in self.blocks
                for lab in (b.labels if b.labels is not None else range(b.size))]

    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All families stacked row-wise: (starts, column index, value), columns ascending in a row,
        duplicates summed, zeros dropped."""
        if self._csr is None:
            offs = np.cumsum([0] + [f.num_rows for f in self.families])
            nrows, ncols = int(offs[-1]), max(self.num_cols, 1)
            if self.families:
                r = np.concatenate([f.row + o for f, o in zip(self.families, offs[:-1])])
                c = np.concatenate([f.col for f in self.families])
                v = np.concatenate([f.val for f in self.families])
            else:
                r = c = np.zeros(0, dtype=np.int64)
                v = np.zeros(0)
            key = r * ncols + c
            order = np.argsort(key, kind="stable")
            key, v = key[order], v[order]
            uniq, first = np.unique(key, return_index=True)
            v = np.add.reduceat(v, first) if len(v) else v
            keep = v != 0
            uniq, v = uniq[keep], v[keep]
            starts = np.zeros(nrows + 1, dtype=np.int64)
            np.cumsum(np.bincount(uniq // ncols, minlength=nrows), out=starts[1:])
            self._csr = (starts, (uniq % ncols).astype(np.int32), v)
        return self._csr


def _label(lab) -> str:
    return ",".join(map(str, lab)) if isinstance(lab, tuple) else str(lab)


# --- emissions ------------------------------------------------------------------------------------
def to_pyomo(lm: LinearModel, name: str = "model"):
    """One Pyomo Var per block and one Constraint per family, named as in the model."""
    # pyomo.core, not pyomo.environ: environ also loads every solver, transformation and plugin package
    # (0.25 s of a cold call's 0.5 s of Pyomo imports); the contrib HiGHS interface needs none of them
    import pyomo.core as pyo
    from pyomo.core.expr.numeric_expr import LinearExpression

    domain = {"B": pyo.Binary, "I": pyo.NonNegativeIntegers, "C": pyo.NonNegativeReals}
    m = pyo.ConcreteModel(name=name)
    cols = []
    for b in lm.blocks:
        v = pyo.Var(b.labels if b.labels is not None else range(b.size), domain=domain[b.kind])
        m.add_component(b.name, v)
        cols.extend(v.values())
    starts, index, value = lm.csr()
    starts, index, value = starts.tolist(), index.tolist(), value.tolist()
    r = 0
    for f in lm.families:
        rows = {}
        for i, (lo, hi) in enumerate(zip(f.lo.tolist(), f.hi.tolist())):
            a, e = starts[r + i], starts[r + i + 1]
            body = LinearExpression(constant=0.0, linear_coefs=value[a:e], linear_vars=[cols[c] for c in index[a:e]])
            rows[i] = (None if lo == -np.inf else lo, body, None if hi == np.inf else hi)
        r += f.num_rows
        if f.labels is None:
            m.add_component(f.name, pyo.Constraint(expr=rows[0]))
        else:
            m.add_component(f.name, pyo.Constraint(f.labels, rule=dict(zip(f.labels, rows.values()))))
    c = lm.cost()
    nz = np.flatnonzero(c).tolist()
    m.obj = pyo.Objective(expr=LinearExpression(constant=0.0, linear_coefs=c[nz].tolist(),
                                                linear_vars=[cols[i] for i in nz]),
                          sense=pyo.maximize if lm.sense == "max" else pyo.minimize)
    return m


def pyomo_values(m, lm: LinearModel) -> np.ndarray:
    """Column values of a solved `to_pyomo` model, in model column order (nan where unset)."""
    out = []
    for b in lm.blocks:
        out.extend(np.nan if v.value is None else v.value for v in getattr(m, b.name).values())
    return np.asarray(out, dtype=float)


@dataclass
class HighsArrays:
    """The model as the arrays highspy's `passModel` takes as they are (row-wise matrix): what `run_highs`
    hands HiGHS. Filling a HighsLp's fields instead copies every array element by element into its lists
    (1.4 ms of a 1.6 ms hand-off of a Philly round's relaxation, about 1,800 columns)."""

    num_col: int
    num_row: int
    maximize: bool
    cost: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    row_lower: np.ndarray
    row_upper: np.ndarray
    starts: np.ndarray  # int32, num_row + 1
    index: np.ndarray  # int32
    value: np.ndarray
    integrality: np.ndarray  # int32 HighsVarType values per column; all continuous (0) when relaxed

    @property
    def is_lp(self) -> bool:
        return not self.integrality.any()

    def pass_to(self, h):
        import highspy

        sense = highspy.ObjSense.kMaximize if self.maximize else highspy.ObjSense.kMinimize
        return h.passModel(self.num_col, self.num_row, len(self.index), int(highspy.MatrixFormat.kRowwise),
                           int(sense), 0.0, self.cost, self.lower, self.upper, self.row_lower, self.row_upper,
                           self.starts, self.index, self.value, self.integrality)


def highs_arrays(lm: LinearModel, relaxed: bool = False) -> HighsArrays:
    """The model's arrays for highspy; `relaxed`: its LP relaxation (every column continuous)."""
    import highspy

    n = lm.num_cols
    starts, index, value = lm.csr()
    lo, hi = lm.row_bounds()
    f64 = lambda a: np.ascontiguousarray(a, dtype=np.float64)  # noqa: E731  (passModel reads the buffers)
    integer = np.zeros(n, dtype=np.int32)
    if not relaxed:
        integer[lm.kinds() != "C"] = int(highspy.HighsVarType.kInteger)
    return HighsArrays(n, lm.num_rows, lm.sense == "max", f64(lm.cost()), np.zeros(n), f64(lm.upper()), f64(lo),
                       f64(hi), np.ascontiguousarray(starts, dtype=np.int32), np.ascontiguousarray(index, dtype=np.int32),
                       f64(value), integer)


def to_highs(lm: LinearModel, names: bool = False, relaxed: bool = False):
    """The model as a highspy HighsLp (the fields of `highs_arrays`), for dumps and tests: `names`: row and
    column names as well (`family[label]`; `lm.row_ranges()` gives the same table without the strings);
    `relaxed`: its LP relaxation (every column continuous: no integrality list)."""
    import highspy

    a = highs_arrays(lm, relaxed)
    lp = highspy.HighsLp()
    lp.num_col_ = a.num_col
    lp.num_row_ = a.num_row
    lp.sense_ = highspy.ObjSense.kMaximize if a.maximize else highspy.ObjSense.kMinimize
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = a.cost, a.lower, a.upper  # highspy.kHighsInf is inf
    lp.row_lower_, lp.row_upper_ = a.row_lower, a.row_upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = a.num_col
    lp.a_matrix_.num_row_ = a.num_row
    lp.a_matrix_.start_ = a.starts
    lp.a_matrix_.index_ = a.index
    lp.a_matrix_.value_ = a.value
    if not a.is_lp:
        kind = {int(t): t for t in (highspy.HighsVarType.kContinuous, highspy.HighsVarType.kInteger)}
        lp.integrality_ = [kind[v] for v in a.integrality.tolist()]
    if names:
        lp.row_names_ = lm.row_names()
        lp.col_names_ = lm.col_names()
    return lp
