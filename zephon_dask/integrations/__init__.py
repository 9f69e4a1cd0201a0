"""Adapters for the training frameworks people use (optional extras, imported lazily).

- :mod:`zephon_dask.integrations.hf`: ``ZephonTrainer``, a Hugging Face ``Trainer``
  fed by a pipeline (``pip install 'zephon_dask[hf]'``);
- :mod:`zephon_dask.integrations.lightning`: ``ZephonDataModule`` for PyTorch
  Lightning (``pip install 'zephon_dask[lightning]'``);
- :mod:`zephon_dask.integrations.accelerate`: ``prepare_pipeline`` for
  accelerate (``pip install 'zephon_dask[accelerate]'``);
- :mod:`zephon_dask.integrations.torchtitan`: ``ZephonDataLoader``, a TorchTitan
  data loader whose checkpoint resumes at another DP degree (``pip install 'zephon_dask[torchtitan]'``).

Importing this package imports no framework; :mod:`zephon_dask.pipeline.guard` refuses the wrappers
that would split a pipeline's already rank-split stream a second time.
"""

from ..pipeline.guard import refuse_resharding

__all__ = ["refuse_resharding"]
