"""The framework scripts of docs/frameworks.md import, and one of them trains and resumes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("pytorch_lightning")
pytest.importorskip("accelerate")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "frameworks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["hf_trainer", "trl_sft", "lightning_fit", "accelerate_loop"])
def test_example_imports_and_has_main(name):
    if name == "trl_sft":
        pytest.importorskip("trl")
    assert callable(load(name).main)


def test_accelerate_example_trains_saves_and_resumes(tmp_path, capsys):
    example = load("accelerate_loop")
    common = ["--save-every", "1", "--out", str(tmp_path), "--runner", "synchronous"]
    example.main(["--steps", "1", *common])
    example.main(["--steps", "2", "--resume", str(tmp_path / "step-1"), *common])
    assert (tmp_path / "step-2" / "custom_checkpoint_0.pkl").is_file()
    assert "step 2:" in capsys.readouterr().out
