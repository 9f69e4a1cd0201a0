"""``explain(pipeline)``: a readable plan of what a pipeline will do. Pure.

It reads the pipeline's configuration and the curriculum's direct answers
(stream length, chunks per lane); it never starts a runner nor waits for one
(while the embedded cluster starts it says so; the dashboard link shows once it
has started), and opens no data file nor computes a
window, with two exceptions: a mixture weighted by tokens whose tokens per
sample are not measured yet is measured first (once per pipeline; see
:mod:`zephon_dask.pipeline.measure`), and for a mixture schedule in global steps
in a pipeline whose rows are not samples (``pack``, ``filter``, ...) each phase's
rows per sample are measured once on lane 0's first window (see
:mod:`zephon_dask.core.phases`).
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from dataclasses import dataclass

from ..consumer.checks import idle_lanes
from ..curriculum import routing
from ..curriculum.chunking import chosen_note
from ..errors import ClusterError, ConfigError, ElasticityWarning, NotFoundError, ZephonError
from ..execution import RUNNERS, choose_runner
from ..execution.base import AUTO_AFTER, CONTROL_SHARE, MAX_WINDOWS_PER_TASK
from ..graph.keys import FP_CHARS
from ..operators.base import one_to_one
from ..state import steps
from .counting import step_count
from .plans import PHASE_HEADERS, phase_rows
from .render import (
    html_block,
    html_pairs,
    html_table,
    html_title,
    html_warnings,
    span,
    text_pairs,
    text_table,
)


@dataclass(frozen=True, repr=False)
class Section:
    """One titled part: key/value ``pairs`` and/or a table (``headers`` + ``rows``), then
    key/value ``notes`` about the table's rows."""

    title: str
    pairs: tuple[tuple[str, str], ...] = ()
    headers: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    notes: tuple[tuple[str, str], ...] = ()

    def text(self) -> str:
        """The section as plain text: a title line, then its pairs and table."""
        parts = [f"{self.title}:"]
        if self.pairs:
            parts.append(text_pairs(self.pairs))
        if self.headers:
            parts.append(text_table(self.headers, self.rows) if self.rows else "  (none)")
        if self.notes:
            parts.append(text_pairs(self.notes))
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return html_block(self.html())

    def html(self) -> str:
        """The section as an HTML fragment: a title, then its pairs and table."""
        parts = [html_title(self.title)]
        if self.pairs:
            parts.append(html_pairs(self.pairs))
        if self.headers:
            parts.append(html_table(self.headers, self.rows))
        if self.notes:
            parts.append(html_pairs(self.notes))
        return "".join(parts)


@dataclass(frozen=True)
class Explanation:
    """The plan of a pipeline: ``str()`` for a terminal, ``_repr_html_`` for a notebook (a value)."""

    fingerprint: str
    sections: tuple[Section, ...]
    warnings: tuple[str, ...]

    def section(self, title: str) -> Section:
        """The section called ``title``, or the one whose title starts with it (``"exec"``,
        ``"lanes"``); case does not matter. Printed, a section is its text.

        Raises:
            NotFoundError: no section, or several, start with ``title`` (the message lists them).
        """
        want = title.lower() if isinstance(title, str) else title
        matches = [s for s in self.sections if s.title.lower() == want]
        matches = matches or [s for s in self.sections if isinstance(want, str) and want
                              and s.title.lower().startswith(want)]
        if len(matches) == 1:
            return matches[0]
        titles = ", ".join(repr(s.title.split(" (")[0]) for s in (matches or self.sections))
        which = "several sections start with" if matches else "no section starts with"
        raise NotFoundError(f"explain(): {which} {title!r}; its sections are {titles}")

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        parts = [f"zephon_dask pipeline {self.fingerprint}", *(s.text() for s in self.sections)]
        parts.append("warnings:\n" + "\n".join(f"  - {w}" for w in self.warnings) if self.warnings
                     else "warnings: none")
        return "\n\n".join(parts)

    def _repr_html_(self) -> str:
        return html_block(
            html_title(f"zephon_dask pipeline {self.fingerprint}"),
            html_warnings(self.warnings),
            *(s.html() for s in self.sections),
        )


def _fraction(w) -> str:
    return f"{w.numerator}/{w.denominator} ({float(w):.1%})"


