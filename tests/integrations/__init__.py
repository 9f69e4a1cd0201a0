"""Training frameworks and torchrun (gloo): HF Trainer, Lightning, accelerate, TRL, TorchTitan, signals."""
