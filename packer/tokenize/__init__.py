"""Raw records (chats, texts, prompt/completion pairs) → input_ids and labels with checked
assistant masks. `records` reads one raw row, `template` finds the assistant turns in a chat's
render, `encode` tokenizes and checks, `loading` loads and hashes the tokenizer and template.
Imports transformers only when an `Encoder` is built."""

from packer.tokenize.encode import TRAIN_ON, Encoder
from packer.tokenize.loading import TokenizerError
from packer.tokenize.records import RawColumns, RawRecordError, Record, to_record
from packer.tokenize.template import TemplateError

__all__ = [
    "TRAIN_ON",
    "Encoder",
    "RawColumns",
    "RawRecordError",
    "Record",
    "TemplateError",
    "TokenizerError",
    "to_record",
]
