"""`packer.torch.check_trainer` on TRL's own SFTTrainer (held for TRL 1.16, the installed
version): it passes the documented configuration, which then trains one step on CPU, and
refuses the two that train packer's rows without their boundaries and without a warning
(padding_free left False; packing=True without skip_prepare_dataset). The model is a tiny
random Llama built from a config and the tokenizer is trained here with `tokenizers`."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_samples, write_jsonl

import packer
from packer.export import export

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")
pytest.importorskip("tokenizers")

from packer.torch import (  # noqa: E402
    CheckTrainerCallback,
    TrainerCheckError,
    check_batch,
    check_trainer,
)
from packer.torch.tiny_model import build_tiny_model  # noqa: E402

pytestmark = pytest.mark.xdist_group("export")
L = 128
VOCAB = 1000  # make_samples' ids lie below it


def tiny_tokenizer():
    """A word-level tokenizer trained here: one word per token id, and pad/unk/EOS above them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words = " ".join(f"t{i}" for i in range(VOCAB))
    trainer = trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[EOS]"])
    tok.train_from_iterator([words], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]"
    )


@pytest.fixture(scope="module")
def trl_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("trainer")
    src = write_jsonl(root / "in.jsonl", make_samples(60, seed=1, median=20, max_len=60))
    packer.pack([src], root / "packed", packer.PackConfig(max_len=L))
    export(root / "packed", "trl", root / "trl")
    return root / "trl"


def make_trainer(path, tmp_path, **config):
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=2,
        max_steps=1,
        bf16=False,  # CPU
        report_to=[],
        save_strategy="no",
        **config,
    )
    model = build_tiny_model(vocab_size=VOCAB + 24, max_positions=4 * L).train()
    train = datasets.load_from_disk(str(path))
    return SFTTrainer(model, args=args, train_dataset=train, processing_class=tiny_tokenizer())


DOCUMENTED = dict(  # docs/export.md's recipe
    padding_free=True,
    max_length=None,
    dataset_kwargs={"skip_prepare_dataset": True},
    remove_unused_columns=False,
)


def test_the_documented_configuration_passes_and_trains(trl_export, tmp_path):
    trainer = make_trainer(trl_export, tmp_path, **DOCUMENTED)
    assert check_trainer(trainer) > 2  # samples in the batch, several per row
    result = trainer.train()
    assert trainer.state.global_step == 1 and math.isfinite(result.training_loss)


def test_padding_free_left_false_is_refused(trl_export, tmp_path):
    config = dict(DOCUMENTED, padding_free=False)
    trainer = make_trainer(trl_export, tmp_path, **config)
    with pytest.raises(TrainerCheckError, match=r"padding_free=False\).*Set padding_free=True"):
        check_trainer(trainer)


def test_packing_without_skip_prepare_is_refused(trl_export, tmp_path):
    trainer = make_trainer(
        trl_export, tmp_path, packing=True, max_length=4 * L, remove_unused_columns=False
    )
    with pytest.raises(TrainerCheckError, match=r"no sample_index column.*skip_prepare_dataset"):
        check_trainer(trainer)
    # against the export itself: TRL's positions restart only where a packer row starts
    original = datasets.load_from_disk(str(trl_export))
    with pytest.raises(TrainerCheckError, match=r"do not restart at packer's sample boundaries"):
        check_trainer(trainer, dataset=original)


def test_the_callback_stops_before_the_first_step(trl_export, tmp_path):
    trainer = make_trainer(trl_export, tmp_path, **dict(DOCUMENTED, padding_free=False))
    trainer.add_callback(CheckTrainerCallback())
    with pytest.raises(TrainerCheckError, match="padding_free"):
        trainer.train()
    assert trainer.state.global_step == 0
    trainer = make_trainer(trl_export, tmp_path, **DOCUMENTED)
    trainer.add_callback(CheckTrainerCallback())
    trainer.train()
    assert trainer.state.global_step == 1


