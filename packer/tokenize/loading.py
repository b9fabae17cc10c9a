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
from contextlib import contextmanager
from pathlib import Path

from packer.errors import UsageError, option
from packer.tokenize.template import TemplateError, one_line

# the files of a tokenizer directory that can change the ids (weights and the like are not read)
TOKENIZER_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken")
LOCAL_PREFIXES = ("/", "./", "../", "~")


class TokenizerError(UsageError):
    """A tokenizer that cannot be loaded or used (exit 2); the message names the option."""


_LOADED: dict = {}  # (directory, its files' sizes and mtimes) -> tokenizer, the last few
_KEEP = 4


def load_tokenizer(source: str):
    """A fast 🤗 tokenizer from a local directory or a hub name.

    A local directory loaded before in this process, with the same files (names, sizes, mtimes),
    gives the same tokenizer object again: a caller building several encoders of one tokenizer
    (`pack_dataset` per split, verify's re-tokenizing, a test matrix) loads it once (1 to 3 s for
    a 128k-262k vocabulary). packer never changes a loaded tokenizer."""
    local = Path(str(source)).expanduser() if isinstance(source, (str, os.PathLike)) else None
    key = _stamp(local) if local is not None and local.is_dir() else None
    if key is not None and key in _LOADED:
        return _LOADED[key]
    tokenizer = _load(source)
    if key is not None:
        _LOADED[key] = tokenizer
        while len(_LOADED) > _KEEP:
            _LOADED.pop(next(iter(_LOADED)))
    return tokenizer


def _stamp(directory: Path) -> tuple:
    files = sorted(p for p in directory.iterdir() if p.is_file())
    return (str(directory.resolve()),) + tuple(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files
    )


def _load(source: str):
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

            with quiet_hub():
                tokenizer = AutoTokenizer.from_pretrained(
                    source, local_files_only=bool(unreachable)
                )
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


@contextmanager
def quiet_hub():
    """The hub client's warnings (a line per retry of a request) kept off stderr while a hub
    name loads: its failure becomes packer's one error line."""
    import logging

    hub = logging.getLogger("huggingface_hub")
    before = hub.level
    hub.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub.setLevel(before)


# how long the hub may take to answer the first probe (a connection, or a proxy's answer to
# CONNECT) before a hub name is looked up in the local cache only
HUB_PROBE_SECONDS = 3.0


def hub_unreachable() -> str | None:
    """Why the hub cannot be reached (then only its local cache is used), or None. Without
    this, an offline machine, or one whose proxy refuses or never answers, waits out the hub
    client's retries (about a minute, printing a line per retry) before failing. The probe goes
    the way the client's requests go: through the proxy the environment names for the hub's
    address (HTTPS_PROXY, ALL_PROXY, NO_PROXY), or straight to it. With HF_HUB_OFFLINE nothing
    is tried."""
    import time
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return None
    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    deadline = time.monotonic() + HUB_PROBE_SECONDS
    proxy = _proxy_for(url.scheme, url.hostname)
    try:
        if proxy is None:
            _connect(url.hostname, port, deadline).close()
        else:
            _through_proxy(proxy, url.scheme, f"{url.hostname}:{port}", deadline)
    except OSError as e:
        where = f"{url.hostname}:{port}" if proxy is None else f"the proxy {_shown(proxy)}"
        if isinstance(e, TimeoutError):
            return f"{where}: no answer in {HUB_PROBE_SECONDS:g} s"
        return f"{where}: {getattr(e, 'strerror', None) or e}"
    return None


def _proxy_for(scheme: str, host: str | None) -> str | None:
    """The proxy URL the environment names for `scheme://host`, as the hub's HTTP client reads
    it: `<scheme>_proxy`, else `all_proxy`, unless NO_PROXY covers the host."""
    import urllib.request

    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(scheme) or proxies.get("all")
    if not proxy or (host and urllib.request.proxy_bypass_environment(host, proxies)):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def _shown(proxy: str) -> str:
    """A proxy URL without its credentials, for a message."""
    from urllib.parse import urlsplit

    parts = urlsplit(proxy)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def _connect(host, port: int, deadline: float):
    import socket
    import time

    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return socket.create_connection((host, port), timeout=left)


def _through_proxy(proxy: str, scheme: str, target: str, deadline: float) -> None:
    """Ask an HTTP(S) proxy for `target` as the hub client would (CONNECT for an https hub, a
    HEAD of its root for an http one) and read the status line. An answer that the client would
    wait out or fail on (a CONNECT refused, a 407, a 5xx of a proxy that cannot reach the hub)
    is raised as an OSError. A SOCKS proxy is only connected to."""
    import base64
    import ssl
    import time
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(proxy)
    kind = parts.scheme.lower()
    port = parts.port or {"https": 443, "http": 80}.get(kind, 1080)
    sock = _connect(parts.hostname, port, deadline)
    try:
        if not kind.startswith("http"):
            return
        if kind == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=parts.hostname)
        tunnel = scheme == "https"
        asked = f"CONNECT {target}" if tunnel else f"HEAD http://{target}/"
        request = f"{asked} HTTP/1.1\r\nHost: {target}\r\n"
        if parts.username is not None:
            user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            request += f"Proxy-Authorization: Basic {base64.b64encode(user.encode()).decode()}\r\n"
        sock.sendall((request + "\r\n").encode("latin-1"))
        answer = b""
        while b"\r\n" not in answer and len(answer) < 4096:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = sock.recv(4096)  # TimeoutError at the deadline
            if not chunk:
                raise ConnectionResetError("closed the connection without an answer")
            answer += chunk
        status = answer.split(b"\r\n", 1)[0].decode("latin-1").strip()
        fields = status.split(" ", 2)
        code = fields[1] if len(fields) > 1 and fields[0].startswith("HTTP/") else ""
        failed = code.startswith("5") or code == "407" or (tunnel and not code.startswith("2"))
        if not code.isdigit() or failed:
            raise OSError(f"answered {status!r} to {asked}")
    finally:
        sock.close()


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
