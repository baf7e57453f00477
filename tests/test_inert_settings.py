"""Settings a user gives that another setting leaves unused (Muon's under AdamW, the
experts' in a dense model) load with one warning naming them; Kiln's own full records do
not warn."""

from __future__ import annotations

import warnings

import pytest

from kiln.config import RECORD_HEADER, config_to_toml, load_config, run_dir_override

MUON_UNUSED = (r"^optim\.muon_lr = 0\.02 has no effect with optim\.name = 'adamw' \(only Muon "
               r"reads optim\.muon_\*\): set optim\.name = \"muon\" to train the hidden "
               r"matrices with Muon, or drop it$")


def quiet(path=None, overrides=(), **kwargs):
    """load_config, failing on any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load_config(path, overrides, **kwargs)


def test_muon_settings_under_adamw_are_named_with_their_values():
    with pytest.warns(UserWarning, match=MUON_UNUSED):
        load_config(None, ["optim.muon_lr=0.02"])
    with pytest.warns(UserWarning, match=r"^optim\.muon_momentum = 0\.9 and "
                      r"optim\.muon_adjust_lr = 'match_rms_adamw' have no effect with "
                      r"optim\.name = 'adamw' .*, or drop them$"):
        load_config(None, ["optim.muon_adjust_lr=match_rms_adamw", "optim.muon_momentum=0.9"])


def test_a_muon_setting_given_at_its_default_is_named_too(tmp_path):
    """What the user wrote counts, not whether it differs from the default: a recipe that
    tunes muon_lr = 0.0 (auto) and forgets optim.name meant Muon."""
    recipe = tmp_path / "r.toml"
    recipe.write_text("[optim]\nlr = 1e-3\nmuon_lr = 0.0\n")
    with pytest.warns(UserWarning, match=r"^optim\.muon_lr = 0\.0 has no effect with "
                      r"optim\.name = 'adamw'"):
        load_config(recipe)


def test_muon_settings_with_muon_and_the_defaults_are_quiet():
    quiet(None, ["optim.name=muon", "optim.muon_lr=0.02", "optim.muon_momentum=0.9"])
    quiet(None, ["optim.lr=1e-3", "model.dim=64"])


def test_moe_settings_in_a_dense_model_are_named():
    with pytest.warns(UserWarning, match=r"^model\.n_dense_layers = 2 and model\.top_k = 8 have "
                      r"no effect with model\.n_experts = 0 \(a dense model: every layer has a "
                      r"SwiGLU, no experts\): set model\.n_experts to the number of routed "
                      r"experts for a mixture of experts, or drop them$"):
        load_config(None, ["model.top_k=8", "model.n_dense_layers=2"])
    quiet(None, ["model.n_experts=8", "model.top_k=8", "model.n_dense_layers=2"])


def test_an_ablation_of_a_recipe_says_which_of_its_settings_go_unused():
    """--set cannot delete a recipe's keys: trinity-tiny trained with AdamW and no experts
    loads, naming its Muon and MoE settings once each."""
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "trinity-tiny.toml"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(recipe, ["optim.name=adamw", "model.n_experts=0"])
    assert cfg.optim.name == "adamw" and cfg.model.n_experts == 0
    lines = [str(w.message) for w in caught]
    assert len(lines) == 2
    assert lines[0].startswith("optim.muon_lr = 0.02 has no effect with optim.name = 'adamw'")
    assert lines[1].startswith("model.n_dense_layers = 2, model.top_k = 2, model.n_shared = 1, "
                               "model.expert_hidden = 32, model.route_scale = 1.4142135623730951, "
                               "model.balance = 'smebu', model.balance_rate = 0.01, "
                               "model.smebu_beta = 0.5 and model.smebu_kappa = 2.0 have no "
                               "effect with model.n_experts = 0")


def test_kilns_full_records_count_only_the_overrides_as_given(tmp_path):
    """A run's config.toml lists every key, Muon's and the experts' included: resuming an
    AdamW dense run from it (or from one written before the header marked records) is quiet;
    an override given on top is the user's, and warns."""
    from kiln.cli import resolve_config

    run = tmp_path / "run"
    run.mkdir()
    text = config_to_toml(load_config(None, [run_dir_override(run)]))
    (run / "config.toml").write_text(text)
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.toml").write_text(text.split("\n", 1)[1])  # an older Kiln's: no header
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve_config(str(run), [])  # the run directory: the CLI's way to resume
        resolve_config(str(run / "config.toml"), [])  # the header marks it as a file too
        resolve_config(str(old), [])
        load_config(old / "config.toml", [run_dir_override(old)], recorded=True)
    with pytest.warns(UserWarning, match=MUON_UNUSED):
        resolve_config(str(run), ["optim.muon_lr=0.02"])


def test_an_older_record_used_as_a_recipe_counts_what_differs_from_the_defaults(tmp_path):
    """An older Kiln's config.toml (no header) copied as a recipe lists every key at its
    value: the defaults in it (Muon's under AdamW) were not chosen and stay quiet, a value
    that differs was, and warns; a hand-written recipe still counts every key it gives."""
    text = config_to_toml(load_config(None, ["model.dim=64"])).split("\n", 1)[1]
    (tmp_path / "old.toml").write_text(text)
    assert quiet(tmp_path / "old.toml").model.dim == 64
    (tmp_path / "tuned.toml").write_text(text.replace("muon_lr = 0.0", "muon_lr = 0.02"))
    with pytest.warns(UserWarning, match=MUON_UNUSED):
        load_config(tmp_path / "tuned.toml")


