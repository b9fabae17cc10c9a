"""Bin-packing kernels over integer lengths (all in 1..L).

Decreasing strategies (bfd, ffd, histogram) never look at single samples while deciding. Rows that
have received the same lengths so far have the same remaining capacity, so a fit rule cannot tell
them apart: such rows are kept as one *group* (a range of consecutive row ids), and a run of
equal lengths is placed into a whole group at once. Deciding therefore costs O(L log L + groups
touched), whatever N is; the capacity decisions are exactly those of the one-sample-at-a-time
rule. The output is a list of *events* (rows first..first+nrows-1 each get `per_row` samples of
length s at position `offset` in the row), and one O(N) pass (`scatter_events`) turns events
into the CSR plan: that pass and the length histogram are the only work per sample.

Kernels are small numba functions over flat arrays, cached on disk so the CLI does not recompile
them at every start, `nogil` so windows can be planned on several threads, and each is tested
against a plain-Python reference (tests/test_algorithms.py). The kernels of `pack`'s path
allocate nothing: their Python wrappers here pass the arrays in (numba compiles its allocation
code once per process and form, about a second in all on a first run; see `packer.jit`).
"""

from __future__ import annotations

import numpy as np

from packer.jit import helper, kernel

# columns of the `groups` table
G_FIRST, G_ROWS, G_ITEMS, G_CAP, G_NEXT = 0, 1, 2, 3, 4
# columns of the `events` table
E_FIRST, E_ROWS, E_PER_ROW, E_OFFSET = 0, 1, 2, 3


@kernel
def _histogram(lengths, counts):  # pragma: no cover - compiled
    """Count lengths into counts[0..L]; the index of the first length outside 1..L, or -1."""
    max_len = counts.size - 1
    for i in range(lengths.size):
        v = lengths[i]
        if v < 1 or v > max_len:
            return i
        counts[v] += 1
    return -1


def length_histogram(lengths: np.ndarray, max_len: int) -> tuple[np.ndarray, int]:
    """(counts[0..L], index of the first length outside 1..L or -1): validation for free."""
    counts = np.zeros(int(max_len) + 1, np.int64)
    return counts, int(_histogram(lengths, counts))


@kernel
def first_bad_length(lengths, max_len):  # pragma: no cover - compiled
    """Index of the first length outside 1..L, or -1."""
    for i in range(lengths.size):
        if lengths[i] < 1 or lengths[i] > max_len:
            return i
    return -1


# --------------------------------------------------------------------------------------------
# Presence tree over capacities 0..L (a bit per capacity that has at least one group)


@helper
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


@helper
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


@helper
def _tree_last(tree, size):  # pragma: no cover - compiled
    """Largest present leaf, or -1."""
    if not tree[1]:
        return -1
    node = 1
    while node < size:
        node = 2 * node + 1 if tree[2 * node + 1] else 2 * node
    return node - size


@helper
def _tree_last_below(tree, size, leaf):  # pragma: no cover - compiled
    """Largest present leaf < `leaf`, or -1."""
    if leaf <= 0:
        return -1
    node = leaf + size
    while True:
        if node == 1:
            return -1
        if (node & 1) == 1 and tree[node - 1]:
            node -= 1
            break
        node >>= 1
    while node < size:
        node = 2 * node + 1 if tree[2 * node + 1] else 2 * node
    return node - size


# --------------------------------------------------------------------------------------------
# Groups of rows in buckets by remaining capacity (a stack of groups per capacity)


@helper
def _bucket_push(groups, head, tree, size, g):  # pragma: no cover - compiled
    cap = groups[g, G_CAP]
    if cap == 0:
        return
    groups[g, G_NEXT] = head[cap]
    if head[cap] < 0:
        _tree_set(tree, size, cap, 1)
    head[cap] = g


@helper
def _bucket_pop(groups, head, tree, size, cap):  # pragma: no cover - compiled
    g = head[cap]
    head[cap] = groups[g, G_NEXT]
    if head[cap] < 0:
        _tree_set(tree, size, cap, 0)
    return g


@helper
def _new_group(
    groups, g, events, e, head, tree, size, first, nrows, took, before, cap
):  # pragma: no cover - compiled
    """Group g: nrows rows from `first`, which held `before` samples, take `took` more.

    Its capacity becomes `cap`; event e records the placement for the order pass.
    """
    _set_group(groups, g, first, nrows, before + took, cap)
    _event(events, e, first, nrows, took, before)
    _bucket_push(groups, head, tree, size, g)


