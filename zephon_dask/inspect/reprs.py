"""Text and HTML views of datasets, work sources, pipelines, batches and checkpoint states. Pure.

Each function returns a string; the classes' ``__repr__`` and ``_repr_html_``
methods delegate here, so a terminal shows one screen of text and Jupyter
shows tables instead of long reprs. A pipeline's text and HTML come from one
description (:func:`pipeline_summary`).
"""

from __future__ import annotations

from .. import views
from ..core.spec import has_tokens
from ..errors import ConfigError, ZephonError
from ..execution import choose_runner
from ..state.schema import LANE_FIELDS, STATE_KEYS, State
from .explain import Section, lanes_of, steps_in_a_pass
from .render import html_block, html_pairs, html_table, html_title, span

SHARDS_SHOWN = 20
SOURCES_SHOWN = 3


@views.register("dataset_html")
def dataset_html(dataset) -> str:
    """A dataset: its summary and its first shards."""
    pairs = [("format", dataset.format), ("text field", dataset.text_field),
             ("shards", f"{dataset.num_shards:,}"), ("samples", f"{dataset.num_samples:,}")]
    pairs += dataset.reader.html(dataset)
    if dataset.source is not None:
        pairs.append(("source", dataset.source))
    if dataset.data_files is not None:
        pairs.append(("data_files", ", ".join(dataset.data_files)))
    chosen = dataset.chosen_files()
    if chosen:
        pairs.append(("files", chosen))
    rows = [(str(i), s.shard_id, f"{s.num_samples:,}", "" if s.size_bytes is None else f"{s.size_bytes:,}")
            for i, s in enumerate(dataset.shards[:SHARDS_SHOWN])]
    more = dataset.num_shards - SHARDS_SHOWN
    caption = f"shards (first {SHARDS_SHOWN} of {dataset.num_shards:,})" if more > 0 else "shards"
    return html_block(html_title(f"Dataset {dataset.name!r}"), html_pairs(pairs),
                      html_table(("#", "shard id", "samples", "bytes"), rows, caption=caption))


@views.register("source_html")
def source_html(source) -> str:
    """A work source: mixture, stream length and the datasets with their exact weights (and, weighted
    by tokens, the token weights and tokens per sample; sample weights once those are known), and
    a schedule's phases."""
    _, chunks = source.length_status()
    chunk_size = "auto: 1024, or chosen by a Pipeline" if source.chooses_chunk_size else str(source.chunk_size)
    pairs = [("chunk_size", chunk_size), ("seed", str(source.seed)), ("chunks", chunks),
             ("weight_by", source.weight_by),
             ("stop_after_passes", str(source.stop_after_passes)),
             ("exhausted_policy", str(source.exhausted_policy)),
             ("max_repeats", str(source.max_repeats)),
             ("read_order", f"{source.read_order}, {source.within_dataset}"),
             ("shuffle_shards", str(source.shuffle_shards)),
             ("shuffle_within_shard", str(source.shuffle_within_shard)),
             ("shuffle_block_size", str(source.shuffle_block_size)),
             ("lane_assignment", source.lane_assignment)]
    rows: list[tuple[str, ...]]
    if source.weight_by == "tokens":
        tps = source.tokens_per_sample or (None,) * len(source.names)
        rows = [(name, f"{size:,}", f"{w.numerator}/{w.denominator}", f"{float(w):.2%}",
                 "?" if s is None else f"{float(s):,.1f}",
                 "?" if s is None else f"{float(source.weights[c] * source.chunk_size):.2f}")
                for c, (name, size, w, s) in enumerate(zip(source.names, source.sizes, source.target_weights, tps,
                                                           strict=True))]
        headers: tuple[str, ...] = ("dataset", "samples", "token weight", "token share", "tokens/sample",
                                    "samples per chunk")
    else:
        rows = [(name, f"{size:,}", f"{w.numerator}/{w.denominator}", f"{float(w):.2%}",
                 f"{float(w * source.chunk_size):.2f}")
                for name, size, w in zip(source.names, source.sizes, source.weights, strict=True)]
        headers = ("dataset", "samples", "weight", "share", "samples per chunk")
    parts = [html_title("MixtureWorkSource"), html_pairs(pairs),
             html_table(headers, rows, caption=None if source.phases is None else "the first schedule phase")]
    if source.phases is not None:
        starts = source.phase_chunks or (None,) * len(source.phases)
        phase_rows = [(str(p), f"{source.schedule_unit} {ph.start:,}", "-" if g is None else f"{g:,}",
                       ", ".join(f"{n} {float(w):.3g}" for n, w in zip(source.names, ph.weights, strict=True) if w > 0))
                      for p, (ph, g) in enumerate(zip(source.phases, starts, strict=True))]
        weights = "token weights" if source.weight_by == "tokens" else "weights"
        parts.append(html_table(("phase", "start", "first chunk", weights), phase_rows, caption="mixture schedule"))
    return html_block(*parts)


