"""A tokenizer directory loaded twice in one process is loaded once, while its files stay the
same; a changed file loads it anew, so a second encoder never sees a stale vocabulary."""

import json
import os

from tokenizers_util import build_tokenizer

from packer.tokenize.encode import Encoder
from packer.tokenize.loading import load_tokenizer
from packer.tokenize.records import to_record


def test_the_same_directory_gives_the_same_tokenizer_until_a_file_changes(tmp_path):
    directory = build_tokenizer(tmp_path / "tok", None)
    first = load_tokenizer(str(directory))
    assert load_tokenizer(str(directory)) is first
    assert (
        first.backend_tokenizer.to_str()
        == load_tokenizer(str(directory)).backend_tokenizer.to_str()
    )

    config = directory / "tokenizer_config.json"
    data = json.loads(config.read_text())
    data["model_max_length"] = 12345
    config.write_text(json.dumps(data))
    os.utime(config, ns=(1, 1))  # a new mtime, whatever the clock's resolution
    again = load_tokenizer(str(directory))
    assert again is not first
    assert again.model_max_length == 12345


def test_encoders_of_one_tokenizer_give_the_ids_of_a_fresh_load(tmp_path):
    directory = build_tokenizer(tmp_path / "tok", None)
    row = {"text": "hello world, again and again"}
    first = Encoder(str(directory)).encode_batch([to_record(row)])
    second = Encoder(str(directory)).encode_batch([to_record(row)])
    assert [list(map(list, s)) for s in first] == [list(map(list, s)) for s in second]
