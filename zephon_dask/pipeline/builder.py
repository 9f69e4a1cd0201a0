"""``Pipeline``: the immutable description users build, and the facade over its session.

Each builder method (``map``, ``filter``, ``decode_text``, ``tokenize``,
``tokenize_chat``, ``pack``, ``shuffle``, ``stateful``, ``add_op``, ``batch``, ``map_batch``,
``options``) validates its
arguments at once and returns a **new** pipeline; the one it was called on is
unchanged, so variants can be tried side by side. Data-defining calls build
the :class:`~zephon_dask.core.PipelineSpec`; execution options are kept apart
and never reach the spec or the fingerprint (the settings are defined once in
:mod:`zephon_dask.options`).

Running is the :class:`~zephon_dask.pipeline.session.Session`'s job: each
pipeline owns one, and ``iter()``, ``state_dict()``, ``load_state_dict()``
and ``close()`` act on it. A pipeline derived from one with a loaded state
carries that state on (checked again when the data changed).

The class keeps building and identity (``description``, ``spec``,
``fingerprint``, ``num_steps``); the rest are one-line calls
into their homes: the session (iteration, checkpoints, the runner:
``pipeline.session.runner()``; the DP identity and the global step:
``pipeline.session.identity()``, ``pipeline.session.step_shape()``; a step's
consumption: ``pipeline.session.mark_consumed(batch)``), :mod:`.ranks` (lanes:
``ranks.owned_lanes(pipeline.description.settings)``), :mod:`.resume`,
:mod:`.torch_data` (torch adapters), :mod:`zephon_dask.inspect` (views, step
counts, phase plans, the lane table ``plan_table(pipeline)`` and one window's
graph ``window_graph(pipeline, lane, window)``) and :mod:`zephon_dask.recipe`
(``from_config``).
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

from .. import inspect as inspection
from ..consumer.batch import BATCH_KEYS, BatchOptions
from ..core.spec import PipelineSpec, has_tokens
from ..curriculum import MixtureWorkSource
from ..data import fields as record_fields
from ..errors import ConfigError, UnsizedPipelineError
from ..operators.base import Accumulator, RecordOp
from ..operators.chat import ROLES, TokenizeChat
from ..operators.custom import MapBatch, adopt
from ..operators.mixture import EnsureMixture
from ..operators.pack import Pack
from ..operators.records import DecodeText, Filter, Map
from ..operators.shuffle import Shuffle
from ..operators.stateful import Stateful
from ..operators.tokenize import Tokenize
from ..options import DEFAULTS, OPTIONS
from ..options import check as check_options
from ..recipe import Recipe, load_recipe
from ..state import steps
from ..state.schema import State
from ..validate import check_bool, check_int, check_keywords
from .description import Description
from .guard import refuse_fetching_ahead
from .resume import check as check_resume
from .session import Session


@check_keywords
class Pipeline:
    """``Pipeline(work_source).tokenize(...).pack(...).batch(...).options(...)``: an immutable
    description; iterating it runs its session (see the module docstring).

    Example:
        >>> import zephon_dask as zd  # doctest: +SKIP
        >>> web = zd.Dataset.from_jsonl("web", "data/web/")  # doctest: +SKIP
        >>> pipeline = (zd.Pipeline(zd.MixtureWorkSource([web], seed=0))  # doctest: +SKIP
        ...             .tokenize("tokenizer.json").pack(2048).batch(8)
        ...             .options(canonical_replicas=8))
        >>> for batch in pipeline:  # doctest: +SKIP
        ...     train_step(batch["tokens"])
    """

    def __init__(self, work_source: MixtureWorkSource):
        if not isinstance(work_source, MixtureWorkSource):
            raise ConfigError(
                f"Pipeline needs a MixtureWorkSource, got {type(work_source).__name__}; "
                "wrap datasets as MixtureWorkSource([dataset, ...])"
            )
        self._source = work_source
        self._description = Description((), (), BatchOptions(), DEFAULTS)
        self._batched = False  # .batch() was called: it sets the shape once
        self._session = Session(work_source, self._description)

    def _derive(self, **changes) -> Pipeline:
        """A new pipeline: this description with ``changes`` (fields of :class:`Description`, and
        ``batched``), a fresh session, and this one's loaded state carried on."""
        new = object.__new__(Pipeline)
        new._source = self._source
        new._batched = changes.pop("batched", self._batched)
        new._description = replace(self._description, **changes)
        # the session never sees the pipeline; its source is measured again if its operators need it
        new._session = Session(self._session.source, new._description, built=self._source)
        resume = self._session.resume
        if resume is not None:
            if new.spec.fingerprint == self.spec.fingerprint:
                new._session.load(resume, self._session.measured_source())
            else:  # the data changed: the state must still describe it
                new.load_state_dict(resume)
        return new

    # -- stateless ------------------------------------------------------------------

    def _add_record_op(self, op: RecordOp) -> Pipeline:
        if self._description.accumulators:
            raise ConfigError(
                f".{op.name}() comes after .{self._description.accumulators[-1].name}(): stateless operators "
                "run per chunk, before the accumulators; move it earlier in the chain"
            )
        return self._derive(record_ops=(*self._description.record_ops, op))

    def map(self, fn, name: str | None = None, version=None) -> Pipeline:
        """Apply ``fn(record) -> record`` to every record, in its chunk task (stateless).

        Args:
            fn: a function taking a record dict and returning a dict (the record,
                changed or not). It must be pure: same record, same output.
            name: a stable name for ``fn`` in the fingerprint (default: its
                qualified name and a hash of its bytecode).
            version: pin ``fn``'s identity (any str or int): the bytecode hash is
                then left out, so the fingerprint survives a Python upgrade; bump
                it when the function's behaviour changes.

        Returns:
            A new pipeline (this one is unchanged).

        Raises:
            ConfigError: ``fn`` is not callable, or an accumulator (``pack``,
                ``shuffle``, ``stateful``) comes earlier in the chain.

        Example:
            >>> pipeline.map(lambda r: {**r, "text": r["text"].strip()})  # doctest: +SKIP
        """
        return self._add_record_op(Map(fn, name, version))

    def filter(self, fn, name: str | None = None, version=None) -> Pipeline:
        """Keep the records for which ``fn(record)`` is true, in their chunk task (stateless).

        Args:
            fn: a pure predicate on a record dict.
            name, version: ``fn``'s identity in the fingerprint, as for :meth:`map`.

        Returns:
            A new pipeline. ``stats()`` counts the records dropped (``filter.dropped``).

        Raises:
            ConfigError: ``fn`` is not callable, or an accumulator comes earlier.

        Example:
            >>> pipeline.filter(lambda r: len(r["text"]) > 200)  # doctest: +SKIP
        """
        return self._add_record_op(Filter(fn, name, version))

    def decode_text(self, field: str = "text", encoding: str = "utf-8", errors: str = "strict") -> Pipeline:
        """Decode a bytes field to ``str`` in place (stateless; a ``str`` passes unchanged).

        Args:
            field: the record field holding bytes.
            encoding: any Python codec name.
            errors: ``"strict"`` (a bad byte raises ``DataFormatError`` naming the
                record), ``"replace"`` or ``"ignore"``.

        Returns:
            A new pipeline.

        Raises:
            ConfigError: an empty field name or an unknown codec.

        Example:
            >>> pipeline.decode_text("content", encoding="latin-1")  # doctest: +SKIP
        """
        return self._add_record_op(DecodeText(field, encoding, errors))

    def tokenize(self, tokenizer="bytes", field: str | None = None, bos: bool = False, eos: bool = True,
                 max_length: int | None = None, split_long: bool = False, bos_id=None, eos_id=None,
                 name: str | None = None, version=None, keep=None) -> Pipeline:
        """Encode ``record[field]`` into token ids, a chunk at a time (stateless).

        Args:
            tokenizer: ``"bytes"`` (UTF-8 bytes, BOS 256, EOS 257; needs no file),
                the path of a Hugging Face ``tokenizer.json``, a
                ``tokenizers.Tokenizer``, or a callable ``str -> list[int]``.
            field: the text field of every record (default: each dataset's ``text_field``,
                so datasets whose text lies in different fields mix with no ``map``).
            bos, eos: add the tokenizer's BOS / EOS id around each document.
            max_length: cap a document's tokens (BOS/EOS included); the rest is
                dropped and counted (``tokenize.truncated_tokens``) unless
                ``split_long``.
            split_long: cut long documents into ``max_length`` pieces instead.
            bos_id, eos_id: the special ids (an int, or a token string for a
                Hugging Face tokenizer; found by name when not given).
            name, version: a callable tokenizer's identity in the fingerprint.
            keep: numeric record fields to carry into each batch, one value per token (its
                document's): a list of names (``["domain"]``; bools, ints and floats become
                ``bool``, ``int64`` and ``float32``) or a mapping name -> ``"int64"``,
                ``"float32"``, ``"float64"`` or ``"bool"``. ``batch[name]`` has the shape of
                ``batch["tokens"]``; padding holds -1, NaN or False.

        Returns:
            A new pipeline.

        Raises:
            ConfigError: a second ``tokenize``, an unsupported tokenizer (``"byte"``: did you
                mean ``"bytes"``), a flag that is not a bool, a missing special token, or a bad
                length setting.
            DatasetNotFoundError: the ``tokenizer.json`` path does not exist (a hub name such
                as ``"gpt2"``: the message says how to download it; nothing is downloaded).
            MissingFieldError: a dataset's records lack ``field`` (checked when no ``map`` or
                ``filter`` comes before).

        Example:
            >>> pipeline.tokenize("tokenizer.json", bos=True, eos=True)  # doctest: +SKIP
        """
        if any(op.makes_tokens for op in self._description.record_ops):
            raise ConfigError("the pipeline already tokenizes; call .tokenize() once")
        dataset_fields = None
        if field is None:  # each dataset's text_field; one field when they agree (the same spec)
            texts = {ds.name: ds.text_field for ds in self._source.datasets if not ds.holds_tokens}
            field = next(iter(texts.values()), "text")
            dataset_fields = texts if len(set(texts.values())) > 1 else None
        op = Tokenize(tokenizer, field, bos, eos, max_length, split_long, bos_id, eos_id, name, version, keep,
                      dataset_fields=dataset_fields)
        self._check_field("tokenize", op.field, op.dataset_fields)
        if clash := [k for k in op.keep if k in BATCH_KEYS]:
            raise ConfigError(f"tokenize(keep={clash!r}): a batch already has {clash[0]!r}; rename the field "
                              "first with .map(...)")
        return self._add_record_op(op)

    def tokenize_chat(self, tokenizer, field: str = "messages", chat_template: str | None = None,
                      loss_on: str = "assistant", max_length: int | None = None,
                      bos_token: str | None = None, eos_token: str | None = None,
                      roles=ROLES) -> Pipeline:
        """Render each conversation with a chat template, tokenize it and mark the tokens to train.

        Each record's ``field`` is a list of ``{"role", "content"}`` messages. It is
        rendered as ``transformers``' ``apply_chat_template`` renders it (same tokens),
        and gets a per-token ``loss_mask``: 1 on the assistant's turns (their content
        and end-of-turn marker), 0 elsewhere. The mask travels through ``pack``,
        ``shuffle`` and ``stateful`` into batches, where ``batch(labels=...)`` puts
        ``ignore_index`` on every target whose token is masked out.

        Args:
            tokenizer: a ``tokenizer.json`` path (or its folder; the chat template and
                special tokens are read from the ``tokenizer_config.json`` beside it),
                a ``tokenizers.Tokenizer``, a ``transformers`` fast tokenizer, or
                ``"bytes"``.
            field: the messages field.
            chat_template: the template's jinja2 text (overrides the tokenizer's).
            loss_on: ``"assistant"`` (every assistant turn) or ``"last"`` (only the last).
            max_length: cap a conversation's tokens; the rest is dropped and counted
                (``tokenize_chat.truncated_tokens``).
            bos_token, eos_token: the ``bos_token`` / ``eos_token`` template variables
                (default: the tokenizer's).
            roles: the roles a message may have.

        Returns:
            A new pipeline.

        Raises:
            ConfigError: a second tokenizer, no chat template, a template that does not
                compile, a tokenizer without offsets (a callable), or a bad setting.
            MissingFieldError: a dataset's records lack ``field`` (checked here when no ``map``
                or ``filter`` comes before).
            ChatFormatError, MissingFieldError, FieldTypeError: at run time, a bad
                conversation, naming its record (dataset, shard, offset).

        Example:
            >>> pipeline.tokenize_chat("tok/tokenizer.json", loss_on="last")  # doctest: +SKIP
        """
        if any(op.makes_tokens for op in self._description.record_ops):
            raise ConfigError("the pipeline already tokenizes; call .tokenize() or .tokenize_chat() once")
        op = TokenizeChat(tokenizer, field, chat_template, loss_on, max_length, bos_token, eos_token, roles)
        self._check_field("tokenize_chat", op.field)
        return self._add_record_op(op)

    def _check_field(self, call: str, field: str, per_dataset: dict[str, str] | None = None) -> None:
        """``field`` (``per_dataset[name]`` where given) must be among each dataset's known fields
        (``Dataset.fields``) when the records reach ``call`` unchanged: no ``map``/``filter`` before
        it, which could add or drop fields."""
        if any(not isinstance(op, DecodeText) for op in self._description.record_ops):
            return
        for ds in self._source.datasets:
            known = getattr(ds, "fields", None)
            wanted = (per_dataset or {}).get(ds.name, field)
            if known is not None and wanted not in known:
                raise record_fields.missing(
                    ds.name, "its first record", wanted, known,
                    f"Pass {call}(field=<one of them>), or make the field with .map(...) before .{call}()")

    # -- accumulators ---------------------------------------------------------------

    def _add_accumulator(self, op: Accumulator, batch: BatchOptions | None = None) -> Pipeline:
        return self._derive(accumulators=(*self._description.accumulators, op), batch=batch or self._description.batch)

    def pack(self, max_length: int, algorithm: str = "wrap", pad_id: int = 0,
             num_bins: int | None = None, drop_oversized: bool = False,
             max_sequences_per_bin: int | None = None, min_sequence_length: int | None = None,
             groups: str | None = None, shuffle_bins: bool = False) -> Pipeline:
        """Pack each window's documents into rows of exactly ``max_length`` token slots.

        An accumulator: it runs per (lane, window), starts empty and is flushed
        at the window's end, so rows never mix lanes or windows.

        Args:
            max_length: tokens per row (e.g. 2048).
            algorithm: ``"wrap"`` (concatenate and cut; the window's leftover
                tokens are dropped and counted), ``"first_fit"`` or ``"best_fit"``
                (whole documents into bins, padded with ``pad_id``).
            pad_id: the padding id of the bin-packing algorithms (and of batches).
            num_bins: open bins of ``first_fit``/``best_fit`` (default 64).
            drop_oversized: ``first_fit``/``best_fit``: drop documents longer than
                ``max_length`` instead of cutting them (``pack.oversized_documents``).
            max_sequences_per_bin: ``first_fit``/``best_fit``: at most this many documents
                (pieces) in a row.
            min_sequence_length: drop documents shorter than this (``pack.short_documents``).
            groups: a field kept by ``tokenize(keep=[...])``: only documents with the same
                value share a row (rows per group: ``pack.group_rows.<value>``).
            shuffle_bins: emit each window's rows in a seeded order (from the seed, lane and
                window) instead of their packing order.

        Returns:
            A new pipeline.

        Raises:
            ConfigError: a second ``pack``, no tokens yet (call ``tokenize``
                first), or a bad setting.

        Example:
            >>> pipeline.pack(2048, algorithm="best_fit")  # doctest: +SKIP
        """
        if any(isinstance(op, Pack) for op in self._description.accumulators):
            raise ConfigError("the pipeline already packs; call .pack() once")
        self._check_tokens("pack")
        op = Pack(max_length, algorithm, pad_id, num_bins, drop_oversized, max_sequences_per_bin,
                  min_sequence_length, groups, shuffle_bins)
        kept = [k for o in self._description.record_ops for k in getattr(o, "keep", None) or ()]
        if groups is not None and groups not in kept:
            raise ConfigError(f"pack(groups={groups!r}) needs the field kept: .tokenize(..., keep=[{groups!r}]) "
                              f"(kept: {kept})")
        for tok in (o for o in self._description.record_ops if isinstance(o, Tokenize)):
            tok.check_id(pad_id, "pad_id")  # a pad id outside the vocabulary breaks the embedding
        for ds in self._source.datasets:  # token stores: their vocabulary, when known
            vocab = getattr(ds, "vocab_size", None)
            if vocab is not None:
                check_int(pad_id, "pad_id", 0, below=vocab, call="pack",
                          hint=f"a token id of dataset {ds.name!r}'s vocabulary")
        return self._add_accumulator(op, BatchOptions(**{**self._description.batch.config(), "pad_id": pad_id}))

    def shuffle(self, buffer_size: int, seed: int | None = None, algorithm: str = "reservoir") -> Pipeline:
        """Shuffle each window's samples through a buffer of ``buffer_size`` (an accumulator).

        The randomness comes from each sample's identity and the seed, never from a
        counter, so the order is the same on any runner and after any resume.

        Args:
            buffer_size: samples held in the buffer (larger mixes more).
            seed: this shuffle's seed (default: the work source's seed).
            algorithm: ``"reservoir"`` (each new sample evicts the slot its identity names),
                ``"block"`` (consecutive blocks of ``buffer_size``, each permuted) or
                ``"block_warmup"`` (blocks growing from ``buffer_size // 16`` to
                ``buffer_size``, so a window's first samples come early).

        Returns:
            A new pipeline.

        Raises:
            ConfigError: a bad ``buffer_size`` or ``algorithm``, or no tokens yet.

        Example:
            >>> pipeline.shuffle(1024, algorithm="block")  # doctest: +SKIP
        """
        self._check_tokens("shuffle")
        return self._add_accumulator(Shuffle(buffer_size, seed, algorithm))

    def ensure_mixture(self, weights=None, *, weight_by: str = "samples", strict: bool = False,
                       buffer_size: int = 1024, warn_tolerance: float | None = None) -> Pipeline:
        """Re-balance each window's samples toward the target mixture (an accumulator).

        Filters and splits change how many samples of each dataset are left; this
        restores the target: place it after them and before ``pack``. It runs per
        (lane, window) like every accumulator, so it stays exact at any dp degree
        and across any resume.

        Args:
            weights: ``{dataset: share}`` (a dataset left out gets 0), or ``None``:
                the source's mixture (what the curriculum drew into each window).
            weight_by: ``"samples"`` or ``"tokens"`` (real tokens per sample).
            strict: drop the surplus of over-represented datasets so each window
                delivers the target share (each dataset within one sample of its
                share); else keep every sample and only reorder toward it.
            buffer_size: samples held while reordering (the lookahead).
            warn_tolerance: warn once per iteration when a window's delivered share
                drifts further than this from the target (e.g. ``0.05``); ``None``:
                never. Not a data setting.

        Returns:
            A new pipeline.

        Raises:
            ConfigError: after ``pack``, a second ``ensure_mixture``, no tokens yet,
                an unknown dataset or a bad setting.

        Example:
            >>> pipeline.filter(keep).ensure_mixture(strict=True).pack(2048)  # doctest: +SKIP
        """
        self._check_tokens("ensure_mixture")
        for op in self._description.accumulators:
            if isinstance(op, (Pack, EnsureMixture)):
                raise ConfigError(
                    f".ensure_mixture() comes after .{op.name}(): "
                    + ("it re-balances documents, so it goes before .pack()" if isinstance(op, Pack)
                       else "call it once"))
        source = self._source
        token_weights = (source.target_weights if source.weight_by == "tokens" and source.phases is None
                         else None)
        return self._add_accumulator(EnsureMixture(
            source.names, weights, weight_by=weight_by, strict=strict, buffer_size=buffer_size,
            warn_tolerance=warn_tolerance, source_token_weights=token_weights))

    def stateful(self, name: str, init, push, flush, version=None) -> Pipeline:
        """Add your own accumulator: ``init()``, ``push(state, sample)``, ``flush(state)``.

        ``init`` makes a fresh state at each window's start; ``push`` returns the
        samples to emit now (possibly none); ``flush`` returns what is left at the
        window's end. Samples are ``Sample(tokens, positions, document_ids,
        lineage)`` named tuples. The functions must be pure given their inputs.

        Args:
            name: a unique name for this accumulator.
            init, push, flush: the three functions.
            version: pin the functions' identity in the fingerprint (see :meth:`map`).

        Returns:
            A new pipeline.

        Raises:
            ConfigError: the name is taken, or no tokens yet.

        Example:
            >>> pipeline.stateful("dedup", set, push, lambda s: [])  # doctest: +SKIP
        """
        self._check_tokens("stateful")
        if any(isinstance(op, Stateful) and op.label == name for op in self._description.accumulators):
            raise ConfigError(f"an accumulator named {name!r} exists already; names are unique")
        return self._add_accumulator(Stateful(name, init, push, flush, version))

    def _check_tokens(self, op: str) -> None:
        if not has_tokens(self._source, self._description.record_ops):
            raise ConfigError(
                f".{op}() needs token ids: call .tokenize(...) first (or read a token store "
                "with Dataset.from_tokens)"
            )

    # -- a user's operators ---------------------------------------------------------------

    def add_op(self, op) -> Pipeline:
        """Insert your own operator: an instance of a ``RecordOp`` (per chunk) or ``Accumulator``
        (per window) subclass, placed by its traits (see ``docs/operators.md``).

        The class sets ``name`` and its traits as class attributes (``one_to_one``,
        ``makes_tokens``, ``needs_tokens``; an optional ``version`` pins its identity as
        ``map``'s does); ``spec()`` returns the JSON-native settings that define its output.
        They enter the fingerprint with the class's qualified name and, unless ``version`` is
        set, a hash of its methods' bytecode, so a checkpoint of a changed operator is refused.
        The cheap checks of the contract run here; :meth:`validate` runs it on sample data.

        Args:
            op: the operator instance (its class defined at module level: workers import it).

        Returns:
            A new pipeline.

        Raises:
            ConfigError: ``op`` is not such an instance, lacks a ``name`` or a method, does not
                pickle, has a ``spec()`` that is not JSON-native or not stable, or cannot go here
                (the message says where it can go).

        Example:
            >>> pipeline.add_op(Lowercase()).tokenize()  # doctest: +SKIP
        """
        custom = adopt(op)
        d, label = self._description, f"add_op({type(op).__name__})"
        tokens = has_tokens(self._source, d.record_ops)
        if custom.kind == "stateless" and d.accumulators:
            raise ConfigError(f"{label}: a record operator runs per chunk, before the accumulators; it can go "
                              f"anywhere before .{d.accumulators[0].name}(): call add_op there")
        if (custom.needs_tokens or custom.kind == "accumulator") and not tokens:
            why = ("an accumulator sees a window's token samples" if custom.kind == "accumulator"
                   else "it needs token ids (needs_tokens=True)")
            raise ConfigError(f"{label}: {why}; it can go after .tokenize(...) (or on a token store read "
                              "with Dataset.from_tokens)")
        if custom.makes_tokens and (custom.kind == "accumulator" or tokens):
            raise ConfigError(f"{label}: makes_tokens=True, but " + (
                "an accumulator sees token samples already; only a record operator can make tokens"
                if custom.kind == "accumulator" else
                "the pipeline has token ids already; it can go in place of .tokenize(), before any "
                "operator that needs tokens"))
        if isinstance(custom, RecordOp):
            return self._add_record_op(custom)
        return self._add_accumulator(custom)

    def validate(self, chunks: int = 2):
        """Run each ``add_op`` operator and ``map_batch`` function on sample chunks and windows
        of this pipeline's data and check the contract (see ``docs/operators.md``).

        The checks: the same output twice and from a pickled copy (as a worker receives it),
        the input left unchanged, no draw from the global RNGs (``random``, numpy's, torch's),
        nothing kept on the instance; an accumulator's output of a window the same after
        another lane's window (its state stays in its lane and window); true traits (a
        ``one_to_one`` operator keeps every row, a ``makes_tokens`` one gives token ids); a
        stable ``spec()``.

        Args:
            chunks: the chunks of lane 0's first window a record operator is run on (at least 1).

        Returns:
            A :class:`~zephon_dask.pipeline.contract.Validation` (what was checked, on what).

        Raises:
            OperatorContractError: an operator breaks the contract (a ``ConfigError`` naming the
                operator, the check and the fix).

        Example:
            >>> print(pipeline.validate())  # doctest: +SKIP
        """
        from .contract import validate

        return validate(self, check_int(chunks, "chunks", 1, call="validate", hint="e.g. 2"))

    def map_batch(self, fn, name: str | None = None, version=None) -> Pipeline:
        """Apply ``fn(arrays) -> arrays`` to every batch's dict of numpy arrays, once it is cut
        (after ``.batch()``; per lane batch, before the lanes are interleaved).

        A pure function of one lane batch, so it keeps every resume exact (any cut, DP degree or
        runner). Its identity enters the fingerprint as ``map``'s does.

        Args:
            fn: takes the batch's ``{field: array}`` dict (a copy of the mapping; do not change
                the arrays in place) and returns a dict of numpy arrays that keeps ``tokens``.
            name, version: ``fn``'s identity in the fingerprint, as for :meth:`map`.

        Returns:
            A new pipeline.

        Raises:
            ConfigError: ``fn`` is not callable, or ``.batch()`` was not called yet.

        Example:
            >>> pipeline.batch(8).map_batch(lambda b: {**b, "tokens": b["tokens"] % 50000})  # doctest: +SKIP
        """
        op = MapBatch(fn, name, version)
        if not self._batched:
            raise ConfigError(".map_batch() transforms whole batches: call .batch(...) first")
        return self._derive(batch_ops=(*self._description.batch_ops, op))

    # -- batch shape and options --------------------------------------------------------

    def batch(self, microbatch_size: int, drop_last: bool = True, labels: bool | str = False,
              ignore_index: int = -100, mask_document_boundaries: bool = False,
              cu_seqlens: bool = False, dataset_ids: bool = False) -> Pipeline:
        """Set the batch shape (a data setting: it decides which samples land together).

        Batches are cut per lane by the consumer and never mix lanes.

        Args:
            microbatch_size: samples per batch.
            drop_last: drop a lane's last partial batch.
            labels: also build ``input_ids``, ``labels`` and ``loss_mask``: ``True`` or
                ``"shifted"`` gives next-token targets; ``"hf"`` unshifted labels with
                ``attention_mask`` and ``position_ids``, for models that shift themselves
                (Hugging Face causal LMs).
            ignore_index: the label of positions that are not trained on.
            mask_document_boundaries: no label across a document boundary.
            cu_seqlens: also build ``cu_seqlens`` for variable-length attention.
            dataset_ids: also build ``dataset_ids``: each token's dataset index, in the order
                of the pipeline's datasets (-1 on padding).

        Returns:
            A new pipeline.

        Raises:
            ConfigError: a second ``.batch()``, no tokens yet (call ``tokenize``
                first), ``microbatch_size`` not a positive int, a flag that is not a
                bool, or ``ignore_index`` not an int.

        Example:
            >>> pipeline.batch(8, labels=True)  # doctest: +SKIP
        """
        if self._batched:
            old = self._description.batch
            raise ConfigError(
                f".batch({microbatch_size!r}) follows .batch({old.microbatch_size!r}): the batch shape "
                "is set once; call .batch() once, with every argument (on the pipeline before it, to "
                "try another shape side by side)")
        self._check_tokens("batch")
        for flag, value in (("drop_last", drop_last), ("mask_document_boundaries", mask_document_boundaries),
                            ("cu_seqlens", cu_seqlens), ("dataset_ids", dataset_ids)):
            check_bool(value, flag, call="batch")
        return self._derive(batch=BatchOptions(microbatch_size, drop_last, labels, ignore_index,
                                               mask_document_boundaries, cu_seqlens, self._description.batch.pad_id,
                                               dataset_ids),
                            batched=True)

    def options(self, **settings: Any) -> Pipeline:
        """A new pipeline with these settings; the others are kept.

        Data settings (``canonical_replicas``, ``flush_every_k_chunks``) enter
        the fingerprint; step settings (``batches_per_step``,
        ``global_batches_per_step``) fix the global step a checkpoint records;
        execution settings (``runner``, ``n_workers``, ``client``,
        ``address``, ``prefetch_windows``, ``fuse``, ``retries``,
        ``dp_degree``, ``mapping_strategy``, ...) never change a byte of the
        data. The full list, with defaults, is ``zephon_dask.options.OPTIONS``
        and the table in ``docs/execution.md``; the signature lists them too.

        Returns:
            A new pipeline.

        Raises:
            ConfigError: an unknown option (with the closest known name) or a bad value.

        Example:
            >>> pipeline.options(canonical_replicas=8, prefetch_windows=6)  # doctest: +SKIP
        """
        checked = check_options(settings)
        merged = {**self._description.settings, **checked}
        if checked.get("global_batches_per_step") is not None:
            steps.check_global(checked["global_batches_per_step"], merged["canonical_replicas"])
        return self._derive(settings=merged)

    @property
    def description(self) -> Description:
        """What this pipeline was built with besides its work source: record operators,
        accumulators, batch shape and settings (a frozen value; see :mod:`.description`).

        Returns:
            A :class:`~zephon_dask.pipeline.description.Description`.

        Example:
            >>> pipeline.description.settings["canonical_replicas"]  # doctest: +SKIP
            8
        """
        return self._description

    @property
    def session(self) -> Session:
        """The runtime: runner, iteration, resume point (see :mod:`.session`).

        Returns:
            The pipeline's :class:`~zephon_dask.pipeline.session.Session`.
        """
        return self._session

    # -- the data definition ---------------------------------------------------------

    @property
    def spec(self) -> PipelineSpec:
        """The data definition: work source, operators, lanes and window size.

        ``spec.source`` is the work source the batches come from: this pipeline's, or after
        ``load_state_dict`` one with the state's seed; a schedule given in global steps has its
        phases resolved to chunk blocks (see :mod:`zephon_dask.core.phases`; after
        ``load_state_dict``, the checkpoint's). With ``weight_by="tokens"`` and no
        ``tokens_per_sample``, the first access measures them with this pipeline's record
        operators (see :mod:`zephon_dask.pipeline.measure`); after ``load_state_dict`` they are
        the checkpoint's. A chunk size the source leaves open (``chunk_size=None``) is chosen for
        the lanes (see :mod:`zephon_dask.curriculum.chunking`); after ``load_state_dict``, the
        checkpoint's. One window is ``zephon_dask.compute_window(pipeline.spec, lane, window)``.

        Returns:
            A :class:`~zephon_dask.core.PipelineSpec`; its ``fingerprint`` is :meth:`fingerprint`.

        Raises:
            ConfigError: the schedule's phases cannot start at distinct whole chunk blocks.
        """
        return self._session.spec()

    def fingerprint(self) -> str:
        """SHA-256 of every data-defining setting (execution options never change it).

        Returns:
            The hex digest a checkpoint records; equal fingerprints mean equal batches.

        Example:
            >>> pipeline.fingerprint()[:16]  # doctest: +SKIP
            '3f9a0c1d2b7e4a55'
        """
        return self.spec.fingerprint

    # -- execution ------------------------------------------------------------------------

    def __iter__(self):
        """Batches of this group's lanes, in strict round-robin.

        The first iteration after :meth:`load_state_dict` starts at the loaded
        state (if nothing is left there, the stream ended: it goes on into the
        next pass); every other starts a new pass over the stream (each lane
        from its beginning, the global step counting on), as after the end of
        a finite stream. A newer ``iter()`` (or :meth:`load_state_dict`)
        supersedes this iterator: using it afterwards raises :class:`StateError`.

        Returns:
            An iterator of :class:`~zephon_dask.Batch`.

        Example:
            >>> for batch in pipeline:  # doctest: +SKIP
            ...     train_step(batch["tokens"])
        """
        if (refused := refuse_fetching_ahead("a Pipeline")) is not None:
            return refused  # Lightning would checkpoint it a batch ahead of the step
        return self._session.iterate(self._session.tracked_stream, observe=True)

    def __len__(self) -> int:
        """A pipeline has no length: it is a stream cut into batches at run time.

        ``len()`` is what a ``DataLoader`` or a ``Trainer`` asks of a map-style
        dataset before indexing it, so this raises a ``TypeError`` naming the
        adapter to use (``tqdm``, ``list()`` and ``has_length`` checks catch it),
        also for a finite stream: a length would let such a caller go on to index
        it. How many global steps a finite stream gives is :meth:`num_steps`.

        Raises:
            UnsizedPipelineError: always.
        """
        raise UnsizedPipelineError(
            "a zephon_dask Pipeline is a stream of ready-made batches, with no length and no indexing, but "
            "something took it for a map-style dataset (a DataLoader, or a Trainer given train_dataset= or "
            "eval_dataset=pipeline). Hand it over through an adapter: the Hugging Face Trainer as "
            "zephon_dask.integrations.hf.ZephonTrainer (TRL's trainers with ZephonTrainerMixin), a "
            "DataLoader as pipeline.to_torch_loader(), Lightning as integrations.lightning.ZephonDataModule, "
            "accelerate as integrations.accelerate.prepare_pipeline. The global steps of a finite stream: "
            "pipeline.num_steps()"
        )

    def num_steps(self) -> int:
        """The full global steps one pass over this finite stream gives, at this DP degree.

        Exact: when every row is one sample (no ``pack``, ``filter``, ``stateful``
        or ``split_long``) it comes from the curriculum; otherwise every window is
        computed here once, in this process (the whole stream is read, tokenized
        and packed; cached for the data config). It counts a whole pass from the
        start, not what is left after a loaded state; batches after the last full
        step are in :func:`zephon_dask.inspect.step_count`.

        Returns:
            The global steps every DP group completes (``zephon-dask run --steps``
            and a trainer's ``max_steps`` can use them all).

        Raises:
            EndlessStreamError: the stream never ends (a ``TypeError``).
            ConfigError: the step settings are invalid at this degree.

        Example:
            >>> pipeline.num_steps()  # doctest: +SKIP
            53
        """
        count = inspection.step_count(self)
        assert count is not None
        return count.steps

    def __bool__(self) -> bool:
        """Always true (``__len__`` would raise)."""
        return True

    def to_torch(self, device=None, pin_memory: bool | None = None, prefetch: int = 2):
        """Yield dicts of torch tensors; on CUDA pinned and copied ahead on a side stream.

        Args:
            device: the target device (default: the tensors stay on the CPU).
            pin_memory: pin host memory (default: when ``device`` is CUDA).
            prefetch: batches copied ahead of the consumer.

        Returns:
            An iterator of ``{field: tensor}`` dicts; its deliveries move :meth:`state_dict`.

        Raises:
            DeviceUnavailableError: ``device`` is CUDA and this torch cannot use it (no CUDA build,
                no GPU): use ``device="cpu"``.

        Example:
            >>> for batch in pipeline.to_torch("cuda"):  # doctest: +SKIP
            ...     loss = model(batch["tokens"]).loss
        """
        from .torch_data import device_batches  # torch loads only when tensors are asked for

        return device_batches(self, device, pin_memory, prefetch)

    def to_torch_dataset(self):
        """An ``IterableDataset`` for ``DataLoader(num_workers=n)`` (lanes split across workers).

        It implements torchdata's ``Stateful`` protocol (also inside workers),
        so ``StatefulDataLoader(pipeline.to_torch_dataset(), batch_size=None,
        num_workers=n)`` checkpoints and resumes exactly, in O(1); the
        loader's state records the global step as :meth:`state_dict` does.
        This pipeline cannot see what such a loader delivered: its
        :meth:`state_dict` raises until it iterates again; take the state
        from the loader, or use :meth:`to_torch_loader`. Give the loader a
        ``generator`` (``torch.Generator()``): torch draws each iterator's
        worker seed from it, else from the global RNG.

        Returns:
            A :class:`~zephon_dask.pipeline.torch_data.PipelineDataset`.

        Raises:
            ConfigError: the step settings make steps depend on the topology
                (see :meth:`Session.step_shape`).
            StateError: a state was loaded into this pipeline and not yet
                applied: a DataLoader's workers would start every iteration
                there (load a ``StatefulDataLoader`` state into the loader, or
                use :meth:`to_torch_loader`).

        Example:
            >>> from torchdata.stateful_dataloader import StatefulDataLoader  # doctest: +SKIP
            >>> loader = StatefulDataLoader(pipeline.to_torch_dataset(), batch_size=None, num_workers=2)  # doctest: +SKIP
        """
        from .torch_data import handed_dataset

        return handed_dataset(self)

    def to_torch_loader(self, num_workers: int = 0, **dataloader_kwargs):
        """A ``DataLoader`` (subclass) over this pipeline whose deliveries feed :meth:`state_dict`
        and the ledger; its own ``state_dict``/``load_state_dict`` are this pipeline's.

        Args:
            num_workers: DataLoader worker processes (lanes are split across them).
            **dataloader_kwargs: other ``DataLoader`` arguments (``pin_memory``,
                ``prefetch_factor``, ...); not ``batch_size``, ``shuffle`` or a sampler.

        Returns:
            A :class:`~zephon_dask.pipeline.torch_data.PipelineLoader`.

        Raises:
            ConfigError: a ``DataLoader`` argument that would re-batch or sample.

        Example:
            >>> loader = pipeline.to_torch_loader(num_workers=2, pin_memory=True)  # doctest: +SKIP
            >>> torch.save({"data": loader.state_dict()}, "ckpt.pt")  # doctest: +SKIP
        """
        from .torch_data import PipelineLoader

        return PipelineLoader(self, num_workers=num_workers, **dataloader_kwargs)

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self, *, ahead: int | None = None, at_step: int | None = None) -> dict:
        """Progress of what this group's iteration delivered to the caller: a plain ``dict``.

        By default the state after every delivered batch, or after the batch
        :meth:`Session.mark_consumed` last named. Both options reach back at most
        :data:`~zephon_dask.state.progress.CONSUMED_RING` batches.

        Args:
            ahead: leave out the last ``ahead`` deliveries (fetched ahead of the
                step: a resume delivers them again).
            at_step: the state at the end of global step ``at_step``.

        Returns:
            A JSON-able dict (format, version, fingerprint, config, lanes, step);
            save it with :func:`zephon_dask.save_state` or ``torch.save``.

        Raises:
            StateError: the pipeline went to a DataLoader through
                :meth:`to_torch_dataset` and has not iterated since, both ``ahead``
                and ``at_step`` are given, or they reach beyond what is remembered.

        Example:
            >>> zephon_dask.save_state("ckpt/data.json", pipeline.state_dict())  # doctest: +SKIP
        """
        return self._session.state_dict(ahead, at_step)

    def load_state_dict(self, state: dict | State) -> Pipeline:
        """Resume from ``state`` at the next iteration; refuses a state of other data.

        The state applies once: the iteration after the next starts a new
        pass over the stream (a state at the end of the stream goes on into
        it at once). The seed comes from the state (with a warning if this
        pipeline says otherwise), and its global step (G) holds for the pipeline.
        Execution options, DP degree and mapping, DataLoader workers and the
        microbatch size may change.

        Args:
            state: a dict from :meth:`state_dict` or :func:`zephon_dask.load_state`
                (an older version is migrated), or a :class:`~zephon_dask.state.State`;
                checked by :func:`zephon_dask.pipeline.resume.check`.

        Returns:
            This pipeline (its session now resumes there).

        Raises:
            StateError: the state is malformed, was written with another
                ``canonical_replicas`` or data configuration (the difference is
                listed), or does not cover this group's lanes.

        Example:
            >>> pipeline.load_state_dict(zephon_dask.load_state("ckpt/data.json"))  # doctest: +SKIP
        """
        resumed = check_resume(self._session, state, announce=True)
        self._session.load(resumed.state, resumed.source)
        return self

    def close(self) -> None:
        """Stop the iteration, and the cluster or threads this pipeline started.

        Iterating or computing on the cluster afterwards raises :class:`ClosedError`;
        ``with pipeline:`` closes it on exit.

        Example:
            >>> with build_pipeline() as pipeline:  # doctest: +SKIP
            ...     batch = next(iter(pipeline))
        """
        self._session.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- inspection: the inspect package draws them (it reads the pipeline, never imports it) --

    @classmethod
    def from_config(cls, path) -> Pipeline:
        """The pipeline a TOML recipe describes (see ``docs/recipes.md``).

        Args:
            path: the recipe file, or a :class:`~zephon_dask.recipe.Recipe` from ``load_recipe``.

        Returns:
            A new pipeline: tokenize, shuffle, pack and batch as the recipe says. Its ``[batch]``
            is a default: one ``.batch(...)`` call may replace it (e.g. to add ``labels="hf"``).

        Raises:
            ConfigError: the recipe is malformed (the message names the file and key).
            DatasetNotFoundError: a dataset path does not exist.

        Example:
            >>> pipeline = Pipeline.from_config("recipe.toml")  # doctest: +SKIP
        """
        recipe = path if isinstance(path, Recipe) else load_recipe(path)
        pipeline = recipe.apply(cls(recipe.work_source()))
        pipeline._batched = False  # the recipe's [batch] is a default that one .batch() may replace
        return pipeline

    def explain(self):
        """A readable plan: datasets, mixture, lanes, operators, runner, warnings.

        Returns:
            An :class:`~zephon_dask.inspect.Explanation` (text in a terminal, HTML in a notebook).

        Example:
            >>> print(pipeline.explain())  # doctest: +SKIP
        """
        return inspection.explain(self)

    def preview(self, n: int = 3, lane: int = 0):
        """The first ``n`` rows of ``lane`` decoded to text, with each document's lineage.

        Args:
            n: rows to show.
            lane: the lane to read (its first windows are computed here, without Dask).

        Returns:
            A :class:`~zephon_dask.inspect.Preview`.

        Example:
            >>> pipeline.preview(n=2)  # doctest: +SKIP
        """
        return inspection.preview(self, n, lane)

    def stats(self):
        """Progress of the current iteration: lanes, windows, tokens/s, efficiency, mixture.

        Returns:
            A :class:`~zephon_dask.inspect.PipelineStats`.

        Example:
            >>> pipeline.stats().tokens_per_s  # doctest: +SKIP
        """
        return inspection.stats(self)

    def __repr__(self) -> str:
        return inspection.pipeline_text(self)

    def _repr_html_(self) -> str:
        return inspection.pipeline_html(self)


Pipeline.options.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    + [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default)
       for o in OPTIONS],
    return_annotation="Pipeline",
)
