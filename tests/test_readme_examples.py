"""The README's configuration examples as a user would try them: its list of every setting
matches the dataclasses (every key, every default), its TOML recipes and `--set` examples
load, and the config errors it quotes are what `kiln` prints. Before the list, over a hundred
keys (`optim.beta2`, `train.checkpoint_every`, every `[prepare.arxiv]` limit...) were named
nowhere a user would look."""

from __future__ import annotations

import re
import shlex
import tomllib
import warnings
from pathlib import Path

import pytest

from kiln.cli import main
from kiln.config import Config, config_to_dict, flat_table, load_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
RECIPE = ROOT / "recipes" / "quickstart.toml"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, re.S | re.M)


def _settings_list() -> str:
    after = README.split("<summary>Every setting and its default</summary>", 1)[1]
    return after.split("```toml\n", 1)[1].split("```", 1)[0]


def test_settings_list_names_every_key_with_its_default() -> None:
    listed = flat_table(tomllib.loads(_settings_list()))
    defaults = flat_table(config_to_dict(Config()))
    assert sorted(defaults.keys() - listed.keys()) == [], "keys the README's list leaves out"
    assert sorted(listed.keys() - defaults.keys()) == [], "keys the README lists that Kiln lacks"
    wrong = {k: (listed[k], v) for k, v in defaults.items() if listed[k] != v}
    assert wrong == {}, "README default, code default"


def test_settings_list_loads_as_a_recipe(tmp_path: Path) -> None:
    recipe = tmp_path / "every.toml"
    recipe.write_text(_settings_list(), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a default given is never an inert setting
        assert load_config(recipe) == load_config(None)


@pytest.mark.parametrize("block", _blocks("toml"), ids=lambda b: b.splitlines()[0])
def test_toml_examples_load(block: str, tmp_path: Path) -> None:
    recipe = tmp_path / "example.toml"
    recipe.write_text(block, encoding="utf-8")
    load_config(recipe)


def _set_examples() -> list[str]:
    """The `--set` values of the README's shell examples (a loop's `$r` as one of its values)
    and of its prose."""
    found = []
    for block in _blocks("bash") + _blocks("sh"):
        text = block.replace("\\\n", " ").replace("$r", "0.2")
        for line in text.splitlines():
            words = shlex.split(line.split(" #", 1)[0]) if "--set" in line else []
            found += [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--set"]
    spans = re.findall(r"`[^`\n]*?--set ('[^']*'|[^`\s]+)", README)  # in the prose
    return found + [shlex.split(s)[0] for s in spans if s != "section.key=value"]


def test_there_are_set_examples() -> None:
    assert len(_set_examples()) >= 8


@pytest.mark.parametrize("setting", _set_examples())
def test_set_examples_load(setting: str) -> None:
    load_config(RECIPE, [setting])


def _quoted_errors() -> list[tuple[str, str]]:
    """(command, what the README says it prints) from its `$ kiln ...` transcripts."""
    pairs = re.findall(r"^\$ (kiln .+)\n(kiln: .+)$", README, re.M)
    assert pairs, "the README's config-error transcript is gone"
    return pairs


@pytest.mark.parametrize(("command", "said"), _quoted_errors())
def test_quoted_config_errors_are_what_kiln_prints(command: str, said: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # no runs/quickstart here: the built-in config
    assert main(shlex.split(command)[1:]) == 2
    assert capsys.readouterr().err.strip() == said


def test_set_help_says_where_every_key_is_listed() -> None:
    """`--set`'s help gave one example key and no word of where the others are: a user
    with `kiln --help` alone had no list of the settings to override."""
    from kiln.cli import VERBS, build_parser

    verbs = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name in VERBS:
        text = " ".join(verbs[name].format_help().split())
        assert "every key and its default" in text and "config.toml" in text, name