def _datasets(source) -> Section:
    """The datasets with their sizes and weights, then the files each one chose. Weighted by tokens:
    the token weight, the measured tokens per sample and the sample weight they give."""
    rows, notes = [], []
    by_tokens = source.weight_by == "tokens"
    for c, (ds, size) in enumerate(zip(source.datasets, source.sizes, strict=True)):
        shards = getattr(ds, "num_shards", len(ds.shard_sizes))
        row = [ds.name, getattr(ds, "format", "?"), str(shards), f"{size:,}", getattr(ds, "text_field", "?")]
        if by_tokens:
            row += [_fraction(source.target_weights[c]), f"{float(source.tokens_per_sample[c]):,.1f}"]
        rows.append((*row, _fraction(source.weights[c])))
        chosen = ds.chosen_files() if hasattr(ds, "chosen_files") else ""
        if chosen:
            notes.append((f"{ds.name} files", chosen))
        reader = getattr(ds, "reader", None)  # what defines a format's data: a Lance version, fields
        notes += [(f"{ds.name} {label}", value) for label, value in (reader.html(ds) if reader else ())]
    identity = _changed_files(source.datasets)
    if identity:
        notes.append(("changed files", identity))
    headers: tuple[str, ...] = ("name", "format", "shards", "samples", "text field")
    headers += ("token weight", "tokens/sample", "sample weight") if by_tokens else ("weight",)
    return Section("datasets", headers=headers, rows=tuple(rows), notes=tuple(notes))


def _changed_files(datasets) -> str:
    """How a read tells a changed file from a touched one, over every dataset's files (empty:
    none read from files)."""
    files = [s for ds in datasets for s in getattr(ds, "shards", ())
             if getattr(s, "path", None) and s.size_bytes is not None]
    if not files:
        return ""
    digests = sum(s.digest is not None for s in files)
    tags = sum(s.digest is None and s.etag is not None for s in files)
    rest = len(files) - digests - tags
    how = [f"{_files(digests)} by content (a new mtime alone reads on)"] if digests else []
    how += [f"{_files(tags)} by ETag (a new mtime alone reads on)"] if tags else []
    how += [f"{_files(rest)} by size and mtime (a new mtime is refused)"] if rest else []
    return "checked on every read: " + "; ".join(how)


def _files(n: int) -> str:
    return f"{n:,} file" + ("" if n == 1 else "s")


def _stream_end(source) -> str:
    if isinstance(source.exhausted_policy, dict) or isinstance(source.max_repeats, dict):
        ends = "never" if source.num_chunks is None else "before any dataset would pass its limit"
        return f"{ends} (per dataset, below)"
    if source.exhausted_policy is None:
        return f"after {source.stop_after_passes} pass(es) of every dataset"
    if source.exhausted_policy == "stop":
        return "before any dataset would repeat (exhausted_policy='stop')"
    if source.max_repeats is None:
        return "never (exhausted_policy='repeat')"
    return f"after {source.max_repeats} repeat(s) (exhausted_policy='repeat')"


def _token_origin(built) -> tuple[tuple[str, str], ...]:
    """Where each dataset's tokens per sample come from (weighted by tokens)."""
    if built.weight_by != "tokens":
        return ()
    parts = [f"given: {', '.join(n for n in built.names if n in built.token_pins)}"] if built.token_pins else []
    if built.unpinned:
        how = ("measure=" + getattr(built.measure, "__qualname__", repr(built.measure)) if built.measure
               else "measured on a fixed sample")
        parts.append(f"{how}: {', '.join(built.unpinned)}")
    return (("tokens per sample", "; ".join(parts) + " (a resume takes the checkpoint's)"),)


def _chunk_size(pipeline, source, replicas: int) -> str:
    """The chunk size, and whether the pipeline chose it from the data (the source left it open)."""
    if not pipeline.session.built_source.chooses_chunk_size:
        return str(source.chunk_size)
    if pipeline.session.resume is not None:
        return f"{source.chunk_size} (the checkpoint's: chunk_size is left open)"
    return f"{source.chunk_size} ({chosen_note(source, replicas)})"


