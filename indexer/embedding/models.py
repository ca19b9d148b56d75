"""Finding, identifying and loading a model: the bundled default, a local directory or a Hugging
Face name (``indexer.embedding.hub``: the cache first, else downloaded, then read as a folder);
and resolving a strategy request against what the model says about itself.

Every load reads a folder (``local_files_only``): what the Hub holds is fetched before, by one
function (``model_location``), never by transformers. A model is identified by a fingerprint of its
files, not by where it lies, so the same model at another path (another cwd, another machine, the
cache) is the same.
"""

from __future__ import annotations

import logging
import pickle
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from indexer.embedding.config_checks import SHAPE_KEYS, check_settings, config_shape, is_count
from indexer.embedding.fingerprints import changed_files, model_fingerprint
from indexer.embedding.folder import read_folder
from indexer.embedding.hub import fetched, hub_name
from indexer.embedding.hub import model_location as model_location  # where every loader finds a model
from indexer.embedding.model_files import check_link, model_file, model_json
from indexer.embedding.model_files import read_json as read_json  # the encoders read JSON files through here
from indexer.embedding.strategy import AUTO, DEFAULT_MODEL, FolderSays, Strategy
from indexer.embedding.weights import tensor_shapes, torch_alone_reads
from indexer.errors import BadInput, StrategyConflict

SIZES = (*SHAPE_KEYS["num_hidden_layers"], *SHAPE_KEYS["hidden_size"], "max_position_embeddings")
"""The sizes of a ``config.json`` that ``check_model`` holds against its weights."""
WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
"""The files transformers loads a model's weights from, in the order it prefers them (an
``.index.json`` maps the weights to the files, shards, that hold them)."""
BLOCK = re.compile(r"(?:^|\.)layers?\.(\d+)\.")
"""A weight of transformer block N: ``encoder.layer.N.`` (BERT's family), ``transformer.layer.N.``
(DistilBERT), ``layers.N.`` (ModernBERT). ALBERT's one shared block is numbered otherwise."""
SHARED_BLOCK_MOST = 128
"""The most layers a config.json may say where its weights hold one block run again and again
(ALBERT): they cannot contradict the count, and a million runs of it would not end."""


ENCODERS = (
    "bert",
    "roberta",
    "xlm-roberta",
    "camembert",
    "distilbert",
    "mpnet",
    "deberta-v2",
    "electra",
    "albert",
    "modernbert",
)
"""The encoder architectures (``model_type``) semsearch reads, each checked against
sentence-transformers (``tests/test_reference.py``)."""
DECODERS = ("qwen2", "qwen3", "mistral", "llama", "gemma2", "gemma3_text")
"""The decoder embedders semsearch reads (Qwen3-Embedding, e5-mistral, EmbeddingGemma's
bidirectional Gemma 3...), each checked against sentence-transformers (``tests/test_decoders.py``):
their rotary positions make a text's vectors the same whichever side it is padded on, so they run
through the one right-padded loop. Anything neither here nor in ``ENCODERS`` is refused before
anything is written."""


def is_local(model: str) -> bool:
    """A model given as a directory (not the bundled name, not a Hugging Face id)."""
    return model != DEFAULT_MODEL and Path(model).is_dir()


TRUST_FLAG = "--trust-remote-code"
"""The option that lets a model's own code run (``EmbeddingOptions.trust_remote_code``)."""


def check_encoder(model: str, config: Mapping[str, Any], *, trusted: bool = False) -> None:
    """Refuse, in one line, a model semsearch does not read: one that needs code of its own
    unless ``trusted`` (semsearch runs none it downloads unless told), an encoder-decoder, or an
    architecture it does not know (a model with its own code defines its own)."""
    kind = str(config.get("model_type", ""))
    if config.get("auto_map") and not trusted:
        raise BadInput(
            f"model {model!r} needs code of its own (auto_map in its config.json), and semsearch runs "
            f"no downloaded code unless told: give {TRUST_FLAG} if you trust it, or choose a model of "
            "a supported architecture (docs/models.md)"
        )
    if config.get("is_encoder_decoder"):
        raise BadInput(f"model {model!r} is an encoder-decoder ({kind}): semsearch reads encoders only")
    if config.get("auto_map"):
        return
    if kind not in ENCODERS + DECODERS:
        raise BadInput(
            f"model {model!r} is a {kind or 'model of no model_type'}, not an architecture semsearch reads "
            f"({', '.join(ENCODERS + DECODERS)})"
        )


