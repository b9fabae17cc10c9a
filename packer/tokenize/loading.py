"""Loading a tokenizer and a chat template, and hashing what was loaded.

A tokenizer is a local directory (the `save_pretrained` layout) or a hub name; a local
directory never touches the network, and a hub name that cannot be fetched fails in one line.
The digests cover the bytes that decide the ids (the tokenizer's files, the template's text),
never the paths, so a copied tokenizer directory hashes the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from packer.errors import UsageError, option
from packer.tokenize.template import TemplateError, one_line

# the files of a tokenizer directory that can change the ids (weights and the like are not read)
TOKENIZER_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken")
LOCAL_PREFIXES = ("/", "./", "../", "~")


class TokenizerError(UsageError):
    """A tokenizer that cannot be loaded or used (exit 2); the message names the option."""


def load_tokenizer(source: str):
    """A fast 🤗 tokenizer from a local directory or a hub name."""
    name = option("tokenizer")
    if not isinstance(source, (str, os.PathLike)) or not str(source):
        raise TokenizerError(f"{name} must be a directory or a hub name, got {source!r}")
    source = str(source)
    local = Path(source).expanduser()
    if not local.is_dir() and (local.exists() or source.startswith(LOCAL_PREFIXES)):
        raise TokenizerError(f"{name}: {source} is not a directory")
    try:
        import transformers  # noqa: F401  (lazy: loads a tokenizer class only when used)
    except ImportError:
        raise TokenizerError(
            f"{name}: tokenizing needs transformers (pip install transformers)"
        ) from None
    if local.is_dir() and not any(
        (local / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")
    ):
        raise TokenizerError(
            f"{name}: {source} holds no tokenizer (no tokenizer.json or tokenizer_config.json: "
            "a directory that save_pretrained wrote)"
        )
    unreachable = None if local.is_dir() else hub_unreachable()
    try:
        if local.is_dir():
            if generic_directory(local):
                from transformers import PreTrainedTokenizerFast as loader
            else:
                from transformers import AutoTokenizer as loader
            tokenizer = loader.from_pretrained(local, local_files_only=True)
        else:  # the hub's local cache only, where the hub cannot be reached
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=bool(unreachable))
    except Exception as e:  # OSError for a missing file or an unreachable hub, ValueError, ...
        if local.is_dir():
            raise TokenizerError(f"{name}: cannot load {source}: {one_line(e)}") from None
        reason = f"the hub is unreachable ({unreachable})" if unreachable else one_line(e)
        raise TokenizerError(
            f"{name}: {source} is not a local directory and cannot be loaded from the Hugging "
            f"Face hub: {reason}"
        ) from None
    if not getattr(tokenizer, "is_fast", False):
        raise TokenizerError(f"{name}: {source} has no fast tokenizer (tokenizer.json)")
    if tokenizer.eos_token_id is None:
        raise TokenizerError(f"{name}: {source} has no eos_token, which ends every sample")
    return tokenizer


GENERIC_CLASSES = (None, "PreTrainedTokenizerFast", "TokenizersBackend")


def generic_directory(directory: Path) -> bool:
    """Whether AutoTokenizer would load the directory as `PreTrainedTokenizerFast`: a
    `tokenizer.json` with no model `config.json`, no custom code and a generic class. Such a
    directory is loaded by that class directly, since `AutoTokenizer` reads model configs and
    imports torch: about 3 CPU seconds in every worker process."""
    if not (directory / "tokenizer.json").is_file() or (directory / "config.json").exists():
        return False
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False  # AutoTokenizer says what is wrong with it
    return (
        isinstance(config, dict)
        and "auto_map" not in config
        and config.get("tokenizer_class") in GENERIC_CLASSES
    )


def hub_unreachable() -> str | None:
    """Why the hub cannot be reached (then only its local cache is used), or None. Without
    this, an offline machine waits out the hub client's retries (about a minute, printing a
    line per retry) before failing. Behind a proxy, or with HF_HUB_OFFLINE, nothing is tried."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    proxied = any(
        os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
    )
    if constants.HF_HUB_OFFLINE or proxied:
        return None
    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=5).close()
    except OSError as e:
        return f"{url.hostname}:{port}: {getattr(e, 'strerror', None) or e}"
    return None


def tokenizer_digest(source: str, tokenizer) -> str:
    """sha256 over the names and bytes of the tokenizer's files: the directory's, or for a hub
    name, the files `save_pretrained` writes."""
    local = Path(str(source)).expanduser()
    if local.is_dir():
        return files_digest(local)
    with tempfile.TemporaryDirectory(prefix="packer-tokenizer-") as tmp:
        tokenizer.save_pretrained(tmp)
        return files_digest(Path(tmp))


def files_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name.endswith(TOKENIZER_SUFFIXES):
            if path.name.endswith(".index.json"):  # a weights index
                continue
            digest.update(path.name.encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def read_template(path) -> str:
    """A template file's text: a Jinja file, or a JSON file with a `chat_template` key (the
    `chat_template.json` layout)."""
    name = option("chat_template")
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or one_line(e)
        raise TemplateError(f"{name}: cannot read {path}: {reason}", usage=True) from None
    if str(path).endswith(".json"):
        try:
            text = json.loads(text)["chat_template"]
        except (ValueError, KeyError, TypeError):
            raise TemplateError(
                f"{name}: {path} is not a JSON object with a chat_template string", usage=True
            ) from None
    if not isinstance(text, str) or not text.strip():
        raise TemplateError(f"{name}: {path} is empty", usage=True)
    return text


def tokenizer_template(tokenizer) -> str | None:
    """The tokenizer's own template (a dict of named templates: the default one)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    return template or None


def text_digest(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()