def _mixture(source, built=None, chunk_size: str | None = None) -> Section:
    chunks = source.num_chunks
    length = "endless" if chunks is None else f"{chunks:,} chunks ({chunks * source.chunk_size:,} samples)"
    shuffles = [name for name, on in (("shards", source.shuffle_shards),
                                      ("within shards", source.shuffle_within_shard)) if on]
    if source.shuffle_block_size:
        shuffles.append(f"blocks of {source.shuffle_block_size}")
    by_tokens = source.weight_by == "tokens"
    weight_by = ("tokens: weights are shares of tokens; sample weight = token weight / tokens per sample "
                 "(measured once, kept in checkpoints)" if by_tokens
                 else "samples: weights are shares of each chunk's samples")
    return Section("mixture", pairs=(
        ("weight_by", weight_by),
        *_token_origin(built if built is not None else source),
        ("chunk_size", chunk_size or str(source.chunk_size)),
        ("seed", str(source.seed)),
        ("stream length", length),
        ("stream ends", _stream_end(source)),
        ("sample order", "shuffled: " + ", ".join(shuffles) if shuffles else "file order"),
        ("reshuffle_on_repeat", str(source.reshuffle_on_repeat)),
        *_per_dataset(source),
        ("read order", _read_order(source)),
        ("lane_assignment", source.lane_assignment),
    ))


def _per_dataset(source) -> list[tuple[str, str]]:
    """One line per dataset when the datasets are read to different limits."""
    if not any(isinstance(v, dict) for v in (source.exhausted_policy, source.max_repeats,
                                             source.reshuffle_on_repeat)):
        return []
    return [(f"  {name}", text) for name, text in source.repetition.describe()]


def _read_order(source) -> str:
    order = {"weighted_round_robin": "datasets interleaved evenly (weighted_round_robin)",
             "weighted_random": "datasets in a seeded random order (weighted_random)"}[source.read_order]
    within = {"as_is": "each dataset's records in its own order",
              "shuffle": "each dataset's records shuffled inside the chunk"}[source.within_dataset]
    return f"{order}; {within}"


