"""What a sentence-transformers model folder says about how its authors embed with it: its
``modules.json`` walked in order, each module read by its kind (``indexer.embedding.modules``:
the network's length and casing, its pooling, the Dense and Normalize modules after it), and its
prompts. A module semsearch cannot reproduce is named (``FolderSays.refused``), so such a folder
is refused rather than read as something else.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from indexer.embedding.model_files import inside, model_file, model_json
from indexer.embedding.modules.base import Listed, Reading, kind
from indexer.embedding.modules.normalize import NORMALIZE
from indexer.embedding.strategy import FolderSays, Strategy
from indexer.errors import BadInput

PASSAGE_PROMPTS = ("document", "passage", "corpus")
"""The prompt names sentence-transformers' ``encode_document`` reads, in its order."""
TRAINED_FOR_CUTS = ("README.md", "config_sentence_transformers.json")
"""Where a model says it was trained for cut vectors (the word Matryoshka)."""
SAYS_WITHIN = 1 << 20
"""How much of each such file is read: a model card says its training near its start."""


def read_folder(location: str) -> FolderSays:
    """What the sentence-transformers files at ``location`` (a folder, or a cached hub model) say.
    A ``modules.json`` that lists no modules is refused, as sentence-transformers cannot run it;
    so is a module said to lie outside the folder, by its name or through a link: nothing
    outside it is read."""
    found = model_file(location, "modules.json")
    modules = model_json(found)
    if found is None:
        return FolderSays()
    if not isinstance(modules, list):
        return FolderSays(refused=f"its modules.json holds {json.dumps(modules)[:40]}, no list of modules")
    if not modules:
        return FolderSays(refused="its modules.json lists no modules")
    folder = Reading(location)
    for module in modules:
        if not isinstance(module, dict):
            return FolderSays(refused=f"its modules.json lists {str(module)[:40]!r}, not a module")
        name, path = str(module.get("type", "")), str(module.get("path", ""))
        if path and not _within(found.parent, path):
            named = f"module {module.get('name', '?')} ({name})"
            raise BadInput(f"{location}: its modules.json puts {named} at {path!r}, outside the model folder")
        listed = Listed(name, str(module.get("name", "?")), path, {})
        if not name.startswith("sentence_transformers."):
            return FolderSays(refused=f"{listed.where} is code of its own, which semsearch does not run")
        if path:
            listed = replace(listed, config=_object(model_json(model_file(location, f"{path}/config.json"))))
        reader = kind(name.rsplit(".", 1)[-1])
        refused = listed.cannot() if reader is None else reader.read(folder, listed)
        if refused:
            return FolderSays(refused=refused)
    if folder.pooling is None:
        return FolderSays(refused="its modules.json lists no Pooling module: it makes no sentence vector")
    while folder.modules and folder.modules[-1] == NORMALIZE:  # every vector is normalised at the end anyway
        folder.modules.pop()
    prompts = _prompts(_object(model_json(model_file(location, "config_sentence_transformers.json"))))
    said = [*folder.said, *folder.said_last]
    if any(prompts):
        said.append(f"prompts query {prompts[0]!r} passage {prompts[1]!r}")
    if folder.prompt_left_out and any(prompts):
        return FolderSays(refused="its pooling leaves its prompts out, which semsearch cannot")
    return FolderSays(
        folder.pooling,
        folder.max_length,
        tuple(folder.modules),
        folder.width,
        folder.lowercase,
        prompts,
        tuple(said),
    )


def cut_note(strategy: Strategy, location: str) -> str | None:
    """A line noting that ``--dimensions`` cuts the model at ``location`` though it does not say it
    was trained for cut vectors: sentence-transformers' truncation is meant for models trained with
    its MatryoshkaLoss, which their model card (``README.md``) names. None: no cut, a model that
    says so, or none found (its loader says why)."""
    if strategy.dimensions is None:
        return None
    if model_file(location, "config.json") is None:
        return None
    for name in TRAINED_FOR_CUTS:
        found = model_file(location, name)
        if (
            found is not None
            and "matryoshka" in found.read_bytes()[:SAYS_WITHIN].decode(errors="replace").lower()
        ):
            return None
    return (
        f"note: {strategy.model} does not say it was trained for cut vectors (Matryoshka, in its "
        f"README.md): --dimensions {strategy.dimensions} cuts it all the same"
    )


def _within(root: Path, path: str) -> bool:
    """Whether a module's folder stays inside the model folder ``root``: by its name, and where
    it is a link, by what the link leads to."""
    return inside(path) and (root / path).resolve().is_relative_to(root.resolve())


def _object(read: Any) -> dict[str, Any]:
    """A settings file's JSON object; an absent file, or one holding no object, says nothing."""
    return read if isinstance(read, dict) else {}


def _prompts(config: dict[str, Any]) -> tuple[str, str]:
    """The query and passage prompts as sentence-transformers' ``encode_query`` and
    ``encode_document`` read them: by name, else the default prompt, else none."""
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict):
        return "", ""
    default = prompts.get(config.get("default_prompt_name") or "", "")
    query = prompts.get("query", default)
    passage = next((prompts[n] for n in PASSAGE_PROMPTS if n in prompts), default)
    return str(query), str(passage)