def _identity(pipeline) -> str:
    try:
        degree, group = pipeline.session.identity()
        lanes = lanes_of(pipeline)
    except ConfigError as exc:  # a repr never raises: show what is wrong instead
        return f"invalid ({exc})"
    return f"dp_degree={degree}, dp_group_id={group}, lanes {lanes}"


def _runner(pipeline) -> str:
    runner = pipeline.session.started_runner  # only a runner already started; never start one
    if runner is not None:
        return runner.describe()
    return f"{choose_runner(pipeline.description.settings)} (starts on the first iteration)"


def _short(op) -> str:
    """``name(setting=value, ...)`` with unset settings left out and a tokenizer named by its kind."""
    spec = op.spec()
    parts = []
    for key in sorted(k for k in spec if k != "op"):
        value = spec[key]
        if isinstance(value, dict):
            value = value.get("kind") or value.get("fn") or "..."
        if value not in (None, False):
            parts.append(f"{key}={value}")
    return f"{op.name}({', '.join(parts)})"


def _token_weight(source, c: int) -> str:
    """``", 0.3 of tokens at 812.5 tokens/sample"`` for a token-weighted source, else ``""``."""
    if source.weight_by != "tokens":
        return ""
    return (f"; {float(source.target_weights[c]):.3g} of tokens at "
            f"{float(source.tokens_per_sample[c]):,.1f} tokens/sample")


def _unmeasured_summary(pipeline) -> Section:
    """The summary of a token-weighted pipeline that does not tokenize yet (nothing to measure)."""
    source = pipeline.session.source
    datasets = ", ".join(f"{n} ({size:,} samples, {float(w):.3g} of tokens)"
                         for n, size, w in zip(source.names, source.sizes, source.target_weights, strict=True))
    return Section("zephon_dask Pipeline", pairs=(
        ("fingerprint", "not yet: weight_by='tokens' measures tokens per sample once the pipeline tokenizes"),
        ("datasets", datasets),
        ("operators", " -> ".join(_short(op) for op in pipeline.description.record_ops) or "none"),
        ("identity", _identity(pipeline)),
        ("runner", _runner(pipeline)),
    ))


def pipeline_summary(pipeline) -> Section:
    """One screen about ``pipeline``: fingerprint, datasets with sizes, stream, lanes and
    windows, operators, batch shape, DP identity and runner (reads only; starts nothing)."""
    if pipeline.session.source.unmeasured and not has_tokens(pipeline.session.source, pipeline.description.record_ops):
        return _unmeasured_summary(pipeline)
    spec = pipeline.spec
    source = spec.source
    datasets = ", ".join(
        f"{d.name} ({getattr(d, 'format', '?')}, {getattr(d, 'num_shards', len(d.shard_sizes))} shards, "
        f"{size:,} samples, {'sample ' if source.weight_by == 'tokens' else ''}weight {float(w):.3g}"
        f"{_token_weight(source, c)})"
        for c, (d, size, w) in enumerate(zip(source.datasets, source.sizes, source.weights, strict=True)))
    chunks = "endless" if source.num_chunks is None else f"{source.num_chunks:,}"
    replicas, k = spec.canonical_replicas, spec.flush_every_k_chunks
    if source.num_chunks is None:
        windows = "endless"
    else:
        windows = span([spec.num_windows(lane) for lane in range(replicas)])
    ops = " -> ".join(_short(op) for op in (*spec.record_ops, *spec.accumulators, *spec.batch_ops)) or "none"
    batch = pipeline.description.batch
    pairs = (
        ("fingerprint", spec.fingerprint[:16]),
        ("datasets", datasets),
        ("stream", f"{chunks} chunks of {source.chunk_size}, seed {source.seed}"),
        ("lanes", f"canonical_replicas={replicas}, flush_every_k_chunks={k}, windows per lane {windows}"),
        ("operators", ops),
        ("batches", f"microbatch_size={batch.microbatch_size}, labels={batch.labels}, "
                    f"drop_last={batch.drop_last}"),
        ("identity", _identity(pipeline)),
        ("steps", _steps(pipeline)),
        ("runner", _runner(pipeline)),
    )
    return Section("zephon_dask Pipeline", pairs=pairs)


def _steps(pipeline) -> str:
    """The global steps of one pass (see ``explain()``); what is wrong when the step is invalid."""
    try:
        return steps_in_a_pass(pipeline)
    except ZephonError:  # a repr never raises
        return "unknown: the global step is invalid at this degree (see explain())"


def pipeline_text(pipeline) -> str:
    """:func:`pipeline_summary` as text (``repr(pipeline)``)."""
    return pipeline_summary(pipeline).text()


