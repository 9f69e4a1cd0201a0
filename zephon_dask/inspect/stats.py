"""``stats(pipeline)``: how the current iteration is going. Reads state; changes nothing.

Per-lane progress (what was delivered), windows fetched and in flight,
tokens/s since the iteration started, padding efficiency of the delivered
batches, packing efficiency of the computed windows, and the realized mixture
(share of real tokens per dataset) against the target weights (share of
samples per chunk; with a mixture schedule, the phases' targets weighted by
the tokens each delivered). The realized mixture is also given per phase, over the global steps each phase covers (exact bounds when
rows are samples, estimated otherwise; from the kept per-step history).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .. import views
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
    phases: list[dict] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        """Tokens delivered per second of the iteration so far (0 before the first)."""
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

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
        ]

    def _mixture_rows(self):
        return [(m["dataset"], f"{m['target']:.3f}", f"{m['realized']:.3f}", f"{m['tokens']:,}")
                for m in self.mixture]

    def _phase_rows(self):
        rows = []
        for ph in self.phases:
            span = f"{ph['from_step']}-{'' if ph['to_step'] is None else ph['to_step'] - 1}"
            if not ph["exact"]:
                span += " (estimated)"
            for name, target in ph["target"].items():
                rows.append((ph["phase"], span, name, f"{target:.3f}", f"{ph['realized'].get(name, 0.0):.3f}"))
        return rows

    def _lane_rows(self):
        return [(p["lane"], p["window"], p["offset"], p["batches_delivered"], "yes" if p["finished"] else "")
                for p in self.lanes]

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return "\n".join([
            "zephon_dask stats", text_pairs(self._summary()),
            "mixture (target: samples per chunk; realized: real tokens delivered)",
            text_table(["dataset", "target", "realized", "tokens"], self._mixture_rows()),
            *(["mixture by schedule phase (over the global steps each phase covers)",
               text_table(PHASE_HEADERS, self._phase_rows())] if self.phases else []),
            "lanes", text_table(["lane", "window", "offset", "batches", "finished"], self._lane_rows()),
        ])

    def _repr_html_(self) -> str:
        return html_block(
            html_title("zephon_dask stats"),
            html_pairs(self._summary()),
            html_table(["dataset", "target", "realized", "tokens"], self._mixture_rows(),
                       caption="mixture (target: samples per chunk; realized: real tokens delivered)"),
            *([html_table(PHASE_HEADERS, self._phase_rows(), caption="mixture by schedule phase")]
              if self.phases else []),
            html_table(["lane", "window", "offset", "batches", "finished"], self._lane_rows(), caption="lanes"),
        )


PHASE_HEADERS = ["phase", "global steps", "dataset", "target", "realized"]


def _phases(pipeline, history: list[dict]) -> list[dict]:
    """The realized mixture per schedule phase, over the history steps each phase covers."""
    source = pipeline.work_source
    plans = pipeline.phase_plan()
    out = []
    for i, plan in enumerate(plans):
        if plan.begin_step is None:
            continue
        start = int(plan.begin_step)
        nxt = plans[i + 1].begin_step if i + 1 < len(plans) else None
        stop = None if nxt is None else int(nxt)
        tokens = {name: 0 for name in source.names}
        for h in history:
            if h["global_step"] >= start and (stop is None or h["global_step"] < stop):
                for name, n in h["dataset_tokens"].items():
                    tokens[name] += n
        total = max(sum(tokens.values()), 1)
        assert source.phases is not None
        out.append({"phase": i, "from_step": start, "to_step": stop, "exact": plan.exact,
                    "target": {n: float(w) for n, w in zip(source.names, source.phases[i].weights, strict=True)},
                    "realized": {n: tokens[n] / total for n in source.names}, "tokens": sum(tokens.values())})
    return out


def _blend(mixture: list[dict], phases: list[dict]) -> list[dict]:
    """With a schedule, each dataset's overall target is the phases' targets weighted by the
    tokens each phase delivered (the first phase's weights before any)."""
    total = sum(ph["tokens"] for ph in phases)
    if not total:
        return mixture
    return [{**m, "target": sum(ph["target"][m["dataset"]] * ph["tokens"] for ph in phases) / total}
            for m in mixture]


@views.register("stats")
def stats(pipeline) -> PipelineStats:
    """Snapshot the pipeline's current (or last) iteration; zeros before the first."""
    progress = pipeline.session.current_progress()
    stream = pipeline.session.stream
    source = pipeline.work_source
    pack = stream.stats if stream is not None else {}
    fetcher = stream.fetcher if stream is not None else None
    total = max(int(progress.dataset_tokens.sum()), 1)
    mixture = [{"dataset": name, "target": float(weight), "realized": int(n) / total, "tokens": int(n)}
               for name, weight, n in zip(source.names, source.weights, progress.dataset_tokens, strict=True)]
    history = [{"global_step": h["global_step"], "tokens": h["tokens"], "slots": h["slots"],
                "dataset_tokens": dict(zip(source.names, h["dataset_tokens"].tolist(), strict=True))}
               for h in progress.history]
    phases = _phases(pipeline, history)
    return PipelineStats(
        lanes=[{"lane": lane, **progress.lane[lane].as_dict()} for lane in progress.lanes],
        global_step=progress.global_step,
        batches=progress.batches,
        tokens=progress.tokens,
        elapsed_s=time.perf_counter() - progress.started,
        padding_efficiency=progress.tokens / progress.slots if progress.slots else None,
        packing_efficiency=pack["pack.tokens"] / pack["pack.slots"] if pack.get("pack.slots") else None,
        windows_done=fetcher.windows_done if fetcher else 0,
        windows_in_flight=len(fetcher.inflight) if fetcher else 0,
        mixture=_blend(mixture, phases),
        history=history,
        phases=phases,
    )