class DropsPositions(torch.nn.Module):
    """A model call that loses position_ids (a wrapper forwarding only some keys): the batch is
    right, the forward lets samples attend to each other."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, **kwargs):
        return self.model(input_ids=input_ids, use_cache=False)


def test_the_model_check_catches_a_forward_that_merges_samples(trl_export, tmp_path):
    trainer = make_trainer(trl_export, tmp_path, **DOCUMENTED)
    batch = next(iter(trainer.get_train_dataloader()))
    ds = trainer.train_dataset
    assert check_batch(batch, ds, trainer.model) > 2
    with pytest.raises(TrainerCheckError, match="lets packed samples see each other"):
        check_batch(batch, ds, DropsPositions(trainer.model))


def test_trl_keys_this_test_holds_for(trl_export, tmp_path):
    """TRL 1.16's padding-free collator sends cu_seq_lens_q/k (earlier ones position_ids only;
    check_trainer reads position_ids, and without cu_seq_lens runs the model as it gets them)."""
    trainer = make_trainer(trl_export, tmp_path, **DOCUMENTED)
    batch = next(iter(trainer.get_train_dataloader()))
    assert "attention_mask" not in batch and "position_ids" in batch
    if tuple(int(x) for x in trl.__version__.split(".")[:2]) >= (1, 16):
        assert "cu_seq_lens_q" in batch
    older = {k: v for k, v in batch.items() if not k.startswith(("cu_seq_lens", "max_length"))}
    assert check_batch(older, trainer.train_dataset, trainer.model) > 2


@pytest.mark.parametrize("mode", ["flatten", "pad"])
def test_packers_own_collator_on_the_shards_passes(trl_export, tmp_path, mode):
    """docs/training.md's TRL configuration: packer's shards (load_hf_dataset) through
    collate_packed, TRL's padding_free off."""
    from functools import partial

    from trl import SFTConfig, SFTTrainer

    from packer.torch import collate_packed, load_hf_dataset

    args = SFTConfig(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=2,
        max_steps=1,
        bf16=False,
        report_to=[],
        remove_unused_columns=False,
        dataset_kwargs={"skip_prepare_dataset": True},
    )
    model = build_tiny_model(vocab_size=VOCAB + 24, max_positions=4 * L).train()
    trainer = SFTTrainer(
        model,
        args=args,
        train_dataset=load_hf_dataset(trl_export.parent / "packed"),
        processing_class=tiny_tokenizer(),
        data_collator=partial(collate_packed, mode=mode),
    )
    assert check_trainer(trainer) > 2


def test_rows_are_found_by_their_tokens_when_all_start_alike():
    """Every row starts with the same BOS id, one row is another's prefix, and the dataset is
    shuffled (an indices mapping): the batch's rows are still told apart."""
    bos = 5
    rows = [[bos, 7, 8, 9, bos, 3], [bos, 7, 8], [bos, 1, bos, 2, 2, 2, 2, 2], [bos] * 40]
    lengths = [[4, 2], [3], [2, 6], [20, 20]]
    ds = datasets.Dataset.from_dict(
        {"input_ids": rows, "seq_lengths": lengths, "sample_index": [[0]] * 4}
    ).shuffle(seed=3)
    order = [3, 0, 2]  # the batch: rows 3, 0 and 2 joined, then two pad tokens
    ids = [t for i in order for t in rows[i]] + [0, 0]
    pos = [p for i in order for n in lengths[i] for p in range(n)] + [0, 1]
    labels = [-100 if p == 0 else 1 for p in pos]
    batch = {
        "input_ids": torch.tensor([ids]),
        "position_ids": torch.tensor([pos]),
        "labels": torch.tensor([labels]),
    }
    assert check_batch(batch, ds) == 6
    wrong = dict(batch, position_ids=torch.tensor([list(range(40)) + pos[40:]]))
    with pytest.raises(TrainerCheckError, match="batch row 0, token 20: position 20"):
        check_batch(wrong, ds)
