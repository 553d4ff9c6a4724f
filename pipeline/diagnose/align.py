"""Aligning two execution traces (trace.py) of one model in near-linear time, as `patience diff` aligns text
(onnx-array-api's `compare_onnx_execution` runs one banded edit distance over the whole traces instead):

1. anchors: steps whose key is unique in both ranges, the longest run of such pairs in order in both; keys, in
   turn: the tensor name (precisions of one graph), the value fingerprint, (squeezed shape, op) of float results;
2. each gap between anchors: an edit distance over the gap alone (`pair_costs`; a step of one side only costs 1).

Each pair is then judged on the values themselves (`judge`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace

import numpy as np

from pipeline.diagnose.trace import Step, saturated

MAX_CELLS = 4_000_000  # largest gap the edit distance aligns (cells of its table); larger gaps stay unpaired
UNPAIRABLE = 2.5  # more than deleting one step and inserting the other
FAR = 0.5  # statistics further apart than this (sum of |differences| of mean, std, max |x| over their sum) never pair


@dataclass(frozen=True)
class Row:
    mark: str  # "=", "~", "-" (only in A), "+" (only in B)
    a: int | None  # index of the step in trace A
    b: int | None
    max_abs_diff: float | None = None
    relative: float | None = None  # max_abs_diff / max |a|
    cosine: float | None = None


def _squeezed(step: Step) -> tuple[int, ...]:
    return tuple(d for d in step.shape if d != 1)


def _family(step: Step) -> str:
    return step.value.dtype.kind if step.value.dtype.kind in "fb" else "i"


def _anchors(a: list[Hashable], b: list[Hashable]) -> list[tuple[int, int]]:
    """Pairs (i, j) of keys unique in both lists, the longest chain increasing in both."""
    count_a, count_b = Counter(a), Counter(b)
    where_b = {key: j for j, key in enumerate(b) if count_b[key] == 1}
    pairs = [(i, where_b[key]) for i, key in enumerate(a) if count_a[key] == 1 and key in where_b and key is not None]
    # longest increasing subsequence in j (pairs are in i order): patience sorting
    tails: list[int] = []
    tail_index: list[int] = []
    previous = [-1] * len(pairs)
    for k, (_, j) in enumerate(pairs):
        pos = bisect_left(tails, j)
        if pos == len(tails):
            tails.append(j)
            tail_index.append(k)
        else:
            tails[pos] = j
            tail_index[pos] = k
        previous[k] = tail_index[pos - 1] if pos else -1
    chain, k = [], tail_index[-1] if tail_index else -1
    while k != -1:
        chain.append(pairs[k])
        k = previous[k]
    return chain[::-1]


def align(a: list[Step], b: list[Step], by_name: bool) -> list[tuple[int | None, int | None]]:
    """The alignment of two traces: pairs (i, j), (i, None) for a step only in A, (None, j) only in B."""
    levels: list[Callable[[Step], Hashable]] = [lambda s: s.key, lambda s: (_squeezed(s), s.op_type) if s.is_float else None]
    if by_name:
        levels.insert(0, lambda s: s.name)
    keys = [([level(s) for s in a], [level(s) for s in b]) for level in levels]
    out: list[tuple[int | None, int | None]] = []
    # explicit stack instead of recursion: (a range, b range, first level to try)
    stack: list[tuple[int, int, int, int, int] | tuple[int, int]] = [(0, len(a), 0, len(b), 0)]
    while stack:
        item = stack.pop()
        if len(item) == 2:
            out.append(item)  # an anchor, in order
            continue
        a_lo, a_hi, b_lo, b_hi, level = item
        if a_lo == a_hi or b_lo == b_hi:
            out += [(i, None) for i in range(a_lo, a_hi)] + [(None, j) for j in range(b_lo, b_hi)]
            continue
        for lv in range(level, len(levels)):
            keys_a, keys_b = keys[lv]
            found = _anchors(keys_a[a_lo:a_hi], keys_b[b_lo:b_hi])
            if found:
                work: list = []
                i0, j0 = a_lo, b_lo
                for i, j in found:
                    work += [(i0, a_lo + i, j0, b_lo + j, lv), (a_lo + i, b_lo + j)]
                    i0, j0 = a_lo + i + 1, b_lo + j + 1
                work.append((i0, a_hi, j0, b_hi, lv))
                stack += work[::-1]
                break
        else:
            out += _edit_distance(a, b, a_lo, a_hi, b_lo, b_hi)
    return out


def _features(steps: list[Step]) -> tuple[np.ndarray, ...]:
    kinds = {"input": 0, "initializer": 1, "result": 2}
    return (np.array([hash((_family(s), _squeezed(s))) for s in steps]), np.array([hash(s.key) for s in steps]),
            np.array([hash(s.op_type) for s in steps]), np.array([kinds[s.kind] for s in steps]),
            np.array([_family(s) == "f" for s in steps]), np.array([s.stats for s in steps], np.float64).reshape(len(steps), 3))


def pair_costs(a: list[Step], b: list[Step]) -> np.ndarray:
    """cost[i, j] of pairing a[i] with b[j]: 0 for equal fingerprints, more the further their statistics, UNPAIRABLE
    (more than deleting both) across dtype families or squeezed shapes, for statistics far apart (FAR), or unequal integers."""
    shape_a, key_a, op_a, kind_a, float_a, stats_a = _features(a)
    size_a = np.array([s.value.size for s in a])
    shape_b, key_b, op_b, kind_b, _, stats_b = _features(b)
    scale = np.abs(stats_a).sum(axis=1)[:, None] + np.abs(stats_b).sum(axis=1)[None, :] + 1e-12
    distance = np.abs(stats_a[:, None, :] - stats_b[None, :, :]).sum(axis=2) / scale
    # floats pair when their statistics are near (a scalar only when equal: a constant has no "same role"), integers only when equal
    near = (distance <= FAR) & (size_a[:, None] > 1)
    cost = np.where(float_a[:, None] & near, 0.3 + 1.2 * distance, UNPAIRABLE)
    cost = np.where(key_a[:, None] == key_b[None, :], 0.0, cost)
    cost += 0.1 * (op_a[:, None] != op_b[None, :]) + 0.3 * (kind_a[:, None] != kind_b[None, :])
    return np.where(shape_a[:, None] == shape_b[None, :], cost, UNPAIRABLE)


def _edit_distance(a: list[Step], b: list[Step], a_lo: int, a_hi: int, b_lo: int, b_hi: int) -> list[tuple[int | None, int | None]]:
    n, m = a_hi - a_lo, b_hi - b_lo
    if n * m > MAX_CELLS:
        return [(i, None) for i in range(a_lo, a_hi)] + [(None, j) for j in range(b_lo, b_hi)]
    cost = pair_costs(a[a_lo:a_hi], b[b_lo:b_hi])
    table = np.empty((n + 1, m + 1))
    table[0] = np.arange(m + 1)
    steps = np.arange(m + 1)
    for i in range(1, n + 1):
        best = np.empty(m + 1)
        best[0] = i
        best[1:] = np.minimum(table[i - 1, :-1] + cost[i - 1], table[i - 1, 1:] + 1)
        # a step only in B costs 1: row[j] = min over k <= j of best[k] + (j - k)
        table[i] = steps + np.minimum.accumulate(best - steps)
    pairs: list[tuple[int | None, int | None]] = []
    i, j = n, m
    at, paid = table.item, cost.item  # scalar reads: the walk back visits n + m cells
    while i or j:
        if i and j and paid(i - 1, j - 1) < UNPAIRABLE and abs(at(i, j) - at(i - 1, j - 1) - paid(i - 1, j - 1)) < 1e-9:
            pairs.append((a_lo + i - 1, b_lo + j - 1))
            i, j = i - 1, j - 1
        elif i and abs(at(i, j) - at(i - 1, j) - 1) < 1e-9:
            pairs.append((a_lo + i - 1, None))
            i -= 1
        else:
            pairs.append((None, b_lo + j - 1))
            j -= 1
    return pairs[::-1]


def judge(x: Step, y: Step, tolerance: float) -> Row:
    """`=` or `~` for a pair, with max |y - x|, that over max |x|, and the cosine (floats)."""
    if x.shape != y.shape and _squeezed(x) != _squeezed(y):
        return Row("~", None, None)
    if not (x.is_float and y.is_float):
        return Row("=" if _family(x) == _family(y) and np.array_equal(x.value.reshape(-1), y.value.reshape(-1)) else "~", None, None)
    if x.value.dtype == y.value.dtype and np.array_equal(x.value.reshape(-1), y.value.reshape(-1)):
        return Row("=", None, None, 0.0, 0.0, 1.0 if np.any(x.value) else None)  # one pass: weights and their copies mostly
    u = saturated(x.value.astype(np.float64).reshape(-1))
    v = saturated(y.value.astype(np.float64).reshape(-1))
    if u.size == 0:
        return Row("=", None, None, 0.0, 0.0, None)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(u - v)
        diff[(u == v) | (np.isnan(u) & np.isnan(v))] = 0.0  # equal infinities and NaNs in both are equal
        diff[np.isnan(diff)] = np.inf
        finite = np.isfinite(u) & np.isfinite(v)
        uf, vf = u[finite], v[finite]
        norm = float(np.linalg.norm(uf) * np.linalg.norm(vf))
        cosine = float(np.dot(uf, vf) / norm) if norm > 0 else None
    max_abs = float(diff.max())
    scale = float(np.abs(uf).max()) if uf.size else 0.0
    relative = max_abs / scale if scale > 0 else max_abs
    return Row("=" if relative <= tolerance else "~", None, None, max_abs, relative, cosine)


def aligned_rows(a: list[Step], b: list[Step], by_name: bool, tolerance: float) -> list[Row]:
    """Each aligned pair judged (`judge`); a step of one side only is "-" (only in A) or "+" (only in B)."""
    return [replace(judge(a[i], b[j], tolerance), a=i, b=j) if i is not None and j is not None else Row("-" if j is None else "+", i, j)
            for i, j in align(a, b, by_name)]