def identified(strategy: Strategy) -> Strategy:
    """The strategy with its model located and fingerprinted: a local one by its absolute path, a
    Hugging Face name by the commit it was fetched at (``NAME@COMMIT``: cache first, else
    downloaded); the bundled one as it is. A strategy that already names a fingerprint (a stored
    one) must still find that model there, checked before anything loads it: a model whose code
    changed is refused before that code runs."""
    if hub_name(strategy.model) is not None:
        snapshot = fetched(strategy.model)
        model, location = snapshot.pinned, snapshot.folder
    elif is_local(strategy.model):
        model = location = str(Path(strategy.model).resolve())
    else:
        return strategy
    found = model_fingerprint(location)
    if strategy.model_fingerprint not in (None, found):
        changed = ", ".join(changed_files(strategy.model_fingerprint, location)) or "its files"
        raise StrategyConflict(
            f"the model at {location} has changed since these vectors were made ({changed}: "
            f"{strategy.model_fingerprint[:19]}, now {found[:19]}): rebuild the index with it"
        )
    return replace(strategy, model=model, model_fingerprint=found)


@dataclass(frozen=True)
class ModelFacts:
    """What a model says about itself that an ``auto`` strategy field resolves from."""

    num_layers: int
    hidden_size: int
    limit: int
    folder: FolderSays
    """What its sentence-transformers folder says (``read_folder``)."""
    own_code: bool = False
    """Its ``config.json`` names code of its own (``auto_map``)."""

    @classmethod
    def of(cls, config: Any, tokenizer_limit: int | float, location: str) -> ModelFacts:
        return cls(
            int(config.num_hidden_layers),
            int(config.hidden_size),
            int(min(int(getattr(config, "max_position_embeddings", 512) or 512), tokenizer_limit)),
            read_folder(location),
            bool(getattr(config, "auto_map", None)),
        )


