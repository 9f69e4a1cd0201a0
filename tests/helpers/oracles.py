"""Slow, obviously correct references the fast code is checked against.

Each oracle materialises what the library computes pointwise: whole epoch
orders as Python lists, the chunk stream walked from chunk 0 with explicit
per-dataset cursors, and lanes found by scanning every chunk.
"""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction

import numpy as np

MASK64 = (1 << 64) - 1


def _text_id(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def ref_keys(seed: int, purpose: str, *indices: int) -> list[int]:
    ss = np.random.SeedSequence([seed, _text_id(purpose), *indices])
    return [int(x) for x in ss.generate_state(8, dtype=np.uint64)]


def _mix(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def ref_permute(i: int, n: int, keys: list[int]) -> int:
    """Feistel network with cycle walking, one integer at a time."""
    if n <= 1:
        return 0
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = (1 << half) - 1
    x = i
    while True:
        left, right = x >> half, x & mask
        for k in keys[:6]:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        x = (left << half) | right
        if x < n:
            return x


def ref_epoch(name, sizes, seed, epoch, shuffle_shards, shuffle_within, block, reshuffle):
    """The whole order of one epoch of one dataset as a list of (shard, offset)."""
    e = epoch if reshuffle else 0
    nid = _text_id(name)
    s = len(sizes)
    if shuffle_shards:
        keys = ref_keys(seed, "shard-order", nid, e)
        shard_order = [ref_permute(i, s, keys) for i in range(s)]
    else:
        shard_order = list(range(s))
    flat = []
    for sh in shard_order:
        keys = ref_keys(seed, "within-shard", nid, e, sh)
        for j in range(sizes[sh]):
            flat.append((sh, ref_permute(j, sizes[sh], keys) if shuffle_within else j))
    if not block:
        return flat
    out = []
    for i in range(len(flat)):
        j, start = i // block, (i // block) * block
        size = min(block, len(flat) - start)
        keys = ref_keys(seed, "block-shuffle", nid, e, j)
        out.append(flat[start + ref_permute(i - start, size, keys)])
    return out


def ref_swrr(counts):
    total = sum(counts)
    credit = {c: 0 for c in range(len(counts))}
    seq = []
    for _ in range(total):
        for c in credit:
            credit[c] += counts[c]
        best = min((c for c in credit if counts[c] > 0), key=lambda c: (-credit[c], c))
        credit[best] -= total
        seq.append(best)
    return seq


def ref_allocation(g, chunk_size, weights):
    ws = [Fraction(w) for w in weights]
    ws = [w / sum(ws) for w in ws]
    big = max(range(len(ws)), key=lambda c: (ws[c], -c))
    out = [int(g * chunk_size * w) if c != big else 0 for c, w in enumerate(ws)]
    out[big] = g * chunk_size - sum(out)
    return out


def ref_token_allocation(g, chunk_size, token_weights, tokens_per_sample):
    """Samples of each dataset in chunks ``0..g-1`` for weights given as token shares, walking
    the chunks one by one: a dataset's sample share is its token share over its tokens per
    sample (normalised), its count in a chunk the growth of ``floor(cumulative ideal)``, and
    the dataset of largest sample share takes what the others leave."""
    shares = []
    for t, s in zip(token_weights, tokens_per_sample):
        shares.append(Fraction(t) / Fraction(s))
    total = Fraction(0)
    for x in shares:
        total += x
    shares = [x / total for x in shares]
    big = 0
    for c in range(len(shares)):
        if shares[c] > shares[big]:
            big = c
    counts = [0] * len(shares)
    for j in range(g):
        taken = 0
        for c, share in enumerate(shares):
            if c != big:
                n = math.floor((j + 1) * chunk_size * share) - math.floor(j * chunk_size * share)
                counts[c] += n
                taken += n
        counts[big] += chunk_size - taken
    return counts


def ref_sampler(datasets, seed, shuffle_shards=True, shuffle_within=True, block=None, reshuffle=True):
    """``sample(c, p)``: sample ``p`` of dataset ``c`` counted across its passes, as ``(name, shard,
    offset)``. ``datasets`` is a list of ``(name, shard_sizes)``; each epoch's whole order is built
    (by ``ref_epoch``) the first time it is needed."""
    epochs: dict = {}

    def sample(c, p):
        name, sizes = datasets[c]
        e, i = divmod(p, sum(sizes))
        if (c, e) not in epochs:
            again = reshuffle.get(name, True) if isinstance(reshuffle, dict) else reshuffle
            epochs[c, e] = ref_epoch(name, sizes, seed, e, shuffle_shards, shuffle_within, block, again)
        return (name, *epochs[c, e][i])

    return sample


def ref_passes_allowed(datasets, policy, max_repeats):
    """Each dataset's passes before the stream ends (``None``: no limit); ``policy`` and
    ``max_repeats`` are one value or a dict by dataset name."""
    out = []
    for name, _ in datasets:
        p = policy.get(name) if isinstance(policy, dict) else policy
        k = max_repeats.get(name) if isinstance(max_repeats, dict) else max_repeats
        out.append(1 if p == "stop" else None if k is None or p is None else 1 + k)
    return out


def ref_stream(datasets, weights, chunk_size, seed, shuffle_shards=True, shuffle_within=True,
               block=None, passes=1, policy=None, max_repeats=None, reshuffle=True,
               max_chunks=None):
    """Walk the chunk stream from chunk 0 with explicit cursors.

    ``datasets`` is a list of ``(name, shard_sizes)``. ``policy``, ``max_repeats`` and
    ``reshuffle`` are one value or a dict by dataset name. Returns the list of chunks, each a
    list of ``(name, shard, offset)``.
    """
    totals = [sum(sizes) for _, sizes in datasets]
    passes_allowed = ref_passes_allowed(datasets, policy, max_repeats)
    cursors = [0] * len(datasets)
    sample = ref_sampler(datasets, seed, shuffle_shards, shuffle_within, block, reshuffle)
    chunks = []
    g = 0
    while True:
        if policy is None and all(cursors[c] >= passes * totals[c] for c in range(len(totals))):
            break
        want = ref_allocation(g + 1, chunk_size, weights)
        if policy is not None and any(passes_allowed[c] is not None and want[c] > passes_allowed[c] * totals[c]
                                      for c in range(len(totals))):
            break
        if max_chunks is not None and g >= max_chunks:
            break
        counts = [want[c] - cursors[c] for c in range(len(totals))]
        taken = {c: [sample(c, cursors[c] + i) for i in range(counts[c])] for c in range(len(totals))}
        chunk = [taken[c].pop(0) for c in ref_swrr(counts)]
        chunks.append(chunk)
        cursors = want
        g += 1
    return chunks


def ref_lanes(num_chunks, replicas, seed, assignment):
    """Lane of every chunk, block by block."""
    lanes = []
    for g in range(num_chunks):
        b, s = divmod(g, replicas)
        if assignment == "modulo":
            lanes.append(s)
        else:
            lanes.append(ref_permute(s, replicas, ref_keys(seed, "lane-permute", replicas, b)))
    return lanes


def ref_lane_batches(spec, lane, microbatch_size, drop_last=True):
    """One lane's batches: every window computed in order, samples concatenated, cut in slices.

    Each batch is ``(lane, index_in_lane, rows)`` with ``rows`` a list of token lists.
    """
    from zephon_dask.core import compute_window

    rows = []
    for w in range(spec.num_windows(lane)):
        t = compute_window(spec, lane, w).table
        rows += [t.tokens[t.offsets[i]:t.offsets[i + 1]].tolist() for i in range(len(t))]
    out = []
    for i, start in enumerate(range(0, len(rows), microbatch_size)):
        part = rows[start:start + microbatch_size]
        if len(part) < microbatch_size and drop_last:
            break
        out.append((lane, i, part))
    return out


def ref_whole_steps(spec, lanes, microbatch_size, drop_last=True, per_lane=1):
    """The global steps a pass over ``lanes`` gives with ``drop_last_step``: a step holds ``per_lane``
    full batches of every lane, and the pass ends before the first step one lane cannot complete:
    any lane of the spec when every row is one sample (the count is known up front), else one of
    ``lanes`` (the stream looks ahead over its own lanes). A last partial batch is in no step."""
    from zephon_dask.operators.base import one_to_one

    known = one_to_one(spec.record_ops, spec.accumulators)
    over = range(spec.canonical_replicas) if known else lanes
    return min(len(ref_lane_batches(spec, lane, microbatch_size, True)) // per_lane for lane in over)


def ref_group_stream(spec, lanes, microbatch_size, drop_last=True, per_lane=1):
    """Strict round-robin over ``lanes``, skipping lanes that ran out; with ``drop_last_step`` each
    lane's batches after the pass's last whole step (:func:`ref_whole_steps`) are left out."""
    queues = {lane: ref_lane_batches(spec, lane, microbatch_size, drop_last) for lane in lanes}
    if spec.drop_last_step and spec.num_windows(lanes[0]) is not None:
        whole = ref_whole_steps(spec, lanes, microbatch_size, drop_last, per_lane)
        queues = {lane: q[:whole * per_lane] for lane, q in queues.items()}
    out = []
    while any(queues.values()):
        for lane in lanes:
            if queues[lane]:
                out.append(queues[lane].pop(0))
    return out


def batch_rows(batch):
    """``(lane, index_in_lane, rows)`` of a delivered batch, padding stripped."""
    rows = [row[:n].tolist() for row, n in zip(batch["tokens"], batch["lengths"])]
    return (batch.lane, batch.index_in_lane, rows)


def ref_schedule_stream(datasets, phases, chunk_size, seed, passes=1, policy=None, max_repeats=None,
                        max_chunks=200, **order):
    """A mixture schedule walked chunk by chunk with explicit cursors.

    ``phases`` is a list of ``(first chunk, weights)``, weights one int or Fraction per dataset
    (0: the dataset sits the phase out). Inside a phase the counts come from the phase's own
    allocation counted from its first chunk; the cursors carry over phase boundaries, so each
    dataset's samples are taken in its usual order (``order``: ``ref_sampler``'s keywords). Returns
    the chunks, as ``ref_stream`` does.
    """
    totals = [sum(sizes) for _, sizes in datasets]
    cursors = [0] * len(datasets)
    sample = ref_sampler(datasets, seed, **order)
    passes_allowed = ref_passes_allowed(datasets, policy, max_repeats)
    chunks = []
    g = 0
    phase, at_phase_start = 0, [0] * len(datasets)
    while g < max_chunks:
        if policy is None and all(cursors[c] >= passes * totals[c] for c in range(len(totals))):
            break
        if phase + 1 < len(phases) and g == phases[phase + 1][0]:
            phase, at_phase_start = phase + 1, list(cursors)
        first, weights = phases[phase]
        active = [c for c, w in enumerate(weights) if w > 0]
        within = ref_allocation(g + 1 - first, chunk_size, [weights[c] for c in active])
        want = list(at_phase_start)
        for c, n in zip(active, within):
            want[c] += n
        if policy is not None and any(passes_allowed[c] is not None and want[c] > passes_allowed[c] * totals[c]
                                      for c in range(len(totals))):
            break
        counts = [want[c] - cursors[c] for c in range(len(totals))]
        taken = {c: [sample(c, cursors[c] + i) for i in range(counts[c])] for c in range(len(totals))}
        chunks.append([taken[c].pop(0) for c in ref_swrr(counts)])
        cursors = want
        g += 1
    return chunks


def ref_submissions(num_windows: dict, start: dict, prefetch: int, gets: list[int]) -> list[tuple[int, int]]:
    """The (lane, window) pairs a window fetcher submits, in order, when the consumer asks for
    ``gets`` (a lane each time): at every submission, the lowest (window, lane position) not yet
    submitted among the lanes that have it, recomputed over every lane; a window asked for before
    it was submitted is submitted at once."""
    lanes = list(num_windows)
    next_submit, next_needed = dict(start), dict(start)
    inflight: set[tuple[int, int]] = set()
    out: list[tuple[int, int]] = []

    def exists(lane, w):
        return num_windows[lane] is None or w < num_windows[lane]

    def submit(lane, w):
        inflight.add((lane, w))
        out.append((lane, w))
        next_submit[lane] = w + 1

    def top_up():
        while len(inflight) < prefetch:
            candidates = [(next_submit[lane], i, lane) for i, lane in enumerate(lanes)
                          if exists(lane, next_submit[lane])]
            if not candidates:
                return
            w, _, lane = min(candidates)
            submit(lane, w)

    top_up()
    for lane in gets:
        w = next_needed[lane]
        if not exists(lane, w):
            continue
        if (lane, w) not in inflight:
            submit(lane, w)
        inflight.discard((lane, w))
        next_needed[lane] = w + 1
        top_up()
    return out


def ref_grouped_submissions(num_windows: dict, start: dict, prefetch: int, gets: list[int], size: int,
                            split_first: int = 0, alone_at_end: int = 0) -> list[tuple[tuple[int, int], ...]]:
    """The tasks a fused window fetcher submits with ``windows_per_task=size``, each as its
    (lane, window) members, when the consumer asks for ``gets``: windows in the order of
    :func:`ref_submissions` (recomputed over every lane at each step); a lane's first window among
    the first ``split_first`` submissions goes alone, as does a window asked for before it was
    submitted; so does each of the last ``alone_at_end`` windows when every lane ends; other
    windows go ``size`` at a time (fewer only when none is left or a lone one comes next), once
    ``prefetch`` leaves room for ``size`` more."""
    lanes = list(num_windows)
    size = max(1, min(size, prefetch))
    next_submit, next_needed = dict(start), dict(start)
    inflight: set[tuple[int, int]] = set()
    out: list[tuple[tuple[int, int], ...]] = []

    def exists(lane, w):
        return num_windows[lane] is None or w < num_windows[lane]

    def lowest():
        candidates = [(next_submit[lane], i, lane) for i, lane in enumerate(lanes) if exists(lane, next_submit[lane])]
        if not candidates:
            return None
        w, _, lane = min(candidates)
        return lane, w

    def alone(lane, w, seq):
        if all(n is not None for n in num_windows.values()):
            left = sum(max(0, num_windows[la] - next_submit[la]) for la in lanes)  # counts (lane, w) too
            if left <= alone_at_end:
                return True
        return w == start[lane] and seq < split_first

    def submitted():
        return sum(len(t) for t in out)

    def submit(members):
        for lane, w in members:
            inflight.add((lane, w))
            next_submit[lane] = w + 1
        out.append(tuple(members))

    def top_up():
        while len(inflight) < prefetch and (nxt := lowest()) is not None:
            if size == 1 or alone(*nxt, submitted()):
                submit([nxt])
                continue
            if prefetch - len(inflight) < size:
                return
            members = [nxt]
            next_submit[nxt[0]] = nxt[1] + 1
            while len(members) < size and (nxt := lowest()) is not None and not alone(*nxt, submitted() + len(members)):
                members.append(nxt)
                next_submit[nxt[0]] = nxt[1] + 1
            submit(members)

    top_up()
    for lane in gets:
        w = next_needed[lane]
        if not exists(lane, w):
            continue
        if (lane, w) not in inflight:
            submit([(lane, w)])
        inflight.discard((lane, w))
        next_needed[lane] = w + 1
        top_up()
    return out


def ref_batch_arrays(table, opts) -> dict:
    """A batch's arrays from every row of ``table``, one row and one column at a time: rows
    padded to the longest, labels by the rule in ``zephon_dask.consumer.batch``'s docstring."""
    b = len(table)
    width = max((int(n) for n in table.lengths), default=0)
    tokens = np.full((b, width), opts.pad_id, dtype=np.int64)
    positions = np.zeros((b, width), dtype=np.int64)
    docs = np.full((b, width), -1, dtype=np.int64)
    mask = np.zeros((b, width), dtype=np.int64)
    for i in range(b):
        lo, hi = int(table.offsets[i]), int(table.offsets[i + 1])
        for t in range(hi - lo):
            tokens[i, t], positions[i, t] = int(table.tokens[lo + t]), int(table.positions[lo + t])
            docs[i, t] = int(table.document_ids[lo + t])
            mask[i, t] = 1 if table.loss_mask is None else int(table.loss_mask[lo + t])
    out = {"tokens": tokens, "positions": positions, "document_ids": docs,
           "lengths": np.asarray(table.lengths, dtype=np.int64)}
    if opts.label_convention is not None:
        labels = np.full((b, width), opts.ignore_index, dtype=np.int64)  # target of t: token t + 1
        trained = np.zeros((b, width), dtype=bool)
        for i in range(b):
            for t in range(width - 1):
                if (docs[i, t] >= 0 and docs[i, t + 1] >= 0 and mask[i, t + 1]
                        and not (opts.mask_document_boundaries and docs[i, t + 1] != docs[i, t])):
                    labels[i, t], trained[i, t] = tokens[i, t + 1], True
        if opts.label_convention == "hf":  # the target of t is token t: one column to the right
            hf_labels = np.full((b, width), opts.ignore_index, dtype=np.int64)
            hf_trained = np.zeros((b, width), dtype=bool)
            hf_labels[:, 1:], hf_trained[:, 1:] = labels[:, :-1], trained[:, :-1]
            labels, trained = hf_labels, hf_trained
            out["attention_mask"] = (docs >= 0).astype(np.int64)
            out["position_ids"] = positions
        out.update(input_ids=tokens, labels=labels, loss_mask=trained)
    if opts.cu_seqlens:
        flat = docs.reshape(-1).tolist()
        cu = [k for k in range(len(flat)) if k % width == 0 or flat[k] != flat[k - 1]] if width else []
        out["cu_seqlens"] = np.array([*cu, len(flat)], dtype=np.int32)
    per_token = {"dataset_ids": table.lineage[:, 0]} if opts.dataset_ids else {}
    per_token.update(table.fields or {})
    for name, values in per_token.items():  # a row's lineage rows, each token_count times, then the fill
        fill = -1 if values.dtype.kind in "iu" else np.nan if values.dtype.kind == "f" else False
        out[name] = np.full((b, width), fill, dtype=values.dtype)
        for i in range(b):
            expanded = [v for (*_, count), v in zip(table.sample_lineage(i).tolist(),
                                                    values[table.lineage_offsets[i]:table.lineage_offsets[i + 1]].tolist(),
                                                    strict=True) for _ in range(count)]
            out[name][i, :len(expanded)] = expanded
    return out


def ref_identity_key(seed: int, lineage_row) -> int:
    """A sample's shuffle key, one Python int at a time: the seed's "shuffle" key mixed with
    ``(dataset, shard, offset, token_start)``."""
    key = ref_keys(seed, "shuffle")[0]
    for v in list(lineage_row)[:4]:
        key = _mix(key ^ (int(v) & MASK64))
    return key


def ref_block_shuffle(keys: list[int], buffer_size: int, warmup: bool) -> list[int]:
    """``block`` / ``block_warmup`` shuffle order: blocks cut in arrival order (of ``buffer_size``,
    or growing from ``max(1, buffer_size // 16)`` by doubling), each sorted by key (ties by arrival)."""
    out, start, size = [], 0, (max(1, buffer_size // 16) if warmup else buffer_size)
    while start < len(keys):
        block = list(range(start, min(start + size, len(keys))))
        out += sorted(block, key=lambda i: (keys[i], i))
        start += len(block)
        size = min(2 * size, buffer_size)
    return out


def ref_ensure_mixture(ds, units, weights, strict, buffer_size):
    """``ensure_mixture`` over one window, one sample at a time: ``ds`` each sample's dataset
    (``-1``: none), ``units`` its units, ``weights`` the target per dataset (any numbers).
    Strict: every dataset keeps the arrival-order prefix of its samples whose units fit in
    ``floor(T * w_c)``, ``T`` the largest total every weighted dataset can fill. Then the kept
    samples leave one by one: of the (at most ``buffer_size``) held, a sample of no dataset
    first, else the earliest of the held dataset furthest below its target share (exact
    fractions; the lowest dataset on ties). Returns the indices in output order."""
    n_ds = len(weights)
    w = [Fraction(x) / sum(Fraction(y) for y in weights) for x in weights]
    kept = list(range(len(ds)))
    if strict:
        fills = [Fraction(sum(u for d, u in zip(ds, units) if d == c)) / w[c] for c in range(n_ds) if w[c] > 0]
        t = min(fills) if fills else Fraction(0)
        used = [0] * n_ds
        kept = []
        full = [False] * n_ds
        for i, d in enumerate(ds):
            if d < 0:
                kept.append(i)
            elif not full[d] and used[d] + units[i] <= t * w[d]:
                used[d] += units[i]
                kept.append(i)
            else:
                full[d] = True  # a prefix: nothing after the first sample that does not fit
    pending, held, out = list(kept), [], []
    emitted, total = [0] * n_ds, 0
    while pending or held:
        while pending and len(held) < buffer_size:
            held.append(pending.pop(0))
        loose = [i for i in held if ds[i] < 0]
        if loose:
            pick = loose[0]
        else:
            present = sorted({ds[i] for i in held})
            best = max(present, key=lambda c: (w[c] * total - emitted[c], -c))
            pick = next(i for i in held if ds[i] == best)
            emitted[best] += units[pick]
            total += units[pick]
        held.remove(pick)
        out.append(pick)
    return out
