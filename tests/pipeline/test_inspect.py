"""Inspection: explain, HTML views, preview, plan tables, window graphs and the CLI commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from html.parser import HTMLParser
from pathlib import Path

import dask
import numpy as np
import pytest

import zephon_dask as z
from zephon_dask.cli import main
from zephon_dask.commands import bench
from zephon_dask.consumer import make_batch
from zephon_dask.core import compute_window
from zephon_dask.curriculum import routing
from zephon_dask.errors import ConfigError, MissingDependencyError
from zephon_dask.graph import window_graph as build_window_graph
from zephon_dask.inspect import (
    explain,
    lane_plans,
    plan_table,
    preview,
    state_html,
    window_graph,
)
from zephon_dask.operators.tokenize import ByteTokenizer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "recipe.toml"
WORDS = "river lamp harvest bridge ferry orchard lantern meadow — café naïve".split()


class Tables(HTMLParser):
    """Checks that tags nest and collects each table's rows of cell texts."""

    def __init__(self, text: str):
        super().__init__()
        self.stack: list[str] = []
        self.tables: list[list[list[str]]] = []
        self.tags: set[str] = set()
        self.feed(text)
        self.close()
        assert not self.stack, f"unclosed tags {self.stack}"

    def handle_starttag(self, tag, attrs):
        self.stack.append(tag)
        self.tags.add(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.tables[-1][-1].append("")

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()

    def handle_data(self, data):
        if "td" in self.stack or "th" in self.stack:
            self.tables[-1][-1][-1] += data


def write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect")
    rng = np.random.default_rng(5)
    for name, shards in (("web", 3), ("code", 2)):
        for s in range(shards):
            rows = [{"text": f"{name} {s}.{i}: " + " ".join(rng.choice(WORDS, int(rng.integers(1, 12))))}
                    for i in range(20)]
            write_jsonl(root / name / f"part-{s}.jsonl", rows)
    return root


def pipeline(corpus, algorithm="wrap", R=4, tokenizer="bytes", **options) -> z.Pipeline:
    web = z.Dataset.from_jsonl("web", corpus / "web")
    code = z.Dataset.from_jsonl("code", corpus / "code")
    source = z.MixtureWorkSource([web, code], {"web": 3, "code": 2}, chunk_size=10, seed=11)
    eos = {"eos_id": 0} if callable(tokenizer) else {}
    return (z.Pipeline(source).tokenize(tokenizer, bos=not callable(tokenizer), **eos).shuffle(6)
            .pack(96, algorithm=algorithm).batch(3, labels=True)
            .options(canonical_replicas=R, flush_every_k_chunks=2, runner="synchronous", **options))


# -- explain ---------------------------------------------------------------------------------


def test_explain_names_the_plan_and_starts_nothing(corpus):
    p = pipeline(corpus)
    e = explain(p)
    text = str(e)
    assert e.fingerprint == p.fingerprint() and p.fingerprint() in text
    for fragment in ("web", "code", "3/5 (60.0%)", "canonical_replicas", "lanes owned", "[0, 1, 2, 3]",
                     "tokenize", "shuffle", "pack", "accumulator (per window)", "stateless (per chunk)",
                     "synchronous (not started", "no Dask dashboard", "warnings: none"):
        assert fragment in text, fragment
    lanes = dict(e.section("lanes and windows").pairs)
    chunks = [len(p.spec.source.lane_chunks(lane, 4)) for lane in range(4)]
    assert lanes["chunks per lane"] in {str(min(chunks)), f"{min(chunks)}-{max(chunks)}"}
    assert p.session.started_runner is None and e.warnings == ()
    html = Tables(e._repr_html_())
    assert html.tables and "script" not in html.tags
    assert Tables(p._repr_html_()).tables  # the pipeline's own view: its one-screen summary
    datasets = next(t for t in html.tables if t[0][:2] == ["name", "format"])
    assert [row[0] for row in datasets[1:]] == ["web", "code"]
    files = dict(e.section("datasets").notes)  # the files each dataset chose, one line each
    assert files.pop("changed files").startswith("checked on every read: 5 files by content")
    assert files == {f"{d.name} files": d.chosen_files() for d in p.spec.source.datasets}
    assert files["web files"].startswith(f"3 files from {str(corpus / 'web')!r}: part-0.jsonl")
    assert all(line in text for line in files.values())
    assert any(t[:2] == [["web files", files["web files"]], ["code files", files["code files"]]]
               for t in html.tables)
    with p:
        p.session.runner()  # a started runner is described, with its dashboard if it has one
        execution = dict(explain(p).section("execution (never changes the data)").pairs)
        assert execution["runner"] == "synchronous" and execution["dashboard"].startswith("none")


def test_explain_warns_about_divisibility_and_elastic_steps(corpus):
    e = explain(pipeline(corpus, dp_degree=3, dp_group_id=2))
    assert len(e.warnings) == 1 and "not divisible by dp_degree=3" in e.warnings[0]
    assert "[3]" in dict(e.section("this DP group").pairs)["lanes owned"]
    e = explain(pipeline(corpus, dp_degree=2, dp_group_id=0, batches_per_step=1))
    assert len(e.warnings) == 1 and "batches_per_step=1" in e.warnings[0]
    assert "warnings:" in str(e) and e.warnings[0] in str(e)
    assert "batches_per_step=1" in e._repr_html_()
    e = explain(pipeline(corpus, dp_degree=8, dp_group_id=0))
    assert "exceeds canonical_replicas=4" in e.warnings[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        explain(pipeline(corpus, dp_degree=3, dp_group_id=0))  # reported, not warned


def test_explain_reports_lanes_without_chunks(corpus):
    p = pipeline(corpus, R=16)
    assert any("lanes get no chunk" in w for w in explain(p).warnings)


# -- HTML views --------------------------------------------------------------------------------


def test_dataset_and_source_html(corpus):
    p = pipeline(corpus)
    web = p.spec.source.datasets[0]
    shards = Tables(web._repr_html_()).tables[-1]
    assert [r[1] for r in shards[1:]] == [s.shard_id for s in web.shards]
    assert [r[2] for r in shards[1:]] == ["20"] * 3
    source = Tables(p.spec.source._repr_html_()).tables[-1]
    assert [r[:3] for r in source[1:]] == [["web", "60", "3/5"], ["code", "40", "2/5"]]
    weird = z.Dataset.from_records("<b>x</b>", ["a <i>b</i>"])
    html = weird._repr_html_()
    assert "<b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    Tables(html)


def test_batch_html_lists_rows_and_sources(corpus):
    p = pipeline(corpus)
    out = compute_window(p.spec, 0, 0)
    batch = make_batch(out.table.slice(0, 3), 0, 0, p.description.batch, p.spec.source.names)
    tables = Tables(batch._repr_html_()).tables
    fields = {row[0] for row in tables[1][1:]}
    assert {"tokens", "labels", "document_ids"} <= fields
    rows = tables[2][1:]
    assert len(rows) == 3
    d, s, o, t, n = batch.sources(0)[0]
    assert rows[0][5].startswith(f"{d}/{s}/{o}[{t}:{t + n}]")
    assert int(rows[0][2]) + int(rows[0][3]) == int(rows[0][1]) == 96


FRESH_REPRS = """
import sys
import zephon_dask as z
from zephon_dask.consumer import make_batch
from zephon_dask.consumer.batch import BatchOptions
from zephon_dask.core import PipelineSpec, compute_window
from zephon_dask.operators.pack import Pack
from zephon_dask.operators.tokenize import Tokenize

web = z.Dataset.from_records("web", ["river lamp", "harvest bridge ferry", "orchard"])
code = z.Dataset.from_records("code", ["def f(): pass", "x = 1"])
source = z.MixtureWorkSource([web, code], {"web": 3, "code": 2}, chunk_size=2, seed=1)
out = compute_window(PipelineSpec(source, (Tokenize("bytes"),), (Pack(32),), 1, 8), 0, 0)  # no Pipeline: it
batch = make_batch(out.table.slice(0, 2), 0, 0, BatchOptions(2, labels=True), source.names)  # imports inspect
assert "zephon_dask.inspect" not in sys.modules, "imported before any view was asked for"
for obj in (web, source, batch):
    html = obj._repr_html_()
    assert "<table" in html, (type(obj).__name__, html[:200])
assert "zephon_dask.inspect" in sys.modules  # the views module imported it on demand
print("ok")
"""


def test_html_reprs_work_in_a_fresh_process_that_never_imported_inspect():
    """Lower layers ask :mod:`zephon_dask.views` for their HTML by name; the inspect
    package registers the views when the first one is asked for, never imported upward."""
    done = subprocess.run([sys.executable, "-c", FRESH_REPRS], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_views_registry_names_and_errors():
    from zephon_dask import views
    from zephon_dask.errors import NotFoundError, ZephonError

    for name in ("batch_html", "source_html", "dataset_html", "state_html"):  # lower layers' reprs only
        assert name in views.names(), name
    assert views.show("state_html", {"lanes": {}}) == state_html({"lanes": {}})
    assert views.register("test_double", lambda x, k=1: 2 * x * k) is views.lookup("test_double")
    assert views.show("test_double", 3, k=2) == 12

    @views.register("test_decorated")
    def decorated():
        return "drawn"

    assert decorated() == views.show("test_decorated") == "drawn"
    with pytest.raises(NotFoundError, match="no view is registered as 'nope'.*dataset_html") as info:
        views.show("nope")
    assert isinstance(info.value, ZephonError) and isinstance(info.value, KeyError)


def test_state_html_is_a_lane_table_and_tolerates_extra_keys():
    state = {
        "format": "zephon_dask.state", "version": 1, "fingerprint": "ab" * 32,
        "config": {"canonical_replicas": 12, "flush_every_k_chunks": 2, "source": {"seed": 3, "chunk_size": 8}},
        "lanes": {str(lane): {"window": lane, "offset": 1, "batches_delivered": 2 * lane, "finished": lane == 10,
                              **({"note": "x"} if lane == 2 else {})} for lane in (10, 2, 0)},
        "pointers": {"0/1:0,2,10": 2},
        "step": {"global_step": 5, "batches_in_step": 0, "batches_per_step": 3, "dp_degree": 1},
        "written_by": "test",
    }
    tables = Tables(state_html(state)).tables
    summary = {row[0]: row[1] for row in tables[0]}
    assert summary["fingerprint"] == "ab" * 32 and summary["seed"] == "3"
    assert summary["step.global_step"] == "5" and summary["other keys"] == "written_by"
    lanes = tables[1][1:]
    assert [r[0] for r in lanes] == ["0", "2", "10"]
    assert lanes[2][1:5] == ["10", "1", "20", "True"] and lanes[1][5] == "note=x"
    assert tables[2][0] == ["the group's lanes", "next lane"]
    assert tables[2][1:] == [["0, 2, 10", "2"]]  # the key 0/1:0,2,10 in words
    other = Tables(state_html({**state, "pointers": {"1/2:3,4": 4, "x": 1}})).tables
    assert other[2][1:] == [["3, 4 (worker 1 of 2)", "4"], ["x", "1"]]
    Tables(state_html({"lanes": "?"}))
    Tables(state_html([1]))


# -- preview --------------------------------------------------------------------------------


def source_tokens(p, doc):
    dataset = p.spec.source.datasets[p.spec.source.names.index(doc.dataset)]
    text = dataset.read(doc.shard, [doc.offset])[0]["text"]
    tok = p.spec.record_ops[0]
    ids = [tok.bos_id, *ByteTokenizer().encode_batch([text])[0].tolist(), tok.eos_id]
    return text, ids


@pytest.mark.parametrize("algorithm", ["wrap", "best_fit"])
def test_preview_decodes_rows_back_to_the_source_documents(corpus, algorithm):
    p = pipeline(corpus, algorithm)
    pv = p.preview(n=4, lane=1)
    assert len(pv.rows) == 4 and pv.rows[0].lane == 1
    whole = 0
    for row in pv.rows:
        table = compute_window(p.spec, 1, row.window).table
        assert len(row.documents) == len(table.sample_lineage(row.sample))
        assert sum(d.token_count for d in row.documents) + row.padding == row.length == 96
        for doc in row.documents:
            text, ids = source_tokens(p, doc)
            assert list(doc.ids) == ids[doc.token_start: doc.token_start + doc.token_count]
            if doc.token_start == 0 and doc.token_count == len(ids):
                assert doc.text == text and doc.bos and doc.eos
                whole += 1
            assert doc.lineage in str(pv)
    assert whole
    if algorithm == "best_fit":
        assert all(d.token_count == len(source_tokens(p, d)[1]) for r in pv.rows for d in r.documents)
    tables = Tables(pv._repr_html_()).tables
    assert [len(t) - 1 for t in tables] == [len(r.documents) for r in pv.rows]


def test_preview_without_decode_shows_ids_and_checks_arguments(corpus):
    def words(text):
        return [len(w) for w in text.split()]

    p = pipeline(corpus, tokenizer=words)
    pv = preview(p, n=1, lane=0)
    doc = pv.rows[0].documents[0]
    assert doc.text is None and "ids: " in str(pv) and "without decode" in pv.decoder
    with pytest.raises(ConfigError, match="lane"):
        preview(p, lane=4)
    with pytest.raises(ConfigError, match="n=0"):
        preview(p, n=0)


# -- plan table ---------------------------------------------------------------------------------


def test_plan_table_matches_routing(corpus):
    p = pipeline(corpus, batches_per_step=2)
    table = plan_table(p, [1, 2, 3, 4, 8])
    assert [(e.dp_degree, e.mapping) for e in table.entries] == [
        (d, m) for d in (1, 2, 3, 4, 8) for m in routing.MAPPING_STRATEGIES]
    for e in table.entries:
        if e.dp_degree <= 4:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert e.plan == routing.plan(4, e.dp_degree, e.mapping)
        else:
            assert e.plan is None and "exceeds" in e.notes[0]
    by = {(e.dp_degree, e.mapping): e for e in table.entries}
    assert by[(3, "contiguous")].plan.imbalance == 1.5
    assert any("do not divide" in n for n in by[(3, "interleaved")].notes)
    assert any("not elastic" in n for n in by[(1, "contiguous")].notes)  # 2 x 1 % 4 != 0
    assert by[(2, "contiguous")].notes == ()
    text = str(table)
    assert "0,1 | 2,3" in text and "0,2 | 1,3" in text and "1.50" in text
    rows = Tables(table._repr_html_()).tables[0]
    assert len(rows) == 1 + len(table.entries)
    assert plan_table(p, [2], ["interleaved"]).entries[0].plan.groups == ((0, 2), (1, 3))
    with pytest.raises(ConfigError):
        lane_plans(4, [0])
    with pytest.raises(ConfigError):
        lane_plans(4, [2], ["diagonal"])


# -- window graph -------------------------------------------------------------------------------


def test_window_graph_keys_match_the_graph_module(corpus):
    p = pipeline(corpus, fuse=False)
    view = window_graph(p, 2, 1)
    plain = build_window_graph(p.spec, 2, 1, fused=False)
    assert (view.key, view.chunk_keys, view.spec_key, view.chunks) == (
        plain.key, plain.chunk_keys, plain.spec_key, plain.chunks)
    assert view.graph().keys() == plain.to_dict(p.spec).keys()
    kinds = [t["kind"] for t in view.tasks()]
    assert kinds == ["spec", *["chunk"] * len(view.chunks), "window"]
    assert dask.get(view.graph(), view.key).digest() == compute_window(p.spec, 2, 1).digest()
    rows = Tables(view._repr_html_()).tables[0][1:]
    assert [r[0] for r in rows] == [t["key"] for t in view.tasks()]
    fused = window_graph(pipeline(corpus), 2, 1)
    assert fused.fused and fused.chunk_keys == () and fused.key == build_window_graph(p.spec, 2, 1, True).key
    assert [t["kind"] for t in fused.tasks()] == ["spec", "fused-window"]
    assert len(Tables(fused._repr_html_()).tables[0]) == 3


def test_visualize_without_graphviz_names_the_fix(corpus, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "graphviz" else real(name, *a))
    with pytest.raises(MissingDependencyError, match="pip install graphviz") as info:
        window_graph(pipeline(corpus), 0, 0).visualize()
    assert isinstance(info.value, ImportError)


# -- command line -------------------------------------------------------------------------------


def test_cli_explain_and_plan(capsys):
    assert main(["explain", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    fingerprint = z.Pipeline.from_config(EXAMPLE).fingerprint()
    assert fingerprint in out and "lanes owned" in out and "warnings: none" in out
    assert main(["explain", str(EXAMPLE), "--dp-degree", "3", "--dp-group-id", "1"]) == 0
    assert "not divisible by dp_degree=3" in capsys.readouterr().out
    assert main(["plan", str(EXAMPLE), "--dp", "1,2,8", "--mapping", "interleaved"]) == 0
    out = capsys.readouterr().out
    assert "0,2 | 1,3" in out and "contiguous" not in out and "exceeds" in out
    with pytest.raises(SystemExit):
        main(["plan", str(EXAMPLE), "--dp", "two"])
    assert "comma-separated" in capsys.readouterr().err


def test_cli_reports_recipe_errors(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[datasets]]\nname = "x"\npath = "missing.jsonl"\n')
    assert main(["explain", str(bad)]) == 2
    assert main(["plan", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "zephon-dask explain: error:" in err and "missing.jsonl" in err and "Traceback" not in err


def test_cli_bench_runs_the_suite_or_says_where_it_is(tmp_path, monkeypatch, capsys):
    script = tmp_path / "benchmarks" / "run_all.py"
    script.parent.mkdir()
    script.write_text("import sys\nprint('ran', sys.argv[1:])\nsys.exit(3 if '--quick' in sys.argv else 0)\n")
    monkeypatch.setattr(bench, "find_script", lambda: script)
    assert main(["bench", "--quick"]) == 3
    assert main(["bench"]) == 0
    monkeypatch.setattr(bench, "find_script", lambda: None)
    assert main(["bench"]) == 2
    assert "source tree" in capsys.readouterr().err


def test_bench_finds_the_checkout_suite():
    assert bench.find_script() == ROOT / "benchmarks" / "run_all.py"


def test_entry_point_subprocess():
    exe = Path(sys.executable).parent / "zephon-dask"
    done = subprocess.run([str(exe), "plan", str(EXAMPLE), "--dp", "1,2,4"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "canonical_replicas=4" in done.stdout and "0,1 | 2,3" in done.stdout


def test_cli_at_a_degree_that_cannot_split_the_step_says_so_once(capsys):
    """explain: the invalid step in one line and its reason once among the warnings; run: one
    line on stderr (the uneven-groups warning with its source line does not come first)."""
    assert main(["explain", str(EXAMPLE), "--dp-degree", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("global step       invalid (see warnings)") == 1
    assert out.count("cannot take global_batches_per_step=4") == 1
    run = subprocess.run([sys.executable, "-m", "zephon_dask.cli", "run", str(EXAMPLE), "--steps", "2",
                          "--dp-degree", "3", "--runner", "synchronous"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        "zephon-dask run: error: dp_degree=3 cannot take global_batches_per_step=4 (4 batches per global step "
        "over canonical_replicas=4 lanes): it must divide both. Valid degrees: [1, 2, 4]"]