def _lanes(spec) -> tuple[Section, list[str]]:
    source, replicas, k = spec.source, spec.canonical_replicas, spec.flush_every_k_chunks
    pairs = [("canonical_replicas", str(replicas)), ("flush_every_k_chunks", str(k))]
    notes = []
    if source.num_chunks is None:
        pairs.append(("chunks per lane", "endless"))
        pairs.append(("windows per lane", "endless"))
    else:
        per_lane = [len(source.lane_chunks(lane, replicas)) for lane in range(replicas)]
        windows = [-(-n // k) for n in per_lane]
        pairs += [("chunks per lane", span(per_lane)), ("windows per lane", span(windows)),
                  ("windows in all", f"{sum(windows):,}")]
        empty = sum(1 for n in per_lane if n == 0)
        if empty:
            notes.append(idle_lanes(source, replicas) or
                         f"{empty} of {replicas} lanes get no chunk: the stream has {source.num_chunks} chunks. "
                         "Lower chunk_size or canonical_replicas so every lane has data")
    return Section("lanes and windows", pairs=tuple(pairs)), notes


def _group(pipeline, replicas: int, options: dict) -> tuple[Section, list[str]]:
    notes: list[str] = []
    mapping = options["mapping_strategy"]
    try:
        degree, group = pipeline.session.identity()
    except ConfigError as exc:
        return Section("this DP group", pairs=(("identity", "invalid"),)), [str(exc)]
    pairs = [("dp_degree", str(degree)), ("dp_group_id", str(group)), ("mapping_strategy", mapping)]
    if degree > replicas:
        notes.append(
            f"dp_degree={degree} exceeds canonical_replicas={replicas}: some DP groups would own no "
            f"lane; use dp_degree <= {replicas} or a larger canonical_replicas for a new run"
        )
        return Section("this DP group", pairs=tuple(pairs)), notes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ElasticityWarning)
        groups = routing.group_lanes(replicas, degree, mapping)
    pairs.append(("lanes owned", str(groups[group])))
    if replicas % degree:
        notes.append(
            f"canonical_replicas={replicas} is not divisible by dp_degree={degree}: groups own "
            f"{span([len(g) for g in groups])} lanes, so some do more work per step. Prefer a "
            f"degree that divides {replicas}"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ElasticityWarning)  # noted above
            shape = pipeline.session.step_shape()
    except ZephonError as exc:
        notes.append(str(exc))
        pairs.append(("global step", "invalid (see warnings)"))
    else:
        pairs.append(("global step", steps.describe(shape, replicas)))
        pairs.append(("steps in a pass", steps_in_a_pass(pipeline)))
        if pipeline.spec.source.num_chunks is not None:
            pairs.append(("end of a pass", pass_end(pipeline)))
    return Section("this DP group", pairs=tuple(pairs)), notes


def pass_end(pipeline) -> str:
    """Where a finite stream's pass ends: on its last whole global step, or with every sample."""
    spec = pipeline.spec
    if not spec.drop_last_step:
        return "every sample (drop_last_step=False): the last step may hold fewer batches"
    where = ("counted up front, the same at every DP degree" if one_to_one(spec.record_ops, spec.accumulators)
             else "found by looking ahead; under torch.distributed the DP groups vote at each step's start, "
             "so it is the same at every DP degree")
    return f"on the last whole global step, {where}; the batches after it are dropped (drop_last_step)"


def lanes_of(pipeline) -> list[int]:
    """The lanes ``pipeline``'s DP group owns: its identity's share of the curriculum's mapping.

    Raises:
        ConfigError: the DP identity is invalid.
    """
    degree, group = pipeline.session.identity()
    settings = pipeline.description.settings
    return routing.group_lanes(settings["canonical_replicas"], degree, settings["mapping_strategy"])[group]


def steps_in_a_pass(pipeline) -> str:
    """The step count of one pass when it is known without computing a window (rows are
    samples, or ``num_steps()`` counted them), else how to count it; ``endless``."""
    if pipeline.spec.source.num_chunks is None:
        return "endless"
    count = step_count(pipeline, compute=False)
    if count is None:
        return "finite; pipeline.num_steps() counts them (computes every window once, here)"
    return count.describe() + (", counted" if count.counted else ", exact from the curriculum")


def _settings(op) -> str:
    spec = op.spec()
    return ", ".join(f"{k}={json.dumps(spec[k], sort_keys=True)}" for k in sorted(spec) if k != "op")


def _operators(spec) -> Section:
    rows = [(str(i), op.name, "stateless (per chunk)", _settings(op)) for i, op in enumerate(spec.record_ops)]
    n = len(rows)
    rows += [(str(n + i), op.name, "accumulator (per window)", _settings(op))
             for i, op in enumerate(spec.accumulators)]
    n = len(rows)
    rows += [(str(n + i), op.name, "per batch (once cut)", _settings(op)) for i, op in enumerate(spec.batch_ops)]
    return Section("operators", headers=("#", "operator", "kind", "settings"), rows=tuple(rows))


def _per_token(spec, batch) -> tuple[tuple[str, str], ...]:
    """The batch's per-token extras (kept fields, dataset ids), one line when there are any."""
    kept = [f"{k} (tokenize keep)" for op in spec.record_ops for k in getattr(op, "keep", None) or ()]
    if batch.dataset_ids:
        kept.append("dataset_ids (" + ", ".join(f"{i}={n}" for i, n in enumerate(spec.source.names)) + ")")
    return (("per-token fields", "; ".join(kept)),) if kept else ()


def _ensure_mixture(spec) -> tuple[Section, ...]:
    """``ensure_mixture``'s target and what it does with the surplus (nothing without one)."""
    ops = [op for op in spec.accumulators if op.name == "ensure_mixture"]
    if not ops:
        return ()
    op = ops[0]
    target = ("the source's mixture: the samples the curriculum drew into each window" if op.given is None
              else ", ".join(f"{n} {float(w):.3f}" for n, w in zip(op.names, op.given, strict=True)))
    return (Section("ensure_mixture", pairs=(
        ("target", f"{target} (shares of {op.weight_by})"),
        ("surplus", "dropped (strict): each dataset delivers its share of what the window can fill, to within one sample"
         if op.strict else "kept: samples reordered toward the target, none dropped"),
        ("lookahead", f"{op.buffer_size:,} samples held while reordering"),
        ("warn_tolerance", "never warns" if op.warn_tolerance is None
         else f"warns once per iteration when a window's share drifts more than {op.warn_tolerance}"),
    )),)


def _fetcher(pipeline):
    """The window fetcher of the pipeline's live iteration, or ``None``."""
    stream = pipeline.session.stream
    return stream.fetcher if stream is not None else None


def _prefetch(given: int | None, runner, pipeline) -> str:
    if given is not None:
        return str(given)
    per = "2 per worker thread + 4" + (", threads in proportion to this group's lanes on a shared cluster"
                                       if runner is None or runner.shared else "")
    per += ", times the automatic windows_per_task"
    if runner is None:
        return f"auto: {per}"
    fetcher = _fetcher(pipeline)
    if fetcher is not None and fetcher.scale_prefetch:
        return f"auto: {fetcher.prefetch} ({fetcher.base_prefetch} x {fetcher.windows_per_task}; {per})"
    try:
        return f"auto: {runner.default_prefetch(len(lanes_of(pipeline)))} ({per})"
    except ClusterError:
        return f"auto: {per} (the cluster does not answer)"


def _windows_per_task(given: int | None, options: dict, runner, pipeline) -> str:
    if not options["fuse"]:
        return "1 (fuse=False: every window split into chunk tasks)"
    if given is not None:
        return str(given)
    kind = type(runner) if runner is not None else RUNNERS[choose_runner(options)]
    if not kind.task_cpu:
        return f"auto: 1 (the {kind.name} runner's tasks cost nothing besides their work)"
    rule = (f"1 for the first prefetch_windows windows (at least {AUTO_AFTER}), then as many as bring the "
            f"runner's ~{kind.task_cpu * 1e3:g} ms of CPU per task under {CONTROL_SHARE:.0%} of their median "
            f"CPU, at most {MAX_WINDOWS_PER_TASK}")
    fetcher = _fetcher(pipeline)
    if fetcher is None or fetcher.given is not None:
        return f"auto: {rule}"
    cpu = fetcher.window_cpu
    if cpu is None:
        return f"auto: 1 so far ({len(fetcher.sample)} windows timed; {rule})"
    return (f"auto: {fetcher.windows_per_task} (the first {len(fetcher.sample)} windows took {cpu * 1e3:.3g} ms "
            f"of CPU each, median; {rule})")


def _dashboard(link: str | None) -> str:
    """The dashboard link, or what to install when Dask cannot serve it (it needs bokeh)."""
    if link is None:
        return "none (this runner has no Dask dashboard)"
    if importlib.util.find_spec("bokeh") is None:
        return (f"{link} needs bokeh>=3.1 to serve pages: pip install 'bokeh>=3.1' "
                "(or zephon_dask[notebook])")
    return link


def _execution(pipeline, options: dict, fingerprint: str) -> Section:
    runner = pipeline.session.started_runner  # only a runner already started; never start one
    if runner is None:
        name = choose_runner(options)
        state = f"{name} (not started; it starts on the first iteration)"
        dashboard = ("shown here once the runner has started" if name in RUNNERS and RUNNERS[name].has_dashboard
                     else f"none (the {name} runner has no Dask dashboard)")
    elif runner.starting:  # never waits for the start
        state = runner.describe()
        dashboard = "shown here once the embedded cluster has started"
    else:
        state = runner.describe()
        dashboard = _dashboard(runner.dashboard_link)
    fuse = "one fused task per window" if options["fuse"] else "a task per chunk + one per window"
    return Section("execution (never changes the data)", pairs=(
        ("runner", state),
        ("dashboard", dashboard),
        ("n_workers", str(options["n_workers"] or "one per core")),
        ("prefetch_windows", _prefetch(options["prefetch_windows"], runner, pipeline)),
        ("prefetch_bytes", f"{options['prefetch_bytes']:,}" if options["prefetch_bytes"] else "no bound"),
        ("tasks", fuse),
        ("windows_per_task", _windows_per_task(options["windows_per_task"], options, runner, pipeline)),
        ("retries", str(options["retries"])),
        ("deterministic", str(options["deterministic"])),
        ("task keys", f"zephon-*-{fingerprint[:FP_CHARS]}-<lane>-<window>"),
    ))


def explain(pipeline) -> Explanation:
    """The plan of ``pipeline`` (see the module docstring for what it touches)."""
    spec = pipeline.spec
    options = pipeline.description.settings
    fingerprint = spec.fingerprint
    lanes, lane_notes = _lanes(spec)
    group, group_notes = _group(pipeline, spec.canonical_replicas, options)
    batch = Section("batches", pairs=tuple((k, str(v)) for k, v in pipeline.description.batch.config().items())
                    + _per_token(spec, pipeline.description.batch))
    schedule = phase_rows(pipeline)
    phases = (Section("mixture schedule", headers=PHASE_HEADERS, rows=schedule),) if schedule else ()
    chunk_size = _chunk_size(pipeline, spec.source, spec.canonical_replicas)
    mixture = _mixture(spec.source, pipeline.session.built_source, chunk_size)
    sections = (_datasets(spec.source), mixture, *phases, lanes, group, _operators(spec), *_ensure_mixture(spec),
                batch,
                _execution(pipeline, options, fingerprint))
    return Explanation(fingerprint, sections, tuple(lane_notes + group_notes))
