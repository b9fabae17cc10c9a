"""`check_trainer` as a Hugging Face `TrainerCallback` (imports transformers, so it is loaded
only when asked for: `packer.torch.CheckTrainerCallback`)."""

from __future__ import annotations

from transformers import TrainerCallback

from packer.torch.trainer_check import check_batch


class CheckTrainerCallback(TrainerCallback):
    """At `on_train_begin`, draw one batch from the trainer's train dataloader and check it as
    `check_trainer` does, against `dataset` (packer's TRL export; default: the loader's
    dataset), raising `TrainerCheckError` before the first step.

        trainer.add_callback(CheckTrainerCallback())
    """

    def __init__(self, dataset=None, *, model_check: bool = True, max_samples: int = 16):
        self.dataset, self.model_check, self.max_samples = dataset, model_check, max_samples

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        if train_dataloader is None:
            return
        dataset = self.dataset if self.dataset is not None else train_dataloader.dataset
        batch = next(iter(train_dataloader))
        model = model if self.model_check else None
        check_batch(batch, dataset, model, max_samples=self.max_samples)