def model_facts(model: str, *, trusted: bool = False) -> ModelFacts:
    """The facts from the model's config files alone (no weights loaded). ``trusted``: a model's
    own code may run (``check_encoder``)."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    quiet_transformers()
    location = model_location(model, download=True)
    check_model(model, location, trusted=trusted)
    try:
        config = AutoConfig.from_pretrained(location, local_files_only=True, trust_remote_code=trusted)
    except (OSError, ValueError, KeyError, StrictDataclassError) as exc:
        raise unloadable(model, location, exc) from None
    return ModelFacts.of(config, tokenizer_limit(location), location)


def model_facts_from_files(model: str, *, trusted: bool = False) -> ModelFacts | None:
    """``model_facts`` from the JSON files alone (no transformers import: the torch-free indexing
    path), or None when ``config.json`` does not say them plainly."""
    from types import SimpleNamespace

    location = model_location(model, download=True)
    config = check_model(model, location, trusted=trusted)
    shape = config_shape(config or {})
    if config is None or shape is None:
        return None
    sizes = dict(zip(SHAPE_KEYS, shape, strict=True))
    return ModelFacts.of(SimpleNamespace(**{**config, **sizes}), tokenizer_limit(location), location)


def tokenizer_limit(location: str) -> int | float:
    """The longest input the tokenizer's ``tokenizer_config.json`` allows (``model_max_length``),
    or no limit where it says none."""
    said = model_json(model_file(location, "tokenizer_config.json"))
    limit = said.get("model_max_length") if isinstance(said, dict) else None
    return limit if is_count(limit) else float("inf")


def resolve_strategy(
    request: Strategy, facts: ModelFacts | None = None, *, trusted: bool = False
) -> Strategy:
    """The strategy a request means on its model: ``auto`` filled in, ranges checked, the model
    located and identified, whether it runs code of its own recorded (``remote_code``). Two
    requests ask for the same strategy when their resolutions show no ``Strategy.differences``."""
    located = identified(request)
    facts = facts or model_facts(located.model, trusted=trusted)
    if facts.folder.refused and not located.resolved:
        raise BadInput(
            f"model {located.model!r} cannot be read as its authors saved it: {facts.folder.refused}"
        )
    resolved = located.resolve(num_layers=facts.num_layers, model_limit=facts.limit, folder=facts.folder)
    full = resolved.full_dimension(facts.hidden_size)
    if resolved.dimensions is not None and resolved.dimensions > full:
        raise BadInput(f"dimensions {resolved.dimensions} exceeds this model's {full}: give at most {full}")
    return replace(resolved, remote_code=facts.own_code)


SAVED_STRATEGY = "semsearch.json"
"""The file of a model directory ``semsearch tune`` wrote that keeps the strategy it trained through."""
TRAINED = ("layers", "combine", "pooling", "skip_special")
"""The fields a tuned model was trained through: an option that reads it otherwise contradicts it.
Its other saved fields (length, normalising, post-processing, backend) are defaults an option may change."""


def strategy_request(asked: Mapping[str, Any]) -> tuple[Strategy, str | None]:
    """The strategy the options ``asked`` (only those given) ask for. A model directory with a
    saved strategy gives its fields as the defaults, so ``--model TUNED`` alone reads the model
    as it was tuned; an option contradicting a trained field is a ``StrategyConflict`` naming
    both. Returns the strategy and, when the saved one is used, the line that says so."""
    asked = {k: v for k, v in asked.items() if not (k == "pooling" and v == AUTO)}
    model = asked.get("model", DEFAULT_MODEL)
    saved = _saved_strategy(model)
    if saved is None:
        return Strategy(**asked), None
    strategy, blocks = saved
    for name in TRAINED:
        if name in asked and _trained_value(name, asked[name], blocks) != _trained_value(
            name, getattr(strategy, name), blocks
        ):
            raise StrategyConflict(
                f"{_option(name, asked[name], blocks)} contradicts the model {model}, tuned with "
                f"{_said(name, getattr(strategy, name), blocks)}: drop the option to read it as it was tuned"
            )
    # whether it runs code of its own is the model's to say (check_encoder): no index is asking
    chosen = replace(strategy, remote_code=False, **{k: v for k, v in asked.items() if k not in TRAINED})
    trained = [_said("layers", strategy.layers, blocks)]
    if strategy.layers and len(strategy.layers) > 1:
        trained.append(strategy.combine)
    trained.append(_said("pooling", strategy.pooling, blocks))
    if strategy.skip_special:
        trained.append(_said("skip_special", True, blocks))
    return chosen, "using the strategy saved with the model: " + ", ".join(trained)


def _saved_strategy(model: str) -> tuple[Strategy, int] | None:
    """A local model directory's saved strategy and its count of transformer blocks, or None."""
    if not is_local(model):
        return None
    saved = model_json(model_file(model, SAVED_STRATEGY))
    if not isinstance(saved, dict) or not isinstance(saved.get("strategy"), dict):
        return None
    config = model_json(model_file(model, "config.json"))
    shape = config_shape(config) if isinstance(config, dict) else None
    if shape is None:
        return None
    return Strategy.from_dict({**saved["strategy"], "model": model}), shape[0]


def _trained_value(name: str, value: Any, blocks: int) -> Any:
    """Layers counted from the end (hidden states 0..blocks), so -2,-1 and 1,-1 of two blocks agree."""
    if name == "layers" and value is not None:
        return tuple(i - (blocks + 1) if i >= 0 else i for i in value)
    return value


