"""``stats(pipeline)``: how the current iteration is going. Reads state; changes nothing.

Per-lane progress (what was delivered), windows fetched and in flight,
tokens/s since the iteration started, padding efficiency of the delivered
batches, packing efficiency of the computed windows, and the realized mixture
against its targets in both units: the share of samples (source records whose
first token was delivered) against the sample weights, and the share of real
tokens against the token weights (known with ``weight_by="tokens"``). The
headline pair (``target``/``realized``) is in the source's ``weight_by`` unit.
With a mixture schedule the same comparison is given per phase, over the global
steps each phase covers (exact bounds when rows are samples, estimated
otherwise; from the kept per-step history), and the overall targets are the
phases' targets weighted by what each phase delivered (samples for sample
targets, tokens for token targets).

The mixture is exact per window, not per batch: packing orders a window's rows
(``best_fit`` emits long documents' full rows first and holds short ones in
open bins until the window flushes), so while windows are partly delivered the
delivered shares lean one way. ``stats()`` therefore also gives the share of
samples the mixture drew into the windows delivered whole in this iteration
(from the curriculum, no data read; cached per lane), and the documents drawn
into the partly delivered windows that were not delivered yet (``held``).

Everything here is kept once the pipeline is closed: the figures describe the
last iteration until another starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import plots
from .plans import phase_plan
from .render import html_block, html_pairs, html_table, html_title, text_pairs, text_table


@dataclass(frozen=True)
class PipelineStats:
    """A snapshot of one iteration (immutable)."""

    lanes: list[dict]
    global_step: int
    batches: int
    tokens: int
    elapsed_s: float
    padding_efficiency: float | None
    packing_efficiency: float | None
    windows_done: int
    windows_in_flight: int
    mixture: list[dict]
    history: list[dict] = field(repr=False)
    weight_by: str = "samples"
    phases: list[dict] = field(default_factory=list)
    whole_windows: int = 0
    partial_windows: int = 0
    packing: str = ""
    counters: dict = field(default_factory=dict, repr=False)  # the fetched windows' counters, summed
    ensure_mixture: list[dict] = field(default_factory=list)  # per dataset, when the pipeline has one

    @property
    def tokens_per_s(self) -> float:
        """Tokens delivered per second of the iteration so far (0 before the first)."""
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def plot_mixture(self, ax=None):
        """Realized mixture per global step against the target (matplotlib; ``ax``: the axes to
        draw on, default a new figure). Returns the axes."""
        return plots.plot_mixture(self, ax)

    def plot_packing(self, ax=None):
        """Padding efficiency per global step (matplotlib; ``ax`` as for :meth:`plot_mixture`).
        Returns the axes."""
        return plots.plot_packing(self, ax)

    def _summary(self) -> list[tuple[str, object]]:
        def pct(x):
            return "n/a" if x is None else f"{x:.1%}"

        return [
            ("global step", self.global_step),
            ("batches delivered", self.batches),
            ("tokens delivered", f"{self.tokens:,}"),
            ("tokens/s", f"{self.tokens_per_s:,.0f} over {self.elapsed_s:.1f} s"),
            ("padding efficiency", pct(self.padding_efficiency)),
            ("packing efficiency", pct(self.packing_efficiency)),
            ("windows fetched / in flight", f"{self.windows_done} / {self.windows_in_flight}"),
        ] + self._pack_options()

    def _pack_options(self) -> list[tuple[str, object]]:
        """Lines for ``pack``'s options when they acted: documents dropped, rows per group."""
        c = self.counters
        out: list[tuple[str, object]] = []
        for key, label in (("pack.short_documents", "documents under min_sequence_length (dropped)"),
                           ("pack.oversized_documents", "documents over max_length (dropped)")):
            if key in c:
                out.append((label, f"{c[key]:,}"))
        groups = {k.removeprefix("pack.group_rows."): v for k, v in c.items() if k.startswith("pack.group_rows.")}
        if groups:
            out.append(("packed rows per group", ", ".join(f"{k}: {v:,}" for k, v in sorted(groups.items()))))
        return out

    _MIXTURE_HEADER = ["dataset", "sample target", "sample share", "whole windows", "token target", "token share",
                       "samples", "tokens", "held"]

    def _mixture_rows(self):
        def share(x):
            return "n/a" if x is None else f"{x:.3f}"

        return [(m["dataset"], share(m["sample_target"]), share(m["sample_share"]), share(m["whole_window_share"]),
                 share(m["token_target"]), share(m["token_share"]), f"{m['samples']:,}", f"{m['tokens']:,}",
                 f"{m['held']:,}") for m in self.mixture]

    @property
    def why(self) -> str:
        """Why the delivered shares may differ from the targets now ("" when no window is partly
        delivered)."""
        held = sum(m["held"] for m in self.mixture)
        if not self.partial_windows:
            return ""
        whole = " / ".join(f"{m['dataset']} {m['whole_window_share']:.3f}" for m in self.mixture) \
            if self.whole_windows else "none yet"
        order = {"best_fit": "best_fit emits long documents' full rows first and holds short ones in open bins "
                             "until the window flushes",
                 "first_fit": "first_fit holds documents in open bins until they fill or the window flushes",
                 "wrap": "wrap cuts rows in document order",
                 "best_fit_wrap": "best_fit_wrap places the longest documents first"}.get(self.packing, "")
        return (f"{self.partial_windows} window(s) partly delivered: the mixture is exact per window, and within "
                f"one packing orders the rows{f' ({order})' if order else ''}, so the delivered shares lean one "
                f"way until the window completes. Over the {self.whole_windows} window(s) delivered whole the "
                f"mixture drew {whole} (sample targets: "
                + " / ".join(f"{m['dataset']} {m['sample_target']:.3f}" for m in self.mixture)
                + f"); {held:,} document(s) drawn into the partly delivered windows are not delivered yet "
                "(held by packing, or dropped by a filter or by wrap's last row)")

    @property
    def _mixture_caption(self) -> str:
        return (f"mixture, weighted by {self.weight_by} (targets: the weights; shares: what was delivered, "
                "samples counted where a record's first token lands; whole windows: the sample share the "
                "mixture drew into the windows delivered whole; held: documents drawn into partly delivered "
                "windows, not delivered yet)")

    def _phase_rows(self):
        def share(x):
            return "n/a" if x is None else f"{x:.3f}"

        rows = []
        for ph in self.phases:
            span = f"{ph['from_step']}-{'' if ph['to_step'] is None else ph['to_step'] - 1}"
            if not ph["exact"]:
                span += " (estimated)"
            token_target = ph["token_target"] or {}
            for name in ph["sample_target"]:
                rows.append((ph["phase"], span, name, share(ph["sample_target"][name]), share(ph["sample_share"][name]),
                             share(token_target.get(name)), share(ph["token_share"][name])))
        return rows

    _ENSURE_HEADER = ["dataset", "target", "delivered share", "in", "delivered", "dropped samples"]

    def _ensure_rows(self):
        def share(x):
            return "n/a" if x is None else f"{x:.3f}"

        return [(m["dataset"], share(m["target"]), share(m["delivered_share"]), f"{m['in']:,}", f"{m['out']:,}",
                 f"{m['dropped']:,}") for m in self.ensure_mixture]

    @property
    def _ensure_caption(self) -> str:
        unit = self.ensure_mixture[0]["unit"] if self.ensure_mixture else "samples"
        return (f"ensure_mixture, shares of {unit} over the windows fetched (in: before it, delivered: after "
                "it, both in that unit; dropped: the surplus a strict one removed)")

    def _lane_rows(self):
        return [(p["lane"], p["window"], p["offset"], p["batches_delivered"], "yes" if p["finished"] else "")
                for p in self.lanes]

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return "\n".join([
            "zephon_dask stats", text_pairs(self._summary()),
            self._mixture_caption,
            text_table(self._MIXTURE_HEADER, self._mixture_rows()),
            *([f"  {self.why}"] if self.why else []),
            *([f"mixture by schedule phase, weighted by {self.weight_by} (over the global steps each "
               "phase covers)", text_table(PHASE_HEADERS, self._phase_rows())] if self.phases else []),
            *([self._ensure_caption, text_table(self._ENSURE_HEADER, self._ensure_rows())]
              if self.ensure_mixture else []),
            "lanes", text_table(["lane", "window", "offset", "batches", "finished"], self._lane_rows()),
        ])

    def _repr_html_(self) -> str:
        return html_block(
            html_title("zephon_dask stats"),
            html_pairs(self._summary()),
            html_table(self._MIXTURE_HEADER, self._mixture_rows(), caption=self._mixture_caption),
            *([html_pairs([("why the shares differ", self.why)])] if self.why else []),
            *([html_table(PHASE_HEADERS, self._phase_rows(),
                          caption=f"mixture by schedule phase, weighted by {self.weight_by}")]
              if self.phases else []),
            *([html_table(self._ENSURE_HEADER, self._ensure_rows(), caption=self._ensure_caption)]
              if self.ensure_mixture else []),
            html_table(["lane", "window", "offset", "batches", "finished"], self._lane_rows(), caption="lanes"),
        )


