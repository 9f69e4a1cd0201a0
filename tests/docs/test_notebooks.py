"""The notebooks run top to bottom with nbclient, and are committed without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def test_three_notebooks_exist():
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_elastic_resume.ipynb", "03_dask_cluster.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code"), \
        f"{path.name} is committed with outputs; strip them"
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    stderr = ["".join(o.text) for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "stream" and o.name == "stderr"]
    assert not stderr, f"{path.name} printed on stderr (a warning?): {stderr}"
    assert any(o.output_type in ("display_data", "execute_result") for c in nb.cells for o in c.get("outputs", []))


def test_the_environment_has_a_notebook_front_end():
    """`make test` installs the dev extra; it brings JupyterLab, so `jupyter lab notebooks/` opens them."""
    import shutil
    import sys

    bin_dir = str(Path(sys.executable).parent)
    assert shutil.which("jupyter-lab", path=bin_dir) or shutil.which("jupyter-notebook", path=bin_dir)
