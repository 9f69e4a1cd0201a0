"""Notebook HTML views of datasets, work sources, pipelines, batches and checkpoint states. Pure.

Each function returns an HTML string; the classes' ``_repr_html_`` methods
delegate here, so Jupyter shows tables instead of long reprs.
"""

from __future__ import annotations

from .explain import explain
from .render import html_block, html_pairs, html_table, html_title

SHARDS_SHOWN = 20
SOURCES_SHOWN = 3


def dataset_html(dataset) -> str:
    """A dataset: its summary and its first shards."""
    pairs = [("format", dataset.format), ("text field", dataset.text_field),
             ("shards", f"{dataset.num_shards:,}"), ("samples", f"{dataset.num_samples:,}")]
    pairs += dataset.reader.html(dataset)
    if dataset.source is not None:
        pairs.append(("source", dataset.source))
    if dataset.data_files is not None:
        pairs.append(("data_files", ", ".join(dataset.data_files)))
    rows = [(str(i), s.shard_id, f"{s.num_samples:,}", "" if s.size_bytes is None else f"{s.size_bytes:,}")
            for i, s in enumerate(dataset.shards[:SHARDS_SHOWN])]
    more = dataset.num_shards - SHARDS_SHOWN
    caption = f"shards (first {SHARDS_SHOWN} of {dataset.num_shards:,})" if more > 0 else "shards"
    return html_block(html_title(f"Dataset {dataset.name!r}"), html_pairs(pairs),
                      html_table(("#", "shard id", "samples", "bytes"), rows, caption=caption))


def source_html(source) -> str:
    """A work source: mixture, stream length and the datasets with their exact weights."""
    chunks = "endless" if source.num_chunks is None else f"{source.num_chunks:,}"
    pairs = [("chunk_size", str(source.chunk_size)), ("seed", str(source.seed)), ("chunks", chunks),
             ("stop_after_passes", str(source.stop_after_passes)),
             ("exhausted_policy", str(source.exhausted_policy)),
             ("shuffle_shards", str(source.shuffle_shards)),
             ("shuffle_within_shard", str(source.shuffle_within_shard)),
             ("shuffle_block_size", str(source.shuffle_block_size)),
             ("lane_assignment", source.lane_assignment)]
    rows = [(name, f"{size:,}", f"{w.numerator}/{w.denominator}", f"{float(w):.2%}",
             f"{float(w * source.chunk_size):.2f}")
            for name, size, w in zip(source.names, source.sizes, source.weights, strict=True)]
    return html_block(html_title("MixtureWorkSource"), html_pairs(pairs),
                      html_table(("dataset", "samples", "weight", "share", "samples per chunk"), rows))


def pipeline_html(pipeline) -> str:
    """A pipeline: its :func:`~zephon_dask.inspect.explain` plan."""
    return explain(pipeline)._repr_html_()


def _sources(rows: list[tuple]) -> str:
    shown = [f"{d}/{s}/{o}[{t}:{t + n}]" for d, s, o, t, n in rows[:SOURCES_SHOWN]]
    more = f" + {len(rows) - SOURCES_SHOWN} more" if len(rows) > SOURCES_SHOWN else ""
    return ", ".join(shown) + more


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


LANE_FIELDS = ("window", "offset", "batches_delivered", "finished")
KNOWN_STATE_KEYS = ("format", "version", "fingerprint", "config", "lanes", "pointers", "step")


def _lookup(config: dict, key: str):
    if key in config:
        return config[key]
    source = config.get("source")
    return source.get(key) if isinstance(source, dict) else None


def _lane_order(key: str) -> tuple:
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


def state_html(state) -> str:
    """A checkpoint state dict: summary, per-lane progress and round-robin pointers (tolerant)."""
    if not isinstance(state, dict):
        return html_block(html_title(f"not a state dict: {type(state).__name__}"))
    config = state.get("config") if isinstance(state.get("config"), dict) else {}
    pairs = [(k, str(state.get(k))) for k in ("format", "version", "fingerprint")]
    pairs += [(k, str(_lookup(config, k))) for k in ("canonical_replicas", "flush_every_k_chunks",
                                                     "seed", "chunk_size") if _lookup(config, k) is not None]
    step = state.get("step")
    if isinstance(step, dict):
        pairs += [(f"step.{k}", str(step[k])) for k in sorted(step)]
    elif step is not None:
        pairs.append(("step", str(step)))
    extra = sorted(k for k in state if k not in KNOWN_STATE_KEYS)
    if extra:
        pairs.append(("other keys", ", ".join(extra)))
    lanes = state.get("lanes") if isinstance(state.get("lanes"), dict) else {}
    lane_rows = []
    for lane in sorted(lanes, key=lambda k: _lane_order(str(k))):
        progress = lanes[lane] if isinstance(lanes[lane], dict) else {}
        more = sorted(k for k in progress if k not in LANE_FIELDS)
        lane_rows.append((str(lane), *(str(progress.get(f, "")) for f in LANE_FIELDS),
                          ", ".join(f"{k}={progress[k]}" for k in more)))
    pointers = state.get("pointers") if isinstance(state.get("pointers"), dict) else {}
    pointer_rows = [(str(k), str(pointers[k])) for k in sorted(pointers, key=str)]
    return html_block(
        html_title("zephon_dask state"), html_pairs(pairs),
        html_table(("lane", *LANE_FIELDS, "other"), lane_rows, caption=f"lanes ({len(lane_rows)})"),
        html_table(("worker/active:lanes", "next lane"), pointer_rows, caption="round-robin pointers"),
    )
