"""Bin-packing kernels. Each takes int lengths (all in 1..L) and returns `bin_of`, the row of
every sample, numbered in order of opening; `planning.py` turns that into a CSR plan.

Kernels are small numba functions over flat arrays, cached on disk so the CLI does not recompile
them at every start, and each is tested against a plain-Python reference.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def counting_sort_desc(lengths, max_len):  # pragma: no cover - compiled
    """Sample indices by decreasing length, ties by increasing index: O(N + L), stable."""
    counts = np.zeros(max_len + 2, np.int64)
    for i in range(lengths.size):
        counts[lengths[i]] += 1
    # start position of each length when longest first
    starts = np.zeros(max_len + 2, np.int64)
    acc = 0
    for length in range(max_len, -1, -1):
        starts[length] = acc
        acc += counts[length]
    order = np.empty(lengths.size, np.int64)
    for i in range(lengths.size):
        length = lengths[i]
        order[starts[length]] = i
        starts[length] += 1
    return order


@njit(cache=True)
def _tree_set(tree, size, leaf, present):  # pragma: no cover - compiled
    node = leaf + size
    tree[node] = present
    node >>= 1
    while node >= 1:
        value = tree[2 * node] | tree[2 * node + 1]
        if tree[node] == value:
            break
        tree[node] = value
        node >>= 1


@njit(cache=True)
def _tree_first_at_least(tree, size, leaf):  # pragma: no cover - compiled
    """Smallest present leaf >= `leaf`, or -1."""
    node = leaf + size
    if tree[node]:
        return leaf
    while True:
        if node == 1:
            return -1
        if (node & 1) == 0 and tree[node + 1]:
            node += 1
            break
        node >>= 1
    while node < size:
        node = 2 * node if tree[2 * node] else 2 * node + 1
    return node - size


@njit(cache=True)
def best_fit_decreasing(lengths, max_len):  # pragma: no cover - compiled
    """Best-fit decreasing in O(N log L).

    Open rows are bucketed by remaining capacity (a stack per capacity, linked through
    `next_row`); a segment tree over capacities 0..L finds the smallest capacity that still
    fits a sample. The tie between rows of equal capacity goes to the most recently touched one,
    which keeps the result deterministic.
    """
    n = lengths.size
    order = counting_sort_desc(lengths, max_len)
    size = 1
    while size < max_len + 1:
        size *= 2
    tree = np.zeros(2 * size, np.uint8)
    head = np.full(max_len + 1, -1, np.int64)  # top row of each capacity's stack
    next_row = np.empty(n, np.int64)
    remaining = np.empty(n, np.int64)
    bin_of = np.empty(n, np.int64)
    num_rows = 0
    for k in range(n):
        item = order[k]
        length = lengths[item]
        cap = _tree_first_at_least(tree, size, length)
        if cap < 0:
            row = num_rows
            num_rows += 1
            left = max_len - length
        else:
            row = head[cap]
            head[cap] = next_row[row]
            if head[cap] < 0:
                _tree_set(tree, size, cap, 0)
            left = cap - length
        remaining[row] = left
        bin_of[item] = row
        if left > 0:
            next_row[row] = head[left]
            if head[left] < 0:
                _tree_set(tree, size, left, 1)
            head[left] = row
    return bin_of, num_rows
