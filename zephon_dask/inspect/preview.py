"""``preview(pipeline, n, lane)``: the first rows of a lane decoded back to text. Pure.

Windows are computed here with ``zephon_dask.compute_window`` (no Dask, no
cluster). Each row is split at its document boundaries (runs of one
``document_ids`` value; padding is ``-1``); each segment is paired with its
lineage row ``(dataset, shard, offset, token_start, token_count)`` and decoded
with the pipeline's tokenizer (``decode``), BOS/EOS shown as markers. A
tokenizer without ``decode`` (a callable, a token store) shows token ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.window import compute_window
from ..operators.tokenize import Tokenize
from ..validate import check_int
from .render import esc, html_block, html_table, html_title, shorten

TEXT_LIMIT = 600  # characters of one document shown by str() and the HTML view
IDS_LIMIT = 64


@dataclass(frozen=True)
class PreviewDocument:
    """One document segment of a row and where its tokens came from (a value)."""

    dataset: str
    shard: int
    shard_id: str
    offset: int
    token_start: int
    token_count: int
    ids: tuple[int, ...]
    text: str | None  # decoded content without BOS/EOS; None when the tokenizer cannot decode
    bos: bool  # the segment starts with the BOS id
    eos: bool  # the segment ends with the EOS id

    @property
    def lineage(self) -> str:
        """Where the segment comes from: dataset, shard, offset and token range."""
        return (f"{self.dataset} shard {self.shard} ({self.shard_id}) offset {self.offset} "
                f"tokens {self.token_start}:{self.token_start + self.token_count}")

    def shown(self, limit: int = TEXT_LIMIT) -> str:
        """The segment as text cut at ``limit`` characters (its token ids when it has no text).

        Args:
            limit: the most characters shown.

        Returns:
            One line of text.
        """
        if self.text is None:
            ids = " ".join(map(str, self.ids[:IDS_LIMIT]))
            more = f" ... ({len(self.ids) - IDS_LIMIT} more ids)" if len(self.ids) > IDS_LIMIT else ""
            return f"ids: {ids}{more}"
        return ("<bos>" if self.bos else "") + shorten(self.text, limit) + ("<eos>" if self.eos else "")


@dataclass(frozen=True)
class PreviewRow:
    """One sample (a packed row, or a document when nothing packs) of a lane."""

    lane: int
    window: int
    sample: int  # index within the window's output
    length: int
    padding: int
    documents: tuple[PreviewDocument, ...]


@dataclass(frozen=True)
class Preview:
    """The first rows of one lane (a value): ``str()`` for a terminal, HTML for a notebook."""

    lane: int
    rows: tuple[PreviewRow, ...]
    decoder: str
    windows_computed: int

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        lines = [f"lane {self.lane}: {len(self.rows)} row(s) from {self.windows_computed} window(s); "
                 f"decoded with {self.decoder}"]
        for i, row in enumerate(self.rows):
            lines.append(f"\nrow {i} (window {row.window}, sample {row.sample}): {row.length} tokens, "
                         f"{row.padding} padding, {len(row.documents)} document(s)")
            for j, doc in enumerate(row.documents):
                lines.append(f"--- document {j}: {doc.lineage}")
                lines.append(doc.shown())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        parts = [html_title(f"lane {self.lane}: {len(self.rows)} row(s), decoded with {self.decoder}")]
        for i, row in enumerate(self.rows):
            rows = [(str(j), doc.dataset, f"{doc.shard} ({doc.shard_id})", str(doc.offset),
                     f"{doc.token_start}:{doc.token_start + doc.token_count}",
                     f'<pre style="white-space:pre-wrap;margin:0">{esc(doc.shown())}</pre>')
                    for j, doc in enumerate(row.documents)]
            caption = (f"row {i}: window {row.window}, sample {row.sample}, {row.length} tokens, "
                       f"{row.padding} padding")
            parts.append(html_table(("doc", "dataset", "shard", "offset", "tokens", "text"), rows,
                                    caption=caption, raw_columns=frozenset({5})))
        return html_block(*parts)


def _decoder(spec):
    """``(tokenize op or None, decode function or None, description)``."""
    op = next((o for o in spec.record_ops if isinstance(o, Tokenize)), None)
    if op is None:
        return None, None, "no tokenizer (token ids shown)"
    decode = getattr(op.tokenizer, "decode", None)
    kind = op.tokenizer.identity().get("kind", type(op.tokenizer).__name__)
    if decode is None:
        return op, None, f"a {kind} tokenizer without decode (token ids shown)"
    return op, decode, f"the {kind} tokenizer"


def _segments(document_ids: np.ndarray) -> list[tuple[int, int]]:
    """``(start, stop)`` of each run of one document id, padding (-1) left out."""
    if not len(document_ids):
        return []
    cuts = np.flatnonzero(np.diff(document_ids) != 0) + 1
    bounds = np.concatenate(([0], cuts, [len(document_ids)])).tolist()
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if document_ids[a] >= 0]


def _document(ids: np.ndarray, lineage, datasets, op, decode) -> PreviewDocument:
    d, s, o, t, c = (int(x) for x in lineage)
    ds = datasets[d]
    bos = op is not None and op.bos_id is not None and len(ids) > 0 and int(ids[0]) == op.bos_id
    eos = op is not None and op.eos_id is not None and len(ids) > 0 and int(ids[-1]) == op.eos_id
    content = ids[int(bos): len(ids) - int(eos)]
    text = None if decode is None else decode(content)
    shard_id = ds.shards[s].shard_id if hasattr(ds, "shards") else str(s)
    return PreviewDocument(ds.name, s, shard_id, o, t, c, tuple(int(i) for i in ids), text, bos, eos)


def preview(pipeline, n: int = 3, lane: int = 0, max_windows: int = 16) -> Preview:
    """The first ``n`` rows of ``lane``, from at most ``max_windows`` windows computed here."""
    n = check_int(n, "n", 1, call="preview", hint="e.g. 3")
    spec = pipeline.spec
    replicas = spec.canonical_replicas
    lane = check_int(lane, "lane", 0, below=replicas, call="preview", hint="a lane id")
    op, decode, description = _decoder(spec)
    datasets = spec.source.datasets
    total = spec.num_windows(lane)
    limit = max_windows if total is None else min(total, max_windows)
    rows: list[PreviewRow] = []
    window = 0
    while len(rows) < n and window < limit:
        table = compute_window(spec, lane, window).table
        for i in range(min(len(table), n - len(rows))):
            start, stop = int(table.offsets[i]), int(table.offsets[i + 1])
            tokens, doc_ids = table.tokens[start:stop], table.document_ids[start:stop]
            segments, lineage = _segments(doc_ids), table.sample_lineage(i)
            # built-in operators give one lineage row per segment; a user accumulator may not
            docs = tuple(_document(tokens[a:b], row, datasets, op, decode)
                         for (a, b), row in zip(segments, lineage, strict=False))
            rows.append(PreviewRow(lane, window, i, stop - start, int(np.count_nonzero(doc_ids < 0)), docs))
        window += 1
    return Preview(lane, tuple(rows), description, window)
