"""Help and messages: every option of every command has help, a command shows only the options
that can matter to it, a default is stated once, and the messages a newcomer meets say what to do
(a model that is not on disk, a misspelt field, one pair)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from indexer import Strategy, build_index
from indexer.embedding.strategy import DEFAULT_MODEL
from indexer.errors import BadInput
from search.cli import cli
from tests.helpers import write_csv


def commands(group: click.Group = cli, path: tuple[str, ...] = ()) -> dict[str, click.Command]:
    """Every command, by its full name (``evaluate retrieval``)."""
    found = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found.update(commands(command, (*path, name)))
        else:
            found[" ".join((*path, name))] = command
    return found


def help_of(name: str) -> str:
    result = CliRunner().invoke(cli, [*name.split(), "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: "), result.output  # help, not nothing
    return result.output


def options(name: str) -> set[str]:
    return {opt for p in commands()[name].params if isinstance(p, click.Option) for opt in p.opts}


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_option_has_help(name):
    bare = [p.opts for p in commands()[name].params if isinstance(p, click.Option) and not p.help]
    assert bare == []


@pytest.mark.parametrize("name", sorted(commands()))
def test_each_default_is_stated_once(name):
    command = commands()[name]
    context = click.Context(command)
    records = [p.get_help_record(context) for p in command.params if isinstance(p, click.Option)]
    assert [r for r in records if r and r[1].lower().count("default") > 1] == []


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_command_shows_an_example(name):
    """One runnable line under "Example:", kept as written (not rewrapped into the text above)."""
    lines = help_of(name).splitlines()
    assert "  Example:" in lines
    example = lines[lines.index("  Example:") + 1].strip()
    assert example.startswith(f"semsearch {name} ")


def test_query_has_no_strategy_options():
    """An index is queried with its stored strategy: a strategy option could only conflict."""
    assert not options("query") & {"--model", "--pooling", "--layers", "--backend", "--normalize"}


def test_similar_shows_no_option_that_cannot_change_a_ranking():
    """A cosine ignores the vectors' length, and post-processing needs an index's statistics
    (``--index`` brings them)."""
    assert options("similar") & {"--postprocess", "--whiten-dims", "--normalize"} == set()
    assert {"--model", "--pooling", "--index"} <= options("similar")


def test_words_shows_what_word_vectors_use_and_its_default_once():
    """Word vectors are read from torch, before any pooling or post-processing: only the model,
    the layers, how they combine and the length matter; the layers' default is said once."""
    assert (
        options("words") & {"--pooling", "--backend", "--postprocess", "--whiten-dims", "--normalize"}
        == set()
    )
    assert {"--model", "--layers", "--combine", "--max-length"} <= options("words")
    text = " ".join(help_of("words").split())
    assert text.count("-4,-3,-2,-1") == 1 and "auto" not in text.split("--layers")[1].split("--")[0]


def test_serve_help_names_every_route(tmp_path, tiny_model):
    pytest.importorskip("fastapi")
    from search.server import create_app

    corpus = write_csv(tmp_path / "faq.csv", [("a", "a text", "x"), ("b", "b text", "y")])
    build_index(corpus, tmp_path / "idx", Strategy(model=tiny_model))
    app = create_app(tmp_path / "idx")
    text = help_of("serve")
    routes = {r.path for r in app.routes if getattr(r, "include_in_schema", False)}
    assert routes and {r for r in routes if r not in text} == set()


def test_calibrate_says_what_its_inputs_are():
    text = " ".join(help_of("calibrate").split())
    assert "query_id" in text and "doc_id" in text  # the judgements' columns, not "Judgements."


@pytest.fixture(scope="module")
def index(tmp_path_factory, tiny_model) -> Path:
    directory = tmp_path_factory.mktemp("messages")
    rows = [("a1", "How do I pay?", "billing"), ("a2", "How do I pay?", "billing"), ("a3", "Bikes", "x")]
    build_index(write_csv(directory / "faq.csv", rows), directory / "idx", Strategy(model=tiny_model))
    return directory / "idx"


def test_info_shows_no_unset_values(index):
    result = CliRunner().invoke(cli, ["info", str(index)])
    assert result.exit_code == 0, result.output
    facts = dict(line.split(":", 1) for line in result.output.splitlines())
    assert (facts["entries"].strip(), facts["dimension"].strip()) == ("3", "32")  # the set facts are there
    assert "None" not in result.output


def test_duplicates_counts_in_words_and_shows_the_texts(index):
    result = CliRunner().invoke(cli, ["duplicates", str(index), "--min-score", "0.999"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("1 pair in 1 group at cosine >= 0.999")
    assert "How do I pay?" in result.output


def test_an_unknown_also_field_lists_the_fields(tmp_path, tiny_model):
    from indexer.embedding.fields import FieldScoring

    corpus = write_csv(tmp_path / "faq.csv", [("a", "a question", "an answer")], ("id", "question", "answer"))
    expected = r"no entry has field 'answr' \(did you mean 'answer'\?\); fields are: answer, id, question"
    with pytest.raises(BadInput, match=expected):
        build_index(
            corpus,
            tmp_path / "idx",
            Strategy(model=tiny_model),
            text_fields=["question"],
            also=FieldScoring(("answr",)),
        )


def test_a_model_not_on_disk_says_how_to_bring_one(monkeypatch, tmp_path):
    from indexer.embedding.models import load_model, model_facts

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for load in (model_facts, load_model):
        with pytest.raises(BadInput) as raised:
            load("sentence-transformers/no-such-model-here")
        message = str(raised.value)
        assert "`HF_HOME=DIR hf download sentence-transformers/no-such-model-here`" in message
        assert "huggingface-cli" not in message  # huggingface_hub ships `hf` now, not that command
        assert "local directory" in message and "huggingface.co" not in message
    assert model_facts(DEFAULT_MODEL).num_layers == 6  # the bundled model needs none of this: found offline


def test_one_option_name_means_one_thing_in_every_command():
    """``--precision`` is the network's fp32/fp16/bf16 and ``--batch-size`` counts texts wherever
    they are shown; a rule's promised precision and tune's pairs per step have names of their own."""
    for name, command in commands().items():
        for param in command.params:
            if not isinstance(param, click.Option) or param.hidden:
                continue
            if "--precision" in param.opts:
                assert isinstance(param.type, click.Choice) and "fp16" in param.type.choices, name
            if "--batch-size" in param.opts:
                assert param.help.startswith("Texts per"), name
    assert "--min-precision" in options("calibrate") and "--min-precision" in options("evaluate abstention")
    assert "--pairs-per-step" in options("tune")


@pytest.mark.parametrize(
    ("given", "precision", "noted"),
    [
        ([], 0.95, False),
        (["--min-precision", "0.5"], 0.5, False),
        (["--precision", "0.6"], 0.6, True),
        (["--guarantee", "0.8", "--precision", "0.7"], 0.7, True),
    ],
)
def test_the_old_spelling_of_min_precision_still_reaches_the_rule_with_a_note(given, precision, noted):
    from search.cli.rules import rule_options

    @click.command()
    @rule_options
    def show(precision: float, **rest: object) -> None:
        click.echo(f"precision={precision}")

    result = CliRunner().invoke(show, given)
    assert result.exit_code == 0, result.output
    assert f"precision={precision}" in result.output
    assert ("now --min-precision" in result.output) == noted