@helper
def _set_group(groups, g, first, nrows, items, cap):  # pragma: no cover - compiled
    groups[g, G_FIRST] = first
    groups[g, G_ROWS] = nrows
    groups[g, G_ITEMS] = items
    groups[g, G_CAP] = cap


@helper
def _event(events, e, first, nrows, per_row, offset):  # pragma: no cover - compiled
    events[e, E_FIRST] = first
    events[e, E_ROWS] = nrows
    events[e, E_PER_ROW] = per_row
    events[e, E_OFFSET] = offset


@helper
def _open_rows(
    groups, g, events, e, head, tree, size, row, c, s, max_len
):  # pragma: no cover - compiled
    """Nothing open fits length s: c samples fill new rows from `row` on, L // s each, the last
    the rest. Returns how many groups (and events) were added: 1 or 2."""
    k = max_len // s
    q, r = c // k, c % k
    added = 0
    if q:
        _new_group(groups, g, events, e, head, tree, size, row, q, k, 0, max_len - k * s)
        added += 1
    if r:
        _new_group(
            groups,
            g + added,
            events,
            e + added,
            head,
            tree,
            size,
            row + q,
            1,
            r,
            0,
            max_len - r * s,
        )
        added += 1
    return added


def _tables(counts: np.ndarray, max_len: int, events_size: int):
    """Empty state of a decreasing pass: groups, events, ev_start, ev_end, and for the bucketed
    strategies a presence tree over capacities 0..L and the bucket heads.

    Every length opens or splits at most two groups, so `groups` never fills up; `events` may
    (a kernel then returns -1 and `_decreasing` retries with a table twice as tall).
    """
    distinct = int(np.count_nonzero(counts))
    size = 1
    while size < max_len + 1:
        size *= 2
    return (
        np.empty((2 * distinct + 2, 5), np.int64),
        np.empty((events_size, 4), np.int64),
        np.zeros(max_len + 1, np.int64),
        np.zeros(max_len + 1, np.int64),
        np.zeros(2 * size, np.int64),
        np.full(max_len + 1, -1, np.int64),
    )


def _decreasing(
    fill, counts: np.ndarray, max_len: int, bucketed: bool = True, events_size: int | None = None
):
    """Run a decreasing kernel; (groups, n_groups, events, ev_start, ev_end, num_rows)."""
    counts = np.ascontiguousarray(counts, np.int64)
    max_len = int(max_len)
    if events_size is None:  # events are 2 to 3.5 x the distinct lengths in practice
        events_size = 4 * int(np.count_nonzero(counts)) + 16
    while True:
        groups, events, ev_start, ev_end, tree, head = _tables(counts, max_len, events_size)
        tables = (groups, events, ev_start, ev_end) + ((tree, head) if bucketed else ())
        ng, ne, num_rows = fill(counts, max_len, *tables)
        if ne >= 0:
            return groups, int(ng), events, ev_start, ev_end, int(num_rows)
        events_size *= 2


# --------------------------------------------------------------------------------------------
# Decreasing strategies on groups of rows