PHASE_HEADERS = ["phase", "global steps", "dataset", "sample target", "sample share", "token target",
                 "token share"]


def _shares(counts: dict[str, int]) -> dict[str, float]:
    total = max(sum(counts.values()), 1)
    return {name: n / total for name, n in counts.items()}


def _phases(pipeline, history: list[dict]) -> list[dict]:
    """The realized mixture per schedule phase, over the history steps each phase covers: sample
    and token shares against the phase's sample and token targets (the latter with
    ``weight_by="tokens"``; the headline ``target``/``realized`` in the ``weight_by`` unit)."""
    source = pipeline.spec.source
    plans = phase_plan(pipeline)
    unit = "token" if source.weight_by == "tokens" else "sample"
    out = []
    for i, plan in enumerate(plans):
        if plan.begin_step is None:
            continue
        start = int(plan.begin_step)
        nxt = plans[i + 1].begin_step if i + 1 < len(plans) else None
        stop = None if nxt is None else int(nxt)
        tokens = {name: 0 for name in source.names}
        samples = {name: 0 for name in source.names}
        for h in history:
            if h["global_step"] >= start and (stop is None or h["global_step"] < stop):
                for name in source.names:
                    tokens[name] += h["dataset_tokens"][name]
                    samples[name] += h["dataset_samples"][name]
        assert source.phases is not None
        entry = {"phase": i, "from_step": start, "to_step": stop, "exact": plan.exact,
                 "sample_target": dict(zip(source.names, map(float, source.phase_weights[i]), strict=True)),
                 "sample_share": _shares(samples),
                 "token_target": dict(zip(source.names, map(float, source.phases[i].weights), strict=True))
                 if unit == "token" else None,
                 "token_share": _shares(tokens),
                 "samples": sum(samples.values()), "tokens": sum(tokens.values())}
        out.append({**entry, "target": entry[f"{unit}_target"], "realized": entry[f"{unit}_share"]})
    return out