def pipeline_html(pipeline) -> str:
    """:func:`pipeline_summary` as HTML (a pipeline in a notebook cell); ``explain()`` has the rest."""
    return html_block(pipeline_summary(pipeline).html())


def _sources(rows: list[tuple]) -> str:
    shown = [f"{d}/{s}/{o}[{t}:{t + n}]" for d, s, o, t, n in rows[:SOURCES_SHOWN]]
    more = f" + {len(rows) - SOURCES_SHOWN} more" if len(rows) > SOURCES_SHOWN else ""
    return ", ".join(shown) + more


@views.register("batch_html")
def batch_html(batch) -> str:
    """A batch: its fields and, per row, length, padding and where the tokens came from."""
    pairs = [("lane", str(batch.lane)), ("index_in_lane", str(batch.index_in_lane)),
             ("samples", str(batch.num_samples))]
    fields = [(name, str(tuple(batch[name].shape)), str(batch[name].dtype)) for name in batch]
    doc_ids = batch["document_ids"]
    rows = []
    for i in range(batch.num_samples):
        ids = doc_ids[i]
        length = int(batch["lengths"][i])
        real = int((ids >= 0).sum())
        rows.append((str(i), str(length), str(real), str(length - real), str(len(set(ids[ids >= 0].tolist()))),
                     _sources(batch.sources(i))))
    return html_block(
        html_title(f"Batch: lane {batch.lane}, #{batch.index_in_lane}"), html_pairs(pairs),
        html_table(("field", "shape", "dtype"), fields),
        html_table(("row", "length", "tokens", "padding", "documents", "sources (dataset/shard/offset[tokens])"),
                   rows),
    )




def _lookup(config: dict, key: str):
    if key in config:
        return config[key]
    source = config.get("source")
    return source.get(key) if isinstance(source, dict) else None


def _lane_order(key: str) -> tuple:
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


@views.register("state_html")
def state_html(state) -> str:
    """A checkpoint state dict: summary, per-lane progress and round-robin pointers (tolerant).

    Also takes a :class:`~zephon_dask.state.State`, or the content of a file written by
    :func:`~zephon_dask.save_state` (``{"sha256": ..., "state": ...}``), e.g.
    ``state_html(json.load(open(path)))``. A dict is shown as it is, malformed or not.
    """
    if isinstance(state, State):
        state = state.to_dict()
    if isinstance(state, dict) and set(state) == {"sha256", "state"}:
        state = state["state"]
    if not isinstance(state, dict):
        return html_block(html_title(f"not a state dict: {type(state).__name__}"))
    config = state["config"] if isinstance(state.get("config"), dict) else {}
    pairs = [(k, str(state.get(k))) for k in ("format", "version", "fingerprint")]
    pairs += [(k, str(_lookup(config, k))) for k in ("canonical_replicas", "flush_every_k_chunks",
                                                     "seed", "chunk_size") if _lookup(config, k) is not None]
    step = state.get("step")
    if isinstance(step, dict):
        pairs += [(f"step.{k}", str(step[k])) for k in sorted(step)]
    elif step is not None:
        pairs.append(("step", str(step)))
    extra = sorted(k for k in state if k not in STATE_KEYS)
    if extra:
        pairs.append(("other keys", ", ".join(extra)))
    lanes = state["lanes"] if isinstance(state.get("lanes"), dict) else {}
    lane_rows = []
    for lane in sorted(lanes, key=lambda k: _lane_order(str(k))):
        progress = lanes[lane] if isinstance(lanes[lane], dict) else {}
        more = sorted(k for k in progress if k not in LANE_FIELDS)
        lane_rows.append((str(lane), *(str(progress.get(f, "")) for f in LANE_FIELDS),
                          ", ".join(f"{k}={progress[k]}" for k in more)))
    pointers = state["pointers"] if isinstance(state.get("pointers"), dict) else {}
    pointer_rows = [(_pointer_lanes(str(k)), str(pointers[k])) for k in sorted(pointers, key=str)]
    return html_block(
        html_title("zephon_dask state"), html_pairs(pairs),
        html_table(("lane", *LANE_FIELDS, "other"), lane_rows, caption=f"lanes ({len(lane_rows)})"),
        html_table(("the group's lanes", "next lane"), pointer_rows,
                   caption="round-robin: the lane each group's next batch comes from"),
    )


def _pointer_lanes(key: str) -> str:
    """A pointer key ``"<worker>/<active workers>:<lanes>"`` in words: its lanes, and its worker
    unless it is the only one (``0/1``, what this package writes); another shape as it is."""
    worker, sep, lanes = key.partition(":")
    index, slash, active = worker.partition("/")
    if not (sep and slash and index.isdigit() and active.isdigit()):
        return key
    return lanes.replace(",", ", ") + ("" if worker == "0/1" else f" (worker {index} of {active})")