@kernel
def _best_fit(counts, max_len, groups, events, ev_start, ev_end, tree, head):  # pragma: no cover
    """Best-fit decreasing: each sample goes to the fullest row that still fits it.

    A row with capacity `cap` that takes a sample of length s keeps being the best fit while it
    has room for another s (nothing lies between s and cap), so it takes cap // s of them; a
    whole group does the same. Returns (groups, events, rows), or events -1 when the events
    table is full.
    """
    size = tree.size // 2
    ng = 0
    ne = 0
    num_rows = 0
    for s in range(max_len, 0, -1):
        c = counts[s]
        ev_start[s] = ne
        while c > 0:
            if ne + 2 > events.shape[0]:
                return ng, -1, num_rows
            cap = _tree_first_at_least(tree, size, s)
            if cap < 0:  # nothing fits: open rows holding L // s each
                added = _open_rows(
                    groups, ng, events, ne, head, tree, size, num_rows, c, s, max_len
                )
                ng += added
                ne += added
                num_rows += -(-c // (max_len // s))
                break
            k = cap // s
            g = _bucket_pop(groups, head, tree, size, cap)
            first, nrows, items = groups[g, G_FIRST], groups[g, G_ROWS], groups[g, G_ITEMS]
            if nrows * k <= c:  # the whole group takes k each and drops below s
                _event(events, ne, first, nrows, k, items)
                ne += 1
                groups[g, G_ITEMS] = items + k
                groups[g, G_CAP] = cap - k * s
                _bucket_push(groups, head, tree, size, g)
                c -= nrows * k
                continue
            q, r = c // k, c % k  # the run ends inside this group: split it
            if q:
                _new_group(
                    groups, ng, events, ne, head, tree, size, first, q, k, items, cap - k * s
                )
                ng += 1
                ne += 1
            if r:
                _new_group(
                    groups, ng, events, ne, head, tree, size, first + q, 1, r, items, cap - r * s
                )
                ng += 1
                ne += 1
            used = q + (1 if r else 0)
            groups[g, G_FIRST] = first + used
            groups[g, G_ROWS] = nrows - used
            if nrows > used:
                _bucket_push(groups, head, tree, size, g)
            c = 0
        ev_end[s] = ne
    return ng, ne, num_rows


def best_fit_groups(counts: np.ndarray, max_len: int):
    """Best-fit decreasing on the length histogram (see `_best_fit`).

    Returns (groups, n_groups, events, ev_start, ev_end, num_rows).
    """
    return _decreasing(_best_fit, counts, max_len)


@kernel
def _worst_fit(counts, max_len, groups, events, ev_start, ev_end, tree, head):  # pragma: no cover
    """Shortest-pack-first (Graphcore's SPFHP rule): each sample goes to the emptiest row.

    Rows of the emptiest group take samples round-robin for as long as they stay at least as
    empty as the next group and still fit s; new rows are filled with L // s samples each (the
    one-at-a-time rule would do the same). Same return value as `_best_fit`.
    """
    size = tree.size // 2
    ng = 0
    ne = 0
    num_rows = 0
    for s in range(max_len, 0, -1):
        c = counts[s]
        ev_start[s] = ne
        while c > 0:
            if ne + 2 > events.shape[0]:
                return ng, -1, num_rows
            cap = _tree_last(tree, size)
            if cap < s:  # nothing fits: open rows holding L // s each
                added = _open_rows(
                    groups, ng, events, ne, head, tree, size, num_rows, c, s, max_len
                )
                ng += added
                ne += added
                num_rows += -(-c // (max_len // s))
                break
            g = _bucket_pop(groups, head, tree, size, cap)
            # the next emptiest group: `g` takes rounds while it stays at least as empty
            rival = cap if head[cap] >= 0 else max(_tree_last_below(tree, size, cap), 0)
            rounds = (cap - max(rival, s)) // s + 1
            first, nrows, items = groups[g, G_FIRST], groups[g, G_ROWS], groups[g, G_ITEMS]
            if nrows * rounds <= c:
                _event(events, ne, first, nrows, rounds, items)
                ne += 1
                groups[g, G_ITEMS] = items + rounds
                groups[g, G_CAP] = cap - rounds * s
                _bucket_push(groups, head, tree, size, g)
                c -= nrows * rounds
                continue
            q, r = c // nrows, c % nrows  # q full rounds, then r rows get one more
            if r:
                _new_group(
                    groups,
                    ng,
                    events,
                    ne,
                    head,
                    tree,
                    size,
                    first,
                    r,
                    q + 1,
                    items,
                    cap - (q + 1) * s,
                )
                ng += 1
                ne += 1
            groups[g, G_FIRST] = first + r
            groups[g, G_ROWS] = nrows - r
            if q:
                _event(events, ne, first + r, nrows - r, q, items)
                ne += 1
                groups[g, G_ITEMS] = items + q
                groups[g, G_CAP] = cap - q * s
            _bucket_push(groups, head, tree, size, g)
            c = 0
        ev_end[s] = ne
    return ng, ne, num_rows


def worst_fit_groups(counts: np.ndarray, max_len: int):
    """Shortest-pack-first on the length histogram (see `_worst_fit`); as `best_fit_groups`."""
    return _decreasing(_worst_fit, counts, max_len)


# --------------------------------------------------------------------------------------------
# Max trees over row ids (first fit): leaf r holds the capacity of the row or group starting at r


@helper
def _max_tree_set(tree, size, leaf, value):  # pragma: no cover - compiled
    node = leaf + size
    tree[node] = value
    node >>= 1
    while node >= 1:
        best = max(tree[2 * node], tree[2 * node + 1])
        if tree[node] == best:
            break
        tree[node] = best
        node >>= 1


@helper
def _max_tree_leftmost(tree, size, need):  # pragma: no cover - compiled
    """Leftmost leaf with value >= need, or -1."""
    if tree[1] < need:
        return -1
    node = 1
    while node < size:
        node = 2 * node if tree[2 * node] >= need else 2 * node + 1
    return node - size


@helper
def _max_tree_grow(tree, size):  # pragma: no cover - compiled
    """Twice as many leaves, same values."""
    bigger = np.zeros(4 * size, tree.dtype)
    for leaf in range(size):  # a loop, not a slice copy (see `packer.jit`)
        bigger[2 * size + leaf] = tree[size + leaf]
    for node in range(2 * size - 1, 0, -1):
        bigger[node] = max(bigger[2 * node], bigger[2 * node + 1])
    return bigger, 2 * size


@kernel
def _first_fit(counts, max_len, groups, events, ev_start, ev_end):  # pragma: no cover - compiled
    """First-fit decreasing: each sample goes to the lowest-numbered row that fits it.

    A max tree over row ids finds the first group that fits in O(log rows); a group takes
    cap // s per row, in row order, exactly as one-sample-at-a-time first fit would.
    Same return value as `_best_fit`.
    """
    size = 1024
    tree = np.zeros(2 * size, np.int32)  # free space fits: L <= 2^30
    group_at = np.empty(size, np.int64)
    for leaf in range(size):
        group_at[leaf] = -1
    ng = 0
    ne = 0
    num_rows = 0
    for s in range(max_len, 0, -1):
        c = counts[s]
        ev_start[s] = ne
        while c > 0:
            if ne + 2 > events.shape[0]:
                return ng, -1, num_rows
            leaf = _max_tree_leftmost(tree, size, s)
            if leaf < 0:
                k = max_len // s
                q, r = c // k, c % k
                while num_rows + q + 1 > size:  # leaves for both new groups
                    tree, size = _max_tree_grow(tree, size)
                    more = np.empty(size, np.int64)
                    for leaf in range(size):
                        more[leaf] = group_at[leaf] if leaf < group_at.size else -1
                    group_at = more
                for nr, took in ((q, k), (1 if r else 0, r)):
                    if nr:
                        _set_group(groups, ng, num_rows, nr, took, max_len - took * s)
                        _event(events, ne, num_rows, nr, took, 0)
                        group_at[num_rows] = ng
                        _max_tree_set(tree, size, num_rows, max_len - took * s)
                        ng += 1
                        ne += 1
                        num_rows += nr
                break
            g = group_at[leaf]
            cap = groups[g, G_CAP]
            k = cap // s
            first, nrows, items = groups[g, G_FIRST], groups[g, G_ROWS], groups[g, G_ITEMS]
            if nrows * k <= c:
                _event(events, ne, first, nrows, k, items)
                ne += 1
                groups[g, G_ITEMS] = items + k
                groups[g, G_CAP] = cap - k * s
                _max_tree_set(tree, size, first, cap - k * s)
                c -= nrows * k
                continue
            q, r = c // k, c % k  # the run ends inside this group: split it in row order
            used = q + (1 if r else 0)
            if q:  # `g` keeps its first q rows, which take k each
                _event(events, ne, first, q, k, items)
                ne += 1
                _set_group(groups, g, first, q, items + k, cap - k * s)
                _max_tree_set(tree, size, first, cap - k * s)
            if r:  # the next row takes the last r
                if q:
                    _set_group(groups, ng, first + q, 1, items + r, cap - r * s)
                    group_at[first + q] = ng
                    ng += 1
                else:
                    _set_group(groups, g, first, 1, items + r, cap - r * s)
                _event(events, ne, first + q, 1, r, items)
                ne += 1
                _max_tree_set(tree, size, first + q, cap - r * s)
            if nrows > used:  # the other rows keep their capacity, as a new group
                _set_group(groups, ng, first + used, nrows - used, items, cap)
                group_at[first + used] = ng
                _max_tree_set(tree, size, first + used, cap)
                ng += 1
            c = 0
        ev_end[s] = ne
    return ng, ne, num_rows


def first_fit_groups(counts: np.ndarray, max_len: int):
    """First-fit decreasing on the length histogram (see `_first_fit`); as `best_fit_groups`."""
    return _decreasing(_first_fit, counts, max_len, bucketed=False)


# --------------------------------------------------------------------------------------------
# From groups and events to a CSR plan


def row_starts_from_groups(groups: np.ndarray, n_groups: int, num_rows: int) -> np.ndarray:
    """Offsets of each row in `order`: every row of a group holds the group's item count.

    The groups cover rows 0..num_rows-1 once each; O(groups + rows), so plain numpy.
    """
    g = groups[:n_groups]
    g = g[np.argsort(g[:, G_FIRST], kind="stable")]
    row_starts = np.zeros(int(num_rows) + 1, np.int64)
    np.cumsum(np.repeat(g[:, G_ITEMS], g[:, G_ROWS]), out=row_starts[1:])
    return row_starts


@kernel
def _scatter(lengths, events, ev_start, ev_end, row_starts, state, order):  # pragma: no cover
    """Fill `order` in one pass over the samples (see `scatter_events`); state: (L + 1, 4) zeros."""
    max_len = state.shape[0] - 1
    for s in range(1, max_len + 1):
        e = ev_start[s]
        if e < ev_end[s]:
            row = events[e, E_FIRST]
            state[s, 0] = row_starts[row] + events[e, E_OFFSET]
            state[s, 1] = events[e, E_PER_ROW]
            state[s, 2] = e
            state[s, 3] = row
    for i in range(lengths.size):
        s = lengths[i]
        order[state[s, 0]] = i
        left = state[s, 1] - 1
        if left > 0:
            state[s, 0] += 1
            state[s, 1] = left
            continue
        e = state[s, 2]
        row = state[s, 3] + 1
        if row == events[e, E_FIRST] + events[e, E_ROWS]:
            e += 1
            if e == ev_end[s]:
                continue
            row = events[e, E_FIRST]
            state[s, 2] = e
        state[s, 3] = row
        state[s, 0] = row_starts[row] + events[e, E_OFFSET]
        state[s, 1] = events[e, E_PER_ROW]


def scatter_events(lengths, events, ev_start, ev_end, row_starts, max_len: int) -> np.ndarray:
    """The plan's `order` in one pass over the samples.

    The samples of each length, in index order, fill that length's events in turn. A cursor per
    length (next slot, slots left in this row, event, row) makes this a counting-sort scatter.
    """
    order = np.empty(lengths.size, np.int64)
    state = np.zeros((int(max_len) + 1, 4), np.int64)  # pos, left, event, row
    _scatter(lengths, events, ev_start, ev_end, row_starts, state, order)
    return order


# --------------------------------------------------------------------------------------------
# Order-driven strategies


@kernel
def next_fit(lengths, max_len):  # pragma: no cover - compiled
    """Row starts of next fit in input order: one pass, order preserved, streamable."""
    n = lengths.size
    row_starts = np.empty(n + 1, np.int64)
    row_starts[0] = 0
    rows = 0
    fill = max_len + 1  # forces a new row for the first sample
    for i in range(n):
        v = lengths[i]
        if fill + v > max_len:
            if i > 0:
                rows += 1
                row_starts[rows] = i
            fill = 0
        fill += v
    if n:
        rows += 1
        row_starts[rows] = n
    return row_starts[: rows + 1].copy()


@kernel
def first_fit_in_order(lengths, visit, max_len):  # pragma: no cover - compiled
    """Row of each sample under first fit, visiting samples in the order `visit`.

    A max tree over row ids holds each row's free space: O(N log rows), never O(N x rows).
    Returns (bin_of, num_rows).
    """
    size = 1024
    tree = np.zeros(2 * size, np.int32)  # free space fits: L <= 2^30
    bin_of = np.empty(lengths.size, np.int64)
    num_rows = 0
    for k in range(visit.size):
        i = visit[k]
        v = lengths[i]
        row = _max_tree_leftmost(tree, size, v)
        if row < 0:
            if num_rows == size:
                tree, size = _max_tree_grow(tree, size)
            row = num_rows
            num_rows += 1
            _max_tree_set(tree, size, row, max_len - v)
        else:
            _max_tree_set(tree, size, row, tree[row + size] - v)
        bin_of[i] = row
    return bin_of, num_rows


@kernel
def plan_from_bins(bin_of, num_rows):  # pragma: no cover - compiled
    """CSR plan from a row number per sample; samples keep their index order within a row."""
    row_starts = np.zeros(num_rows + 1, np.int64)
    for i in range(bin_of.size):
        row_starts[bin_of[i] + 1] += 1
    for r in range(num_rows):
        row_starts[r + 1] += row_starts[r]
    fill = row_starts[:-1].copy()
    order = np.empty(bin_of.size, np.int64)
    for i in range(bin_of.size):
        r = bin_of[i]
        order[fill[r]] = i
        fill[r] += 1
    return order, row_starts
