"""Where the network runs (``--device``, ``--precision``) and the torch embedding loop a GPU runs,
exercised on the CPU: refusing a GPU that is not there before anything is written, token-budget
batches, the same vectors as the ONNX path, half precision through the same code, and ``info``
saying where an index's vectors were made."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from indexer.embedding.batching import Batching
from indexer.embedding.strategy import Strategy
from indexer.encoders.devices import Placement, placement
from indexer.encoders.options import EmbeddingOptions
from indexer.errors import BadInput
from tests.helpers import assert_clean_failure, graph_encoder, real_sentences, run

torch = pytest.importorskip("torch")
NO_GPU = not torch.cuda.is_available()


def test_placements_resolve_and_refuse_what_this_machine_cannot_do():
    assert placement("cpu") == Placement("cpu", "fp32")
    assert placement(None, None) == (placement("cuda") if not NO_GPU else Placement("cpu", "fp32"))
    assert placement(" CPU ", "fp32") == Placement("cpu", "fp32")
    for device, precision, message in [
        ("gpu", "auto", "--device: give auto, cpu, cuda or cuda:N"),
        ("cuda:x", "auto", "--device: give auto, cpu, cuda or cuda:N"),
        ("cpu", "fp16", "runs on a GPU only"),
        ("cpu", "int4", "choose one of"),
    ]:
        with pytest.raises(BadInput, match=message):
            placement(device, precision)


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_cuda_where_there_is_none_is_one_clear_error():
    for device in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(BadInput, match="torch sees no CUDA GPU"):
            placement(device)


def test_batches_keep_the_token_budget_and_cover_every_piece_once():
    lengths = np.array([3, 40, 7, 7, 128, 1, 64, 9, 0, 12] * 30)
    batching = Batching(rows=16, tokens=256)
    plan = batching.plan(lengths)
    seen = np.concatenate(plan)
    assert sorted(seen.tolist()) == list(range(len(lengths)))
    for rows in plan:
        width = lengths[rows].max()
        assert len(rows) <= 16
        assert len(rows) == 1 or len(rows) * width <= 256
    assert lengths[plan[0]].max() == lengths.max()  # the longest pass first: too large fails at once
    # a GPU batches thousands of short texts at once, the CPU its batch size
    assert Batching.on(False, 32).plan(np.full(5000, 16)).__len__() == 2
    # a pass's cost on the CPU (torch's, and ONNX Runtime's with a cheap model) is worth many
    # short texts: they share passes by a token budget, while texts of a whole window (256
    # tokens) keep the batch size
    on_torch = Batching.on(True, 32, runtime="torch")
    assert len(on_torch.plan(np.full(4096, 16))) == 8
    assert [len(rows) for rows in on_torch.plan(np.full(64, 256))] == [32, 32]
    on_onnx = Batching.on(True, 32)
    assert [len(rows) for rows in on_onnx.plan(np.full(1024, 16))] == [512, 512]
    assert [len(rows) for rows in on_onnx.plan(np.full(64, 256))] == [32, 32]
    assert all(len(rows) * 512 <= on_onnx.tokens for rows in on_onnx.plan(np.full(100, 512)))


def test_a_pass_pads_no_short_text_to_a_long_one():
    """One rule plans every loop's passes from token counts: short and long texts go in passes of
    their own, like lengths share one."""
    lengths = [200, 5, 203, 6, 7, 202, 5, 204]
    plan = Batching.on(True, 32).plan(lengths)
    assert sorted(sorted(np.asarray(lengths)[rows].tolist()) for rows in plan) == [
        [5, 5, 6, 7],
        [200, 202, 203, 204],
    ]
    assert len(Batching.on(True, 32).plan([30, 31, 29, 32])) == 1


@pytest.mark.slow
def test_the_device_loop_gives_the_onnx_vectors_and_half_precision_stays_close():
    from indexer.encoders.factory import encoder_for, torch_encoder

    sentences = real_sentences()[:60]
    texts = [*sentences, "?", "word " * 700]  # one of a single token, one past max_length
    for strategy in (
        Strategy(),
        Strategy(layers=(-3, -2, -1), combine="concat", pooling="max", skip_special=True),
        Strategy(chunk_overlap=8, max_length=32),
    ):
        today = encoder_for(strategy)  # the ONNX graph: today's vectors
        loop = torch_encoder(replace(strategy, backend="torch"), EmbeddingOptions(device="cpu"))
        expected, expected_owners = today.embed_documents(texts)
        vectors, owners = loop.embed_documents(texts)
        np.testing.assert_array_equal(owners, expected_owners)
        np.testing.assert_allclose(vectors, expected, atol=1e-5)
        np.testing.assert_allclose(loop.embed(texts), today.embed(texts), atol=1e-5)
    # bf16 (what a GPU's half precision does to the network) through the same code, on the CPU
    half = torch_encoder(Strategy(backend="torch"), EmbeddingOptions.at(Placement("cpu", "bf16")))
    low, full = half.embed(sentences), encoder_for(Strategy()).embed(sentences)
    assert low.dtype == np.float32
    cosines = (low * full).sum(1)
    assert cosines.min() > 0.99
    assert (np.argsort(-low @ low.T, axis=1)[:, :1] == np.argsort(-full @ full.T, axis=1)[:, :1]).all()


@pytest.mark.slow
@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_index_on_a_missing_gpu_writes_nothing(tmp_path, tiny_model):
    corpus = tmp_path / "c.txt"
    corpus.write_text("one\ntwo\n", encoding="utf-8")
    result = run("index", corpus, "-o", tmp_path / "idx", "--model", tiny_model, "--device", "cuda")
    assert_clean_failure(result, "torch sees no CUDA GPU")
    assert not (tmp_path / "idx").exists()
    result = run("encode", corpus, "--model", tiny_model, "--device", "cuda:1", "-o", tmp_path / "v.npy")
    assert_clean_failure(result, "torch sees no CUDA GPU")
    assert not (tmp_path / "v.npy").exists()


@pytest.mark.slow
def test_info_says_where_the_vectors_were_made(tmp_path, tiny_model):
    corpus = tmp_path / "c.txt"
    corpus.write_text("one\ntwo\nthree\n", encoding="utf-8")
    result = run("index", corpus, "-o", tmp_path / "idx", "--model", tiny_model, "--device", "cpu")
    assert result.returncode == 0, result.stderr
    info = run("info", tmp_path / "idx")
    assert "embedded:    onnx, cpu, fp32, passes of at most 512 texts and 8192 tokens" in info.stdout
    facts = json.loads(run("info", tmp_path / "idx", "--json").stdout)
    assert facts["embedded"].pop("why").startswith("its graph")  # exported now, or cached already
    assert facts["embedded"] == {
        "runtime": "onnx",
        "device": "cpu",
        "precision": "fp32",
        "batching": {"rows": 512, "tokens": 8192, "call_tokens": 8},
        "ray": None,
        "workers": None,
    }
    torch_built = run(
        "index", corpus, "-o", tmp_path / "t", "--model", tiny_model, "--backend", "torch", "--device", "cpu"
    )
    assert torch_built.returncode == 0, torch_built.stderr
    a = np.load(_encoded(tmp_path, "idx", tiny_model))
    b = np.load(_encoded(tmp_path, "t", tiny_model))
    np.testing.assert_allclose(a, b, atol=1e-5)


def _encoded(tmp_path, name, model):
    out = tmp_path / f"{name}.npy"
    result = run("encode", tmp_path / "c.txt", "--index", tmp_path / name, "-o", out, "--device", "cpu")
    assert result.returncode == 0, result.stderr
    return out


SIDE_BY_SIDE = {  # task -> cores -> (runs at once, threads each), as measured and chosen (docs/rerank.md)
    # a bulk encode: one session on every core it was given up to 7, then one per 4 cores
    "encode": {1: (1, 1), 2: (1, 2), 4: (1, 4), 7: (1, 7), 8: (2, 4), 16: (4, 4), 64: (16, 4)},
    # a reranker's passes: one one-thread pass per core up to 7, then four of a quarter each
    "rerank": {1: (1, 1), 2: (2, 1), 4: (4, 1), 7: (7, 1), 8: (4, 2), 16: (4, 4), 64: (4, 16)},
}


@pytest.mark.parametrize("task", sorted(SIDE_BY_SIDE))
def test_onnx_runs_side_by_side_as_each_task_chose_for_its_cores(task):
    from indexer.encoders.onnx_graph import side_by_side, usable_cores

    assert {cores: side_by_side(task, cores) for cores in SIDE_BY_SIDE[task]} == SIDE_BY_SIDE[task]
    assert side_by_side(task) == side_by_side(task, usable_cores())  # the cores this process may use


def test_onnx_side_by_side_refuses_a_task_it_has_no_rule_for():
    from indexer.encoders.onnx_graph import side_by_side

    with pytest.raises(ValueError, match="'embed'"):
        side_by_side("embed", 4)


@pytest.mark.slow
def test_sessions_side_by_side_give_the_vectors_of_one(tiny_model):
    from indexer.encoders.factory import encoder_for
    from indexer.encoders.onnx_encoder import OnnxEncoder

    strategy = encoder_for(Strategy(model=tiny_model)).strategy  # resolved, its graph exported
    texts = [f"text number {i} " + "word " * (i % 40) for i in range(300)]
    small = replace(encoder_for(strategy).decision, batching=Batching.on(True, 8))
    one = OnnxEncoder(strategy, spin=True, sessions=(1, 0), decision=small)
    three = OnnxEncoder(strategy, spin=True, sessions=(3, 1), decision=small)
    assert len(three.sessions) == 3 and len(one.sessions) == 1
    # the thread count is always given: ONNX Runtime's own choice pins a thread to every core of
    # the machine, whatever cores (taskset, a cpuset) the process was given
    from indexer.encoders.onnx_graph import usable_cores

    served = graph_encoder(strategy)
    sessions = (*served.sessions, *three.sessions)
    threads = [s.session.get_session_options().intra_op_num_threads for s in sessions]
    assert threads == [usable_cores(), 1, 1, 1]
    # a batch job's threads spin within a run, never after it (the build's other stages need the cores)
    spin = [s.session.get_session_options().get_session_config_entry for s in sessions]
    assert [(c("session.intra_op.allow_spinning"), c("session.force_spinning_stop")) for c in spin] == [
        ("0", "1"),
        *[("1", "1")] * 3,
    ]
    shares: list[float] = []
    np.testing.assert_allclose(three.embed(texts, progress=shares.append), one.embed(texts), atol=1e-6)
    assert sum(shares) == pytest.approx(1.0)


@pytest.mark.slow
@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_every_embedding_command_refuses_a_missing_gpu_before_it_writes(tmp_path, tiny_model):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(
        "sentence1\tsentence2\tscore\n"
        + "".join(f"a text {i}\tanother text {i * 7 % 13}\t{i % 5}\n" for i in range(30)),
        encoding="utf-8",
    )
    model = ("--model", tiny_model)
    for command in (
        ("tune", "-o", tmp_path / "tuned", "--pairs", pairs, *model),
        ("evaluate", "sts", pairs, *model),
        ("sweep", "sts", pairs, *model),
        ("similar", "a text", pairs, *model),
        ("words", "a text of words", *model),
    ):
        result = run(*command, "--device", "cuda")
        assert_clean_failure(result, "torch sees no CUDA GPU")
    assert not (tmp_path / "tuned").exists()



def test_the_onnx_loop_runs_the_passes_the_rule_plans():
    """``head.encode`` (what the ONNX encoders and the server's batches run) pads no short piece to
    a long one: the pieces of a batch of mixed lengths go in the passes ``Batching.plan`` makes."""
    from indexer.embedding.head import Head, NetworkOutput, encode

    widths: list[tuple[int, int]] = []

    def network(input_ids: np.ndarray, attention: np.ndarray) -> NetworkOutput:
        widths.append(input_ids.shape)
        return NetworkOutput([np.ones((*input_ids.shape, 4), dtype=np.float32)] * 2)

    ids = [[7] * n for n in [200, 5, 203, 6, 7, 202, 5, 204]]
    head = Head(Strategy(model="m", layers=(-1,), pooling="mean"), 1, [])
    encode(network, ids, [head], [4], batching=Batching.on(True, 32), pad=0)
    assert sorted(widths) == [(4, 7), (4, 204)]


@pytest.mark.parametrize("command", ["encode", "index", "similar", "words"])
def test_every_misnamed_device_is_the_same_usage_error(command):
    """An empty ``--device`` (a shell variable left unset) and a misspelt one are both a usage error,
    exit 2, naming the choices; refused before the model is loaded."""
    from click.testing import CliRunner

    from search.cli import cli

    codes = {}
    for device in ("", "  ", "tpu", "cuda:x", "gpu"):
        result = CliRunner().invoke(cli, [command, "-", "--device", device], input="a text\n")
        assert "auto, cpu, cuda or cuda:N" in result.output, (device, result.output)
        assert "Traceback" not in result.output
        codes[device] = result.exit_code
    assert set(codes.values()) == {2}, codes
