import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from pipelines import write_corpus  # noqa: E402


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """Two small JSONL datasets: ``web`` (3 files) and ``code`` (2 files)."""
    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root / "web", 3, 60, 1, "web")
    write_corpus(root / "code", 2, 50, 2, "code")
    return root