def _blend(mixture: list[dict], phases: list[dict], weight_by: str) -> list[dict]:
    """With a schedule, each dataset's overall targets are the phases' targets weighted by what each
    phase delivered: sample targets by samples, token targets by tokens (the first phase's
    targets before any); the headline ``target`` in the ``weight_by`` unit."""
    out = []
    for m in mixture:
        row = dict(m)
        for unit, amount in (("sample", "samples"), ("token", "tokens")):
            total = sum(ph[amount] for ph in phases)
            if total and row[f"{unit}_target"] is not None:
                row[f"{unit}_target"] = sum(ph[f"{unit}_target"][m["dataset"]] * ph[amount] for ph in phases) / total
        out.append({**row, "target": row["token_target" if weight_by == "tokens" else "sample_target"]})
    return out


def stats(pipeline) -> PipelineStats:
    """Snapshot the pipeline's current (or last) iteration; zeros before the first."""
    progress = pipeline.session.current_progress()
    stream = pipeline.session.stream
    source = pipeline.spec.source
    pack = stream.stats if stream is not None else {}
    fetcher = stream.fetcher if stream is not None else None
    history = [{"global_step": h["global_step"], "tokens": h["tokens"], "slots": h["slots"],
                "dataset_tokens": dict(zip(source.names, h["dataset_tokens"].tolist(), strict=True)),
                "dataset_samples": dict(zip(source.names, h["dataset_samples"].tolist(), strict=True))}
               for h in progress.history]
    phases = _phases(pipeline, history)
    whole, drawn, partial = _windows(pipeline.spec, progress)
    delivered = np.asarray(progress.dataset_samples, dtype=np.int64)
    held = np.maximum(drawn - delivered, 0) if partial else np.zeros_like(delivered)  # only while windows are partial
    whole_total = int(whole[1].sum())
    mixture = _blend(mixture_rows(source, progress.dataset_samples, progress.dataset_tokens), phases,
                     source.weight_by)
    for c, row in enumerate(mixture):
        row["whole_window_share"] = int(whole[1][c]) / whole_total if whole_total else None
        row["held"] = int(held[c])
    packs = [a for a in pipeline.description.accumulators if a.name == "pack"]
    return PipelineStats(
        lanes=[{"lane": lane, **progress.lane[lane].to_dict()} for lane in progress.lanes],
        global_step=progress.global_step,
        batches=progress.batches,
        tokens=progress.tokens,
        elapsed_s=progress.elapsed_s,
        padding_efficiency=progress.tokens / progress.slots if progress.slots else None,
        packing_efficiency=pack["pack.tokens"] / pack["pack.slots"] if pack.get("pack.slots") else None,
        windows_done=fetcher.windows_done if fetcher else 0,
        windows_in_flight=len(fetcher.inflight) if fetcher else 0,
        mixture=mixture,
        history=history,
        weight_by=source.weight_by,
        phases=phases,
        whole_windows=int(whole[0]),
        partial_windows=partial or 0,
        packing=packs[-1].spec()["algorithm"] if packs else "",
        counters=dict(pack),
        ensure_mixture=_ensure_rows(pipeline.description.accumulators, pack),
    )


