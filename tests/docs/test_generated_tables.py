"""The docs' generated tables (``docs/tables.py``, run by ``make docs``) equal their definitions:
the options, the recipe keys, the formats."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tables():
    spec = importlib.util.spec_from_file_location("doc_tables", ROOT / "docs" / "tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_table_is_current():
    stale = _tables().stale()
    assert not stale, f"generated tables are stale in {', '.join('docs/' + p for p in stale)}: run `make docs`"


def test_a_changed_definition_makes_its_page_stale(monkeypatch, capsys):
    tables = _tables()
    source, table = tables.TABLES["formats.md"]
    monkeypatch.setitem(tables.TABLES, "formats.md", (source, lambda: table() + "\n| `lines` | x | y |"))
    assert tables.stale() == ["formats.md"]
    old, new = tables.render("formats.md")
    assert new.replace("\n| `lines` | x | y |", "") == old  # only the table between the markers changes
    assert tables.main(["--check"]) == 1
    assert capsys.readouterr().out == "docs/formats.md: its generated table is stale; run `make docs`\n"