def test_smebu_settings_under_another_balancing_rule_are_named():
    """An ablation of SMEBU to DeepSeek-V3's sign rule (or to no balancing) keeps the
    recipe's smebu_beta / smebu_kappa, which that rule never reads."""
    with pytest.warns(UserWarning, match=r"^model\.smebu_beta = 0\.9 and model\.smebu_kappa = "
                      r"3\.0 have no effect with model\.balance = 'sign' \(only SMEBU reads "
                      r"smebu_beta and smebu_kappa\): set model\.balance = \"smebu\", or drop "
                      r"them$"):
        load_config(None, ["model.n_experts=8", "model.balance=sign", "model.smebu_beta=0.9",
                           "model.smebu_kappa=3.0", "model.balance_rate=1e-3"])
    with pytest.warns(UserWarning, match=r"^model\.balance_rate = 0\.001 has no effect with "
                      r"model\.balance = 'none' \(no bias is balanced\): set model\.balance = "
                      r"\"smebu\" or \"sign\", or drop it$"):
        load_config(None, ["model.n_experts=8", "model.balance=none", "model.balance_rate=1e-3"])
    quiet(None, ["model.n_experts=8", "model.balance=sign", "model.balance_rate=1e-3"])
    quiet(None, ["model.n_experts=8", "model.smebu_beta=0.9", "model.balance_rate=1e-3"])


def test_decay_settings_under_a_schedule_that_does_not_decay_them_are_named():
    """The default schedule is cosine: `--set schedule.decay_fraction=0.3` meant a wsd decay
    and trained on the same cosine curve, silently; constant never reaches min_lr_ratio."""
    with pytest.warns(UserWarning, match=r"^schedule\.decay_fraction = 0\.3 has no effect with "
                      r"schedule\.name = 'cosine' \(only \"wsd\" reads "
                      r"schedule\.decay_fraction\): set schedule\.name = \"wsd\", or drop it$"):
        load_config(None, ["schedule.decay_fraction=0.3"])
    with pytest.warns(UserWarning, match=r"^schedule\.min_lr_ratio = 0\.2 and "
                      r"schedule\.decay_fraction = 0\.5 have no effect with schedule\.name = "
                      r"'constant' .*set schedule\.name = \"wsd\", or drop them$"):
        load_config(None, ["schedule.name=constant", "schedule.min_lr_ratio=0.2",
                           "schedule.decay_fraction=0.5"])
    with pytest.warns(UserWarning, match=r"^schedule\.min_lr_ratio = 0\.2 has no effect with "
                      r"schedule\.name = 'constant' \(the lr stays at optim\.lr after the "
                      r"warmup\): set schedule\.name = \"cosine\" or \"wsd\", or drop it$"):
        load_config(None, ["schedule.name=constant", "schedule.min_lr_ratio=0.2"])
    quiet(None, ["schedule.min_lr_ratio=0.0"])  # cosine reads it
    quiet(None, ["schedule.name=wsd", "schedule.decay_fraction=0.5", "schedule.min_lr_ratio=0"])
    quiet(None, ["schedule.name=constant", "schedule.warmup_steps=5"])


def test_a_record_copied_out_as_a_recipe_counts_what_differs_from_the_defaults(tmp_path):
    """A run's config.toml (with its header) copied to edit as a recipe: its edits were as
    quiet as the run's own record, since the header alone marked it as one; the README says
    a copy counts the values that differ from the defaults. The run's own stays quiet."""
    from kiln.cli import resolve_config
    from kiln.run_dir import write_run_metadata

    run = tmp_path / "run"
    with pytest.warns(UserWarning, match=MUON_UNUSED):  # the run's own recipe was told
        write_run_metadata(load_config(None, [run_dir_override(run), "optim.muon_lr=0.02"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve_config(str(run), [])  # the run's own record: as it was given
        resolve_config(str(run / "config.toml"), [])  # the same file, named
    text = (run / "config.toml").read_text()
    assert text.startswith(RECORD_HEADER)
    (tmp_path / "copy.toml").write_text(text)
    with pytest.warns(UserWarning, match=MUON_UNUSED):  # the copied run's choice
        load_config(tmp_path / "copy.toml")
    assert text.count('name = "adamw"') == text.count("n_shared = 1") == 1
    (tmp_path / "tuned.toml").write_text(text.replace('name = "adamw"', 'name = "muon"')
                                         .replace("n_shared = 1", "n_shared = 2"))
    with pytest.warns(UserWarning, match=r"^model\.n_shared = 2 has no effect"):
        load_config(tmp_path / "tuned.toml")  # an edit, in a dense model


def test_a_post_norm_gain_without_sandwich_norms_is_named():
    """post_norm_gain initialises the sandwich post-norms' gains alone: with
    sandwich_norm off (a Trinity ablation) there are none, and the gain went unused."""
    with pytest.warns(UserWarning, match=r"^model\.post_norm_gain = 0\.5 has no effect with "
                      r"model\.sandwich_norm = false \(only the sandwich post-norms start at "
                      r"that gain\): set model\.sandwich_norm = true, or drop it$"):
        load_config(None, ["model.post_norm_gain=0.5"])
    quiet(None, ["model.sandwich_norm=true", "model.post_norm_gain=0.5"])
