"""Optimal one-to-one matching of tracks to detections under a cost threshold, in NumPy.

`match(cost, thresh)` gives what ByteTrack's `linear_assignment` gives (costs above `thresh` set to
thresh + 1e-4, a minimum-cost assignment, pairs above `thresh` dropped) without SciPy or lap:

* pairs at most `thresh` are the only ones that can match, and an assignment that uses more of them,
  cheaper, always wins, so the problem splits into the connected groups of such pairs;
* a row whose only candidate column has no other candidate row (the common case: objects apart
  from each other) is matched at once;
* the rest, a few rows and columns where boxes overlap, goes to a shortest augmenting path solver
  (Jonker-Volgenant, in the form of Crouse 2016, as SciPy's linear_sum_assignment).
"""

from __future__ import annotations

import numpy as np

#: what ByteTrack gives a pair above the threshold, so that no such pair is preferred to leaving
#: its row unmatched when a pair at most the threshold exists.
_OVER = 1e-4

EMPTY = np.zeros(0, np.intp)


def match(cost: np.ndarray, thresh: float) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of the matched pairs, each cost <= thresh; rows ascending."""
    if cost.size == 0:
        return EMPTY, EMPTY
    valid = cost <= thresh
    per_row = valid.sum(axis=1)
    per_col = valid.sum(axis=0)
    rows_alone = np.flatnonzero(per_row == 1)
    cols_alone = valid[rows_alone].argmax(axis=1)
    single = per_col[cols_alone] == 1
    rows, cols = rows_alone[single], cols_alone[single]
    left_rows = np.flatnonzero(per_row > 0)
    if len(rows) == len(left_rows):
        return rows, cols
    left_rows = np.setdiff1d(left_rows, rows, assume_unique=True)
    left_cols = np.setdiff1d(np.flatnonzero(per_col > 0), cols, assume_unique=True)
    sub = np.minimum(cost[np.ix_(left_rows, left_cols)], thresh + _OVER)
    sub_rows, sub_cols = solve(sub)
    keep = sub[sub_rows, sub_cols] <= thresh
    rows = np.concatenate((rows, left_rows[sub_rows[keep]]))
    cols = np.concatenate((cols, left_cols[sub_cols[keep]]))
    order = np.argsort(rows, kind="stable")
    return rows[order], cols[order]


def solve(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A minimum-cost assignment of a finite (n, m) matrix: min(n, m) pairs, rows ascending."""
    if cost.shape[0] > cost.shape[1]:
        cols, rows = solve(cost.T)
        order = np.argsort(rows, kind="stable")
        return rows[order], cols[order]
    col_of_row = _shortest_augmenting_paths(np.asarray(cost, np.float64))
    return np.arange(cost.shape[0]), col_of_row


def _shortest_augmenting_paths(cost: np.ndarray) -> np.ndarray:
    """Column of each row, for n <= m. Each row is added by a Dijkstra search (reduced costs
    kept non-negative by the duals u, v) for the cheapest path to a free column, then the path is
    flipped."""
    n, m = cost.shape
    u = np.zeros(n)
    v = np.zeros(m)
    col_of_row = np.full(n, -1, np.intp)
    row_of_col = np.full(m, -1, np.intp)
    for start in range(n):
        shortest = np.full(m, np.inf)
        path = np.full(m, -1, np.intp)
        seen_rows = np.zeros(n, bool)
        seen_cols = np.zeros(m, bool)
        row, reach, sink = start, 0.0, -1
        while sink < 0:
            seen_rows[row] = True
            reduced = reach + cost[row] - u[row] - v
            better = ~seen_cols & (reduced < shortest)
            path[better] = row
            shortest[better] = reduced[better]
            open_costs = np.where(seen_cols, np.inf, shortest)
            reach = float(open_costs.min())
            ties = np.flatnonzero(open_costs == reach)
            free = ties[row_of_col[ties] < 0]
            col = int(free[0] if len(free) else ties[0])  # a free column ends the search at once
            seen_cols[col] = True
            if row_of_col[col] < 0:
                sink = col
            else:
                row = int(row_of_col[col])
        u[start] += reach
        others = seen_rows.copy()
        others[start] = False
        u[others] += reach - shortest[col_of_row[others]]
        v[seen_cols] -= reach - shortest[seen_cols]
        col = sink
        while True:
            row = int(path[col])
            row_of_col[col] = row
            col_of_row[row], col = col, int(col_of_row[row])
            if row == start:
                break
    return col_of_row