def _said(name: str, value: Any, blocks: int) -> str:
    if name == "layers":
        return "layers " + ",".join(str(i) for i in _trained_value(name, value, blocks))
    if name == "pooling":
        return f"{value} pooling"
    if name == "skip_special":
        return "skip-special" if value else "keep-special"
    return str(value)


def _option(name: str, value: Any, blocks: int) -> str:
    if name == "skip_special":
        return "--skip-special" if value else "--keep-special"
    if name == "layers":
        return "--layers " + ",".join(str(i) for i in value)
    return f"--{name.replace('_', '-')} {value}"


def quiet_transformers() -> None:
    """transformers and the hub under it say nothing but errors: a load's refusals are ours to word."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="transformers")




def check_model(model: str, location: str, *, trusted: bool = False) -> dict[str, Any] | None:
    """The model's ``config.json``, checked before transformers or the ONNX path read anything:
    ``check_encoder`` (transformers would ask on the terminal whether to run a model's own code),
    its attention heads, window and soft caps (``check_settings``), its sizes against its weights
    (``check_sizes``). A folder that is a link leading nowhere, or a config.json that is no JSON
    object, is refused naming it; a model not on disk (None) is left to the loader's message
    (``unloadable``)."""
    check_link(Path(location))
    config = model_json(model_file(location, "config.json"))
    if config is None:
        return None
    if not isinstance(config, dict):
        raise BadInput(f"cannot load model {model!r}: its config.json holds no JSON object")
    check_encoder(model, config, trusted=trusted)
    check_settings(model, config)
    check_sizes(model, location, config)
    return config


def weight_files(location: str) -> list[Path]:
    """The files the model's weights lie in, as transformers chooses them (``WEIGHTS``)."""
    for name in WEIGHTS:
        found = model_file(location, name)
        if found is None:
            continue
        if not name.endswith(".index.json"):
            return [found]
        index = model_json(found)
        shards = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(shards, dict):
            raise BadInput(f"{found} maps no weights to the files that hold them (weight_map)")
        held = [model_file(location, shard) for shard in sorted(set(map(str, shards.values())))]
        return [shard for shard in held if shard is not None]
    return []


def check_sizes(model: str, location: str, config: Mapping[str, Any]) -> None:
    """Refuse a ``config.json`` whose sizes its weights contradict, from the weights' headers
    (``tensor_shapes``, no tensor read) before anything is built: a network of a million layers
    would be built for minutes before transformers finds no weights for it. Its block count is
    the blocks the weights number, its width that of a square matrix among them, its position
    count the rows of their position table."""

    def contradicted(key: str, why: str) -> BadInput:
        return BadInput(f"cannot load model {model!r}: config.json says {key} {config[key]!r}, {why}")

    for key in SIZES:
        if key in config and not is_count(config[key]):
            raise contradicted(key, "not a count")
    files = [file for file in weight_files(location) if not torch_alone_reads(file)]
    shapes = {name: shape for file in files for name, shape in tensor_shapes(file).items()}
    shape = config_shape(config)
    if not shapes or shape is None:
        return
    layers_key, hidden_key = (next(k for k in keys if k in config) for keys in SHAPE_KEYS.values())
    (layers, hidden), held = shape, files[0].name if len(files) == 1 else f"its {len(files)} weight files"
    blocks = {int(found[1]) for name in shapes if (found := BLOCK.search(name))}
    if blocks and blocks != set(range(layers)):
        numbered = f"numbered {min(blocks)} to {max(blocks)}"
        raise contradicted(layers_key, f"but {held} holds {len(blocks)} ({numbered})")
    if not blocks and layers > SHARED_BLOCK_MOST:
        raise contradicted(layers_key, f"runs of one shared block: more than {SHARED_BLOCK_MOST}")
    table = any(name.endswith("embed_tokens.weight") and t[1:] == (hidden,) for name, t in shapes.items())
    if (hidden, hidden) not in shapes.values() and not table:  # a decoder's token table says its width
        raise contradicted(hidden_key, f"but {held} holds no {hidden}x{hidden} matrix")
    positions = config.get("max_position_embeddings")
    tables = {name: t[0] for name, t in shapes.items() if name.endswith("position_embeddings.weight") and t}
    for name, rows in tables.items():
        if positions is not None and rows != positions:
            raise contradicted("max_position_embeddings", f"but {held} holds {rows} ({name})")


def unloadable(model: str, location: str, error: BaseException) -> BadInput:
    """Why a model cannot load from its folder. One that is not on this machine at all gets how to
    bring it; one whose files are there but unreadable gets the loader's reason."""
    missing = model_file(location, "config.json") is None
    if missing and (model.startswith(("/", ".", "~")) or model.count("/") > 1):  # a path, not a name
        return BadInput(f"cannot load model {model!r}: no model directory there (config.json, weights)")
    if missing:
        from huggingface_hub import constants

        return BadInput(
            f"cannot load model {model!r}: it is neither a local directory nor a model in the Hugging Face "
            f"cache ({constants.HF_HUB_CACHE}). Give a local directory "
            f"holding the model (--model ./my-model), or on a machine with internet run "
            f"`HF_HOME=DIR hf download {model}` and copy DIR to this machine's HF_HOME"
        )
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    if type(error).__name__.startswith("StrictDataclass"):  # a config.json value of a type it refuses
        said = lines[-1][:200]
        return BadInput(f"cannot load model {model!r}: transformers refuses its config.json: {said}")
    first = lines[0]
    return BadInput(f"cannot load model {model!r} offline: {first}")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
"""The JSON files transformers reads a tokenizer from."""


FEATURES, CLASSIFIER = "feature-extraction", "sequence-classification"
TASKS = {FEATURES: ("AutoModel", "model"), CLASSIFIER: ("AutoModelForSequenceClassification", "reranker")}
"""A network's task (sentence-transformers' ``transformer_task``) -> transformers' class that loads
it and what a refusal calls it: a sentence encoder's hidden states, a reranker's one logit."""


def load_model(
    model: str, *, need_pooler: bool = False, trusted: bool = False, task: str = FEATURES
) -> tuple[Any, Any]:
    """Tokenizer and eval-mode network for ``task`` (``TASKS``), from disk only; a clear error
    when that is impossible. ``trusted``: the model's own code runs, as transformers'
    ``trust_remote_code`` runs it."""
    import transformers
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoTokenizer

    quiet_transformers()
    auto, what = TASKS[task]
    location = model_location(model, download=True)
    check_model(model, location, trusted=trusted)
    for name in TOKENIZER_FILES:  # transformers reads them with json.load, unguarded
        model_json(model_file(location, name))
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=True, trust_remote_code=trusted)
    except (OSError, ValueError, KeyError, StrictDataclassError) as exc:
        raise unloadable(model, location, exc) from None
    held = ", ".join(file.name for file in weight_files(location))
    try:
        network, info = getattr(transformers, auto).from_pretrained(
            location,
            local_files_only=True,
            output_loading_info=True,
            trust_remote_code=trusted,
            dtype="float32",  # the fp32 reference (transformers 5 keeps a decoder's bf16 weights as they are)
        )
    except (OSError, ValueError, KeyError, StrictDataclassError) as exc:
        raise unloadable(model, location, exc) from None
    except RuntimeError:  # a size at odds with config.json that check_sizes does not compare
        said = f"its weights ({held}) do not fit the network its config.json describes"
        raise BadInput(f"cannot load {what} {model!r}: {said}") from None
    except pickle.UnpicklingError:  # torch's weights_only refusal, whose advice is to run the file
        raise BadInput(f"cannot load {what} {model!r}: {held} holds more than tensors: not loaded") from None
    if not getattr(tokenizer, "is_fast", False):
        raise BadInput(f"model {model!r} has no fast tokenizer (tokenizer.json); not supported")
    if need_pooler and any("pooler" in key for key in info.get("missing_keys", [])):
        raise BadInput(f"model {model!r} has no trained pooler weights: choose another pooling")
    return tokenizer, network.eval()
