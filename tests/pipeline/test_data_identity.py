"""Shards are identified by their content: a byte-identical copy or a ``touch`` under a run
changes nothing, and the run's ledger verifies against an undisturbed run's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import zephon_dask as z
from zephon_dask.cli import main as cli
from zephon_dask.data import integrity
from zephon_dask.state import ledger

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def copy_over(folder: Path) -> None:
    """Put a byte-identical copy, with a later mtime, in each JSONL file's place (``cp`` to a
    temporary name and a rename: a new file, as a download again gives)."""
    for path in sorted(folder.glob("*.jsonl")):
        copy = path.with_name(path.name + ".copy")
        shutil.copyfile(path, copy)  # the bytes only, no metadata
        os.utime(copy, ns=(0, path.stat().st_mtime_ns + 10**9))
        os.replace(copy, path)


def test_shards_copied_under_a_run_change_nothing_and_its_ledger_verifies(tmp_path, monkeypatch, capsys):
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    shutil.copy(EXAMPLES / "recipe.toml", tmp_path)
    common = [str(tmp_path / "recipe.toml"), "--runner", "synchronous"]
    whole, split, ckpt = tmp_path / "whole", tmp_path / "split", tmp_path / "ckpt.json"
    assert cli(["run", *common, "--steps", "6", "--ledger", str(whole)]) == 0

    written, hashed = [], []
    write, digest = ledger.LedgerWriter.write, integrity.digest

    def write_after_copying(self, *args):
        if not written:  # under the run: after its first batch, before the rest are read
            copy_over(tmp_path / "data")
        written.append(args)
        write(self, *args)

    monkeypatch.setattr(ledger.LedgerWriter, "write", write_after_copying)
    monkeypatch.setattr(integrity, "digest", lambda fh, *a: hashed.append(1) or digest(fh, *a))
    assert cli(["run", *common, "--steps", "3", "--ledger", str(split), "--checkpoint", str(ckpt)]) == 0
    assert hashed  # the copies were read, recognised by their content
    written.clear()  # the resumed run: copied over again after its first batch
    assert cli(["run", *common, "--steps", "3", "--ledger", str(split), "--resume", str(ckpt)]) == 0
    capsys.readouterr()
    assert cli(["verify", str(whole), str(split)]) == 0
    assert "6 global steps" in capsys.readouterr().out


def test_explain_says_how_each_dataset_tells_a_changed_file(corpus_dir):
    web = z.Dataset.from_jsonl("web", str(corpus_dir / "web"), progress=False)
    mem = z.Dataset.from_records("mem", [{"text": "x"}])
    text = str(z.Pipeline(z.MixtureWorkSource([web, mem], chunk_size=4)).explain().section("datasets"))
    assert "changed files  checked on every read: 3 files by content (a new mtime alone reads on)" in text
    mem_only = z.Pipeline(z.MixtureWorkSource([mem], chunk_size=1)).explain().section("datasets")
    assert "changed files" not in str(mem_only)  # records cannot change