def _ensure_rows(accumulators, counters: dict[str, int]) -> list[dict]:
    """``ensure_mixture``'s target, delivered share, units in and out and samples dropped per dataset,
    over the windows the stream fetched (their counters); empty without one."""
    ops = [op for op in accumulators if op.name == "ensure_mixture"]
    if not ops:
        return []
    op = ops[0]
    target, got = op.targets(counters) or {}, op.delivered(counters) or {}
    return [{"dataset": n, "unit": op.weight_by, "target": target.get(n), "delivered_share": got.get(n),
             "in": counters.get(f"ensure_mixture.{n}.in", 0), "out": counters.get(f"ensure_mixture.{n}.out", 0),
             "dropped": counters.get(f"ensure_mixture.{n}.dropped", 0)} for n in op.names]


_DRAWN: dict[tuple[str, int], np.ndarray] = {}  # (fingerprint, lane) -> row w: samples per dataset in windows < w


def _drawn_before(spec, lane: int, w: int) -> np.ndarray:
    """Samples per dataset the mixture drew into the lane's windows ``0..w-1`` (from the
    curriculum's allocations; cumulative rows cached, grown by doubling)."""
    key = (spec.fingerprint, lane)
    source = spec.source
    cum = _DRAWN.get(key)
    if cum is None:
        cum = np.full((1, len(source.names)), -1, dtype=np.int64)
        cum[0] = 0
    if len(cum) <= w or cum[w, 0] < 0:
        grown = np.full((max(w + 1, 2 * len(cum)), cum.shape[1]), -1, dtype=np.int64)
        grown[:len(cum)] = cum
        cum = _DRAWN[key] = grown
        at = int(np.flatnonzero(cum[:, 0] >= 0).max())
        while at < w:
            drawn = np.zeros(cum.shape[1], dtype=np.int64)
            for g in spec.window_chunks(lane, at):
                lo, hi = source.allocation(g), source.allocation(g + 1)
                drawn += [hi[name] - lo[name] for name in source.names]
            cum[at + 1] = cum[at] + drawn
            at += 1
    _DRAWN[key] = cum
    return cum[w]


def _windows(spec, progress) -> tuple[tuple[int, np.ndarray], np.ndarray, int | None]:
    """This iteration's ``(windows delivered whole, samples per dataset the mixture drew into
    them)``, the samples drawn into every window it entered (whole or partly delivered), and how
    many are partly delivered (``None`` when a lane started inside a window: what was drawn
    before its start is not known here)."""
    n = len(spec.source.names)
    whole, entered, count, partial = np.zeros(n, np.int64), np.zeros(n, np.int64), 0, 0
    exact = True
    for lane in progress.lanes:
        (w0, off0), p = progress.start_at[lane], progress.lane[lane]
        exact &= off0 == 0
        end = spec.num_windows(lane) if p.finished else p.window  # a finished lane has no partial window
        first = w0 if off0 == 0 else w0 + 1
        if end is None or end <= first:
            end = first
        else:
            whole += _drawn_before(spec, lane, end) - _drawn_before(spec, lane, first)
            count += end - first
        if not p.finished and p.offset > 0:
            partial += 1
            entered += _drawn_before(spec, lane, p.window + 1) - _drawn_before(spec, lane, max(first, p.window))
    return (count, whole), whole + entered, partial if exact else None


def mixture_rows(source, samples, tokens) -> list[dict]:
    """Per dataset: targets and realized shares in samples and tokens, and the headline pair
    ``target``/``realized`` in the source's ``weight_by`` unit (a token target is ``None`` when
    the source weighs by samples)."""
    sample_total, token_total = max(int(samples.sum()), 1), max(int(tokens.sum()), 1)
    by_tokens = source.weight_by == "tokens"
    rows = []
    for c, name in enumerate(source.names):
        row = {"dataset": name, "samples": int(samples[c]), "tokens": int(tokens[c]),
               "sample_target": float(source.weights[c]), "sample_share": int(samples[c]) / sample_total,
               "token_target": float(source.target_weights[c]) if by_tokens else None,
               "token_share": int(tokens[c]) / token_total}
        unit = "token" if by_tokens else "sample"
        row.update(target=row[f"{unit}_target"], realized=row[f"{unit}_share"])
        rows.append(row)
    return rows
