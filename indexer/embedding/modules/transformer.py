"""The Transformer module: the network itself, first in the folder, its settings in the folder's
own ``sentence_bert_config.json`` (``max_seq_length``, ``do_lower_case``). Only its settings are
read and saved here: the network runs in ``indexer.encoders`` (the one place torch and onnxruntime are
imported), and its ONNX export is ``indexer.encoders.onnx_export``'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from indexer.embedding.model_files import model_file, model_json
from indexer.embedding.modules.base import Listed, Reading

CONFIG = "sentence_bert_config.json"


@dataclass(frozen=True)
class Transformer:
    """The network's length and casing, as the folder says them."""

    max_length: int | None = None
    lowercase: bool = False

    @classmethod
    def read(cls, folder: Reading, listed: Listed) -> str | None:
        """First and once, at the folder's root (a network in a subfolder is another ``--model``)."""
        if folder.network:
            return f"{listed.where} is a second network, which semsearch cannot reproduce"
        if folder.pooling is not None or folder.modules:
            return listed.cannot()
        folder.network = True
        if listed.path:
            return f"{listed.where} lies in {listed.path}/: give --model with that folder"
        said = model_json(model_file(folder.location, CONFIG))
        config = said if isinstance(said, dict) else {}
        max_length = config.get("max_seq_length")
        folder.max_length = int(max_length) if max_length else None
        folder.lowercase = bool(config.get("do_lower_case"))
        if folder.lowercase:
            folder.said_last.append("lowercase")
        return None

    def save(self, folder: Path) -> None:
        """Its settings; the network itself is saved by transformers (``save_pretrained``)."""
        said = {"max_seq_length": self.max_length, "do_lower_case": self.lowercase}
        (folder / CONFIG).write_text(json.dumps(said), encoding="utf-8")
