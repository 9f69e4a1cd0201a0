import atexit
import os
import shutil
import tempfile

import pytest

# The suite never writes to the real user cache: every process it starts (Dask
# workers, notebook kernels, torchrun) inherits this index cache directory.
_CACHE = tempfile.mkdtemp(prefix="zephon-test-cache-")
os.environ["ZEPHON_DASK_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)

from tests.helpers.pipelines import write_corpus  # noqa: E402


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """Two small JSONL datasets: ``web`` (3 files) and ``code`` (2 files)."""
    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root / "web", 3, 60, 1, "web")
    write_corpus(root / "code", 2, 50, 2, "code")
    return root


@pytest.fixture(scope="session")
def eval_corpus_dir(tmp_path_factory):
    """A small held-out JSONL corpus (one file, ten documents) for evaluation streams."""
    return write_corpus(tmp_path_factory.mktemp("held_out"), 1, 10, 3, "held")
