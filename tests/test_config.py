import re
import warnings
from pathlib import Path

import pytest

from kiln.config import Config, ConfigError, config_to_toml, load_config


def write(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_defaults_load_and_round_trip(tmp_path):
    cfg = load_config(None, ["train.steps=7", "generate.prompts=['a', 'b']"])
    again = load_config(write(tmp_path, config_to_toml(cfg)))
    assert again == cfg
    assert again.train.steps == 7 and again.generate.prompts == ["a", "b"]


def test_unknown_key_names_key_and_suggestion(tmp_path):
    with pytest.raises(ConfigError, match=r"'train.stpes'.*did you mean 'train.steps'"):
        load_config(write(tmp_path, "[train]\nstpes = 10\n"))


@pytest.mark.parametrize("override, suggested", [
    ("train.lr=1e-3", "'optim.lr'"),  # the same name in another section comes first
    ("optim.warmup_steps=3", "'schedule.warmup_steps'"),
    ("optim.min_lr_ratio=0.1", "'schedule.min_lr_ratio'"),
    ("train.weight_decay=0.1", "'optim.weight_decay'"),
    ("model.dimm=3", "'model.dim'"),
    ("prepare.quality.domian=x", "'prepare.quality.domain'"),
    ("prepare.qualty.domain=x", "'prepare.quality'"),  # a misspelled sub-table
    ("prepare.dedup_exct.x=1", "'prepare.dedup_exact'"),
])
def test_a_key_in_the_wrong_section_suggests_where_it_lives(override, suggested):
    with pytest.raises(ConfigError, match=f"did you mean {suggested}"):
        load_config(None, [override])


def test_unknown_section_is_rejected():
    with pytest.raises(ConfigError, match="unknown config key 'modle'.*'model'"):
        load_config(None, ["modle.dim=3"])


def test_wrong_type_names_key(tmp_path):
    with pytest.raises(ConfigError, match=r"model.dim: expected int, got str"):
        load_config(write(tmp_path, '[model]\ndim = "big"\n'))
    with pytest.raises(ConfigError, match=r"model.tie_embeddings: expected bool"):
        load_config(None, ["model.tie_embeddings=1"])


def test_int_widens_to_float_but_not_bool_to_int():
    assert load_config(None, ["optim.lr=1"]).optim.lr == 1.0
    with pytest.raises(ConfigError, match="train.steps"):
        load_config(None, ["train.steps=true"])


def test_a_table_override_merges_into_the_section():
    """`--set 'train={steps=5}'` replaced the recipe's whole [train] table: its other keys
    (eval_every 80, checkpoint_every 80 in the quickstart) fell back to their defaults."""
    recipe = load_config("recipes/quickstart.toml", [])
    table = load_config("recipes/quickstart.toml", ["train={steps=5}", " train . seq_len =32"])
    assert table.train.steps == 5 and table.train.seq_len == 32
    assert table.train.eval_every == recipe.train.eval_every != 100  # 100: the default
    assert table.train.checkpoint_every == recipe.train.checkpoint_every


def test_bare_word_override_is_a_string():
    assert load_config(None, ["train.precision=bf16"]).train.precision == "bf16"


@pytest.mark.parametrize(
    "override, key",
    [
        ("model.n_heads=3", "model.dim"),
        ("model.n_kv_heads=3", "model.n_heads"),
        ("train.seq_len=1024", "train.seq_len"),
        ("optim.grad_clip=-1", "optim.grad_clip"),  # would flip every gradient
        ("optim.beta1=1.5", "optim.beta1"),
        ("optim.beta2=1.0", "optim.beta2"),
        ("optim.eps=0", "optim.eps"),
        ("optim.weight_decay=-0.1", "optim.weight_decay"),
        ("model.n_shared=-1", "model.n_shared"),
        ("model.expert_hidden=-64", "model.expert_hidden"),
        ("model.n_dense_layers=-1", "model.n_dense_layers"),
        ("model.max_seq_len=100000000", "model.max_seq_len"),
        ("schedule.name=cosin", "schedule.name"),
        ("train.precision=fp16", "train.precision"),
        ("schedule.warmup_steps=-1", "schedule.warmup_steps"),
        ("train.steps=0", "train.steps"),
        ("train.log_every=0", "train.log_every"),
        ("eval.batch_size=0", "eval.batch_size"),
        ("eval.max_batches=-1", "eval.max_batches"),
        ("tokenizer.min_frequency=-1", "tokenizer.min_frequency"),
        ("model.ffn_hidden=-1", "model.ffn_hidden"),
        ("model.init_std=-1", "model.init_std"),
        ("model.norm_eps=-1", "model.norm_eps"),
        ("model.rope_theta=0", "model.rope_theta"),
        ("data.max_bytes=-5", "data.max_bytes"),
        ("optim.lr=nan", "optim.lr"),
        ("optim.lr=inf", "optim.lr"),
        ("optim.weight_decay=-inf", "optim.weight_decay"),
        ("generate.prompts=[]", "generate.prompts"),  # "" is a document from its start
    ],
)
def test_impossible_combinations_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.dim=40", "model.n_heads=8"], r"model\.dim / model\.n_heads must be even"),
        (["model.local_per_global=3"], r"model\.local_per_global > 0 needs model\.sliding_window"),
        (["model.n_experts=4", "model.top_k=5"],
         r"model\.top_k \(5\) must be in \[1, model\.n_experts=4\]"),
        (["model.n_experts=4", "model.top_k=0"], r"model\.top_k \(0\) must be in"),
        (["model.vocab_size=-5"], r"model\.vocab_size must be 0 .* got -5"),
        (["model.vocab_size=100"], r"model\.vocab_size must be 0"),
        (["model.vocab_size=1000000000000"], r"model\.vocab_size must be 0"),
        (["model.route_scale=0"], r"model\.route_scale = 0.0 must be > 0"),
        (["model.balance_rate=-1e-3"], r"model\.balance_rate = -0.001 must be >= 0"),
        (["model.smebu_beta=1.0"], r"model\.smebu_beta = 1.0 must be in \[0, 1\)"),
        (["model.smebu_kappa=0"], r"model\.smebu_kappa = 0.0 must be > 0"),
        (["model.seq_aux_coef=-0.1"], r"model\.seq_aux_coef = -0.1 must be >= 0"),
        (["model.z_loss_coef=-0.1"], r"model\.z_loss_coef = -0.1 must be >= 0"),
        (["model.router_init_std=-0.1"], r"model\.router_init_std = -0.1 must be >= 0"),
        (["model.n_experts=4", "model.n_layers=2", "model.n_dense_layers=3"],
         r"model\.n_dense_layers = 3 exceeds model\.n_layers = 2: use fewer dense layers"),
        (["schedule.decay_fraction=0"], r"schedule\.decay_fraction must be in \(0, 1\]"),
        (["schedule.decay_fraction=1.5"], r"schedule\.decay_fraction must be in \(0, 1\]"),
        # each names the one key that is wrong and its value, not the four muon_* rules
        (["optim.muon_momentum=1.0"], r"^optim\.muon_momentum = 1\.0 must be in \[0, 1\)$"),
        (["optim.muon_momentum=-0.1"], r"^optim\.muon_momentum = -0\.1 must be in \[0, 1\)$"),
        (["optim.muon_ns_steps=0"], r"^optim\.muon_ns_steps = 0 must be >= 1$"),
        (["optim.muon_lr=-0.01"], r"^optim\.muon_lr = -0\.01 must be >= 0 \(0 picks 0\.02"),
        (["optim.muon_weight_decay=-0.1"], r"^optim\.muon_weight_decay = -0\.1 must be >= 0$"),
    ],
)
def test_model_optim_and_schedule_ranges_name_the_key(overrides, message):
    """Settings that would build a broken model (odd rotary head_dim, local layers with no
    window, impossible expert counts) or a nonsense optimizer/schedule are refused at load."""
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_settings_just_inside_the_ranges_load():
    """The boundaries of the checks above are themselves valid."""
    load_config(None, ["model.dim=48", "model.n_heads=8", "model.n_kv_heads=4",  # head_dim 6
                       "model.local_per_global=3", "model.sliding_window=64",
                       "model.n_experts=4", "model.top_k=4", "model.n_dense_layers=4",
                       "model.vocab_size=257", "model.smebu_beta=0",
                       "model.route_scale=1e-3", "model.router_init_std=0",
                       "schedule.name=wsd", "schedule.decay_fraction=1.0",
                       "optim.name=muon", "optim.muon_momentum=0",
                       "optim.muon_ns_steps=1", "optim.muon_lr=0", "optim.muon_weight_decay=0"])


def test_choice_error_suggests_closest():
    with pytest.raises(ConfigError, match="did you mean 'cosine'"):
        load_config(None, ["schedule.name=cosin"])


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="no recipe or run directory at"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(write(tmp_path, "[train\n"))


def test_quickstart_recipe_is_valid():
    cfg = load_config("recipes/quickstart.toml")
    assert isinstance(cfg, Config) and cfg.train.steps > 0


@pytest.mark.parametrize("run_dir, source", [
    ("corpus", "corpus"),  # the same folder
    ("corpus/run", "corpus"),  # the run inside a source: its outputs would be read as data
    ("runs/x", "runs/x/documents"),  # a source inside the run: prepare would clear it
])
def test_run_dir_overlapping_a_source_is_refused(tmp_path, monkeypatch, run_dir, source):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="overlap"):
        load_config(None, [f'run.dir="{run_dir}"', f'data.sources=["{source}"]'])
    load_config(None, ['run.dir="runs/y"', f'data.sources=["{source}"]'])  # apart: fine


def test_run_dir_must_not_be_empty(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="run.dir"):
        load_config(None, ['run.dir=""'])


@pytest.mark.parametrize("run_dir", [".", "./", "sub/.."])
def test_a_run_is_not_made_in_the_current_folder(tmp_path, monkeypatch, run_dir):
    """The data verbs empty parts of the run dir: not the folder the user stands in. A made
    run may still be read from inside it (`kiln report .`), so the config itself loads."""
    from kiln.config import check_run_dir_is_its_own

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    cfg = load_config(None, [f'run.dir="{run_dir}"'])
    with pytest.raises(ConfigError, match="is the current folder"):
        check_run_dir_is_its_own(cfg)
    check_run_dir_is_its_own(load_config(None, ['run.dir="runs/x"']))


@pytest.mark.parametrize("run_dir", ['runs/we"ird', "runs\\back\\slash", "runs/ünï cödé"])
def test_any_run_dir_survives_override_and_the_recorded_toml(tmp_path, run_dir):
    from kiln.config import config_to_toml, run_dir_override

    cfg = load_config(None, [run_dir_override(run_dir)])
    assert cfg.run.dir == run_dir
    (tmp_path / "c.toml").write_text(config_to_toml(cfg))
    assert load_config(tmp_path / "c.toml").run.dir == run_dir


@pytest.mark.parametrize(("override", "hint"), [
    ("optim.lr=.5", "as a TOML number: 0.5"),
    ("optim.lr=5.", "as a TOML number: 5.0"),
    ("train.compile=True", "TOML booleans are lowercase: true"),
    ('train.steps="100"', "as a TOML number: 100)"),  # an int key: not 100.0
])
def test_python_style_values_say_how_toml_writes_them(override, hint):
    with pytest.raises(ConfigError, match=re.escape(hint)):
        load_config(None, [override])


@pytest.mark.parametrize(("override", "message"), [
    ("generate.top_p=0", "generate.top_p = 0.0 must be in (0, 1]"),
    ("generate.temperature=-1", "generate.temperature = -1.0 must be >= 0"),
    ("generate.top_k=-2", "generate.top_k = -2 must be >= 0"),
    ("generate.top_p=1.5", "generate.top_p = 1.5 must be in (0, 1]"),
    ("generate.top_p=-0.1", "generate.top_p = -0.1 must be in (0, 1]"),
    ("generate.top_p=nan", "generate.top_p must be a finite number, got nan"),
    ("generate.temperature=nan", "generate.temperature must be a finite number, got nan"),
    ("generate.temperature=inf", "generate.temperature must be a finite number, got inf"),
    ("generate.top_k=2.5", "generate.top_k: expected int, got float 2.5"),
    ("generate.max_new_tokens=-1", "generate.max_new_tokens must be >= 0, got -1"),
])
def test_sampling_settings_out_of_range_name_the_key_and_value(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, [override])


def test_any_string_round_trips_through_the_recorded_config(tmp_path):
    """config.toml must load back whatever strings the run used: control characters (TOML
    wants them escaped), DEL (which JSON leaves bare), characters outside the BMP."""
    cfg = Config()
    cfg.generate.prompts = ["line\r\n", "nul\x00", "del\x7f", "emoji 🔥", "tab\t", 'q"b\\']
    cfg.run.dir = "runs/🔥 run"
    path = tmp_path / "config.toml"
    path.write_text(config_to_toml(cfg), encoding="utf-8")
    back = load_config(path)
    assert back.generate.prompts == cfg.generate.prompts and back.run.dir == cfg.run.dir


def test_recipe_edge_cases(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_bytes("\ufeff[train]\nsteps = 7\n".encode())  # a BOM from a Windows editor
    assert load_config(recipe).train.steps == 7
    assert load_config(None, ["run.dir= /tmp/x "]).run.dir == "/tmp/x"  # a bare word, trimmed
    for size in (256, 1 << 23, 10**20):
        with pytest.raises(ConfigError, match="tokenizer.vocab_size must be from 257 .* to 4,194,304"):
            load_config(None, [f"tokenizer.vocab_size={size}"])
    assert load_config(None, ["tokenizer.vocab_size=257"]).tokenizer.vocab_size == 257
    with pytest.raises(ConfigError, match=r"data.sources: '/d\\xff' is not valid UTF-8"):
        load_config(None, ['data.sources=["/d\udcff"]'])


RECIPES = Path(__file__).resolve().parents[1] / "recipes"


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.toml")))
def test_shipped_recipes_load_with_a_schedule_that_does_what_it_says(recipe):
    """Every recipe loads with no setting left unused, a schedule that warns of nothing (a
    warmup as long as the run would never decay) and no design problem or note."""
    from kiln.config import design_notes, design_problems
    from kiln.train.schedule import schedule_warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no setting it gives goes unused
        cfg = load_config(RECIPES / recipe)
    assert schedule_warnings(cfg.train.steps, cfg.schedule) == []
    assert design_problems(cfg.model) == [] and design_notes(cfg.model, cfg.train.seq_len) == []


@pytest.mark.parametrize("overrides, message", [
    (["model.n_experts=4", "model.top_k=1"], r"model\.top_k = 1: .*router learns nothing"),
    (["model.n_experts=1", "model.top_k=1"], r"model\.top_k = 1"),
    (["model.sliding_window=64"], r"model\.sliding_window = 64 has no effect"),
    (["model.local_per_global=4", "model.sliding_window=8"],
     r"model\.local_per_global = 4 with model\.n_layers = 4 leaves no global layer"),
    (["model.local_per_global=1", "model.sliding_window=256"],
     r"model\.sliding_window = 256 is not below model\.max_seq_len = 256: .*attend to the whole"),
    (["model.local_per_global=1", "model.sliding_window=1000"],
     r"model\.sliding_window = 1000 is not below model\.max_seq_len"),
    (["model.n_experts=4", "model.n_dense_layers=4"],
     r"^model\.n_dense_layers = 4 with model\.n_layers = 4 leaves no MoE layer .*: "
     r"model\.n_experts = 4 does nothing and the model is dense; use n_dense_layers below "
     r"n_layers .*, or n_experts = 0 for a dense model$"),
])
def test_designs_that_train_wrong_load_but_are_named(overrides, message):
    """A recorded run trained with one of these (before Kiln checked) still loads, for eval,
    generate and export; a new model is refused them (test_train covers the trainer)."""
    from kiln.config import design_problems

    cfg = load_config(None, overrides)
    assert len(design_problems(cfg.model)) == 1
    assert re.search(message, design_problems(cfg.model)[0])
    assert design_problems(load_config(None, []).model) == []



def test_nope_in_every_layer_is_noted():
    """Ablating the Trinity recipes' local layers (local_per_global = 0) keeps their
    global_rope = false: then no layer has positions at all, which trains but is said."""
    from kiln.config import design_notes

    notes = design_notes(load_config(None, ["model.global_rope=false"]).model)
    assert notes == ["model.global_rope = false with model.local_per_global = 0: every layer "
                     "is global, so none has positional encoding (NoPE throughout; Trinity's "
                     "global layers go without RoPE because its local layers carry position); "
                     "set model.global_rope = true for all-global layers with RoPE"]
    local = ["model.global_rope=false", "model.local_per_global=1", "model.sliding_window=8"]
    assert design_notes(load_config(None, local).model) == []

def test_moe_with_one_moe_layer_is_no_design_problem():
    """n_dense_layers = n_layers - 1 leaves the last layer MoE: a design, not a mistake."""
    from kiln.config import design_problems
    from kiln.model.transformer import is_moe_layer

    cfg = load_config(None, ["model.n_experts=4", "model.n_dense_layers=3"])
    assert [is_moe_layer(cfg.model, i) for i in range(4)] == [False, False, False, True]
    assert design_problems(cfg.model) == []


@pytest.mark.parametrize("n_layers, local_per_global, global_layers, said", [
    (10, 3, [3, 7], "so layers 3 and 7 are global and the last layers 8-9 are local; for a "
                    "global last layer use n_layers = 8 or 12"),
    (5, 3, [3], "so layer 3 is global and the last layer 4 is local; for a global last layer "
                "use n_layers = 4 or 8"),
    (26, 5, [5, 11, 17, 23], "so layers 5, 11, ..., 23 are global and the last layers 24-25 are "
                             "local; for a global last layer use n_layers = 24 or 30"),  # Gemma 3 1B
])
def test_a_cut_short_local_global_pattern_is_noted_with_the_layers_the_model_builds(
        n_layers, local_per_global, global_layers, said):
    """local_per_global + 1 not dividing n_layers: the model repeats the pattern from layer
    0 and ends part-way through one, on local layers. It trains (a published design may do
    so), so it is a note naming the global layers, not an error."""
    import torch

    from kiln.config import design_notes, design_problems
    from kiln.model import Transformer

    cfg = load_config(None, [f"model.n_layers={n_layers}", f"model.local_per_global={local_per_global}",
                             "model.sliding_window=16", "model.dim=16", "model.n_heads=2",
                             "model.n_kv_heads=1", "model.vocab_size=300"])
    with torch.device("meta"):
        layers = Transformer(cfg.model).layers
    assert [i for i, block in enumerate(layers) if not block.attn.window] == global_layers
    assert design_problems(cfg.model) == []
    assert design_notes(cfg.model) == [
        f"model.n_layers = {n_layers} is not a multiple of model.local_per_global + 1 = "
        f"{local_per_global + 1}: the pattern ({local_per_global} sliding-window layers, then "
        f"one global) is cut short, {said}"]


@pytest.mark.parametrize("overrides", [
    [], ["model.n_layers=8", "model.local_per_global=3", "model.sliding_window=16"],
    ["model.n_layers=4", "model.local_per_global=1", "model.sliding_window=16"],
    ["model.n_layers=4", "model.local_per_global=4", "model.sliding_window=16"],  # a problem
])
def test_whole_local_global_patterns_are_not_noted(overrides):
    from kiln.config import design_notes

    assert design_notes(load_config(None, overrides).model) == []


@pytest.mark.parametrize(("override", "message"), [
    ("steps=3", "unknown config key 'steps' (did you mean 'train.steps'?)"),
    # an underscore typed for the dot: the dotted key first, not a leaf of the same name
    ("run_dir=x", "unknown config key 'run_dir' (did you mean 'run.dir' or "
                  "'prepare.perplexity.run_dir'?)"),
    ("train_steps=3", "unknown config key 'train_steps' (did you mean 'train.steps'?)"),
    # a typo inside its section: that section's key alone, not also a tie elsewhere (`pii.types`)
    ("train.stpes=3", "unknown config key 'train.stpes' (did you mean 'train.steps'?)"),
    ("train.precision=BF16", "(did you mean 'bf16'?)"),
    ("tokenizer.kind=BPE", "(did you mean 'bpe'?)"),
    ("run.dir=2024-06-01", 'text is quoted in TOML: run.dir="2024-06-01"'),
    ("run.dir=2024", 'text is quoted in TOML: run.dir="2024"'),
    ("run.dir=true", 'text is quoted in TOML: run.dir="true"'),
    ("run.dir=2024-06-01T10:00:00", 'text is quoted in TOML: run.dir="2024-06-01T10:00:00"'),
    ("run.dir=1e3", "(text is quoted in TOML)"),
    ("generate.prompts=[1]", "generate.prompts[0]: expected str, got int 1 (text is quoted in TOML)"),
    ("run.seed=-5", r"run.seed must be in [0, 2**63), got -5"),
    (f"run.seed={2**64}", r"run.seed must be in [0, 2**63)"),
])
def test_more_config_mistakes_name_the_fix(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value)


def test_a_symlink_loop_as_a_path_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    with pytest.raises(ConfigError, match="data.sources entry 'l1' is a symlink loop"):
        load_config(None, ['data.sources=["l1"]', 'run.dir="runs/x"'])
    with pytest.raises(ConfigError, match="run.dir 'l1' is a symlink loop"):
        load_config(None, ['run.dir="l1"'])
    # Python 3.13's resolve() returns a looping path instead of raising: stat still tells
    monkeypatch.setattr(Path, "resolve", lambda self, strict=False: self.absolute())
    with pytest.raises(ConfigError, match="run.dir 'l1' is a symlink loop"):
        load_config(None, ['run.dir="l1"'])
    load_config(None, ['run.dir="not/made/yet"'])  # a folder that does not exist is fine


def test_the_quote_hint_for_the_command_line_survives_the_shell():
    """`--set run.dir="2024-06-01"` reaches Kiln without its quotes (the shell eats them):
    the hint's command-line spelling, split as a shell splits it, must load."""
    import shlex

    with pytest.raises(ConfigError) as e:
        load_config(None, ["run.dir=2024-06-01"])
    typed = str(e.value).split("on the command line, where the shell eats bare quotes: ")[1]
    words = shlex.split(typed.rstrip(")"))
    assert words[0] == "--set"
    assert load_config(None, words[1:]).run.dir == "2024-06-01"


def test_a_list_given_as_one_value_shows_the_list_syntax():
    """`--set data.sources=dir/` names the key and the form that works, which itself loads."""
    with pytest.raises(ConfigError, match=r"data.sources: expected a list.*--set "
                                          r"'data.sources=\[\"dir/\"\]'") as refused:
        load_config(None, ["data.sources=dir/"])
    suggested = str(refused.value).split("--set '")[1].rstrip(")'")
    assert load_config(None, [suggested]).data.sources == ["dir/"]


@pytest.mark.parametrize(("override", "message"), [
    # other trainers' names: spelling alone gave 'model.n_heads', 'prepare.inject_replicas.
    # keep_size' and 'prepare.pii.types' for these, and nothing for the rest
    ("model.n_embd=3", "'model.n_embd' (did you mean 'model.dim'?)"),
    ("model.hidden_size=3", "'model.hidden_size' (did you mean 'model.dim'?)"),
    ("train.dtype=bf16", "'train.dtype' (did you mean 'train.precision'?)"),
    ("optim.learning_rate=1e-3", "'optim.learning_rate' (did you mean 'optim.lr'?)"),
    ("model.num_attention_heads=4", "(did you mean 'model.n_heads'?)"),
    ("model.intermediate_size=64", "(did you mean 'model.ffn_hidden'?)"),
    ("train.batch_size=8", "(did you mean 'train.global_batch' or 'train.micro_batch'?)"),
    ("batch_size=8", "'batch_size' (did you mean 'train.global_batch' or 'train.micro_batch'?)"),
    ("N_EMBD=3", "(did you mean 'model.dim'?)"),
    # the section typed decides the order
    ("model.block_size=64", "(did you mean 'model.max_seq_len' or 'train.seq_len'?)"),
    ("train.seq_length=64", "(did you mean 'train.seq_len' or 'model.max_seq_len'?)"),
    ("train.gradient_accumulation_steps=4", "(did you mean 'train.global_batch' or "
     "'train.micro_batch'? Kiln accumulates global_batch / (micro_batch x ranks) micro-batches"),
    ("schedule.min_lr=1e-5", "(did you mean 'schedule.min_lr_ratio'? a fraction of optim.lr"),
    ("model.dropout=0.1", "'model.dropout' (Kiln's decoder has no dropout)"),
    ("model.bias=true", "(Kiln's linear layers have no biases)"),
    ("train.world_size=2", "(the number of processes is torchrun's: torchrun --nproc_per_node=N"),
    # a parquet user's word for data.text_field had no suggestion; epochs got 'optim.eps'
    ("data.text_column=content", "'data.text_column' (did you mean 'data.text_field'?)"),
    ("train.epochs=2", "'train.epochs' (did you mean 'train.steps'? Kiln counts optimizer steps"),
    ("train.num_train_epochs=2", "(did you mean 'train.steps'?"),
])
def test_other_trainers_names_point_to_kilns(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value)


def test_every_alias_points_to_a_real_key_and_shadows_none():
    """A renamed Kiln key would leave an alias pointing nowhere; an alias equal to a Kiln
    name would hide that key's own suggestions (batch_size is eval's, but never train's)."""
    from kiln.config import flat_settings
    from kiln.config_aliases import ALIASES, NOTES

    leaves = set(flat_settings(Config()))
    assert {t for targets in ALIASES.values() for t in targets} <= leaves
    names = {k.rpartition(".")[2] for k in leaves}
    assert (set(ALIASES) | set(NOTES)) & names == {"batch_size"}
    assert all(k == k.lower() and "-" not in k for k in [*ALIASES, *NOTES])


def test_every_expert_chosen_is_a_note_and_balancing_is_inert():
    """top_k == n_experts routes every token to every expert: the model trains (a dense
    mixture), but the selection bias and the sequence-wise aux loss do nothing, which a
    note says once; checked on the layer itself."""
    import torch

    from kiln.config import design_notes, design_problems
    from kiln.model.moe import MoE, sequence_aux_loss

    base = ["model.n_experts=4", "model.top_k=4", "model.seq_aux_coef=0.01"]
    cfg = load_config(None, base)
    assert design_problems(cfg.model) == []
    assert design_notes(cfg.model) == [
        "model.top_k = model.n_experts = 4: every token goes to every expert, so each MoE "
        "layer costs all its experts per token and load balancing (model.balance = 'smebu', "
        "model.seq_aux_coef) has nothing to balance; for a sparse MoE use top_k below "
        "n_experts (Trinity: 8 of 128)"]
    assert design_notes(load_config(None, ["model.n_experts=4", "model.top_k=4",
                                           "model.balance=none"]).model) == [
        "model.top_k = model.n_experts = 4: every token goes to every expert, so each MoE layer "
        "costs all its experts per token; for a sparse MoE use top_k below n_experts (Trinity: 8 "
        "of 128)"]
    assert design_notes(load_config(None, ["model.n_experts=4", "model.top_k=3"]).model) == []
    assert design_notes(load_config(None, ["model.n_experts=4", "model.top_k=4", "model.n_layers=4",
                                           "model.n_dense_layers=4"]).model) == []  # a problem

    x = torch.randn(2, 8, 16)
    for top_k in (4, 2):
        torch.manual_seed(0)
        moe = MoE(dim=16, n_experts=4, top_k=top_k, expert_hidden=32, init_std=0.2,
                  router_init_std=0.3)
        before = moe(x)
        moe.balancer.bias.copy_(torch.tensor([3.0, -1.0, 0.5, -2.5]))  # steers selection only
        change = (moe(x) - before).abs().max() / before.abs().max()
        assert change < 1e-5 if top_k == 4 else change > 0.1  # 4: the experts' sum reordered
    scores = torch.rand(2, 8, 4, requires_grad=True)
    loss = sequence_aux_loss(scores, top_k=4)
    loss.backward()
    torch.testing.assert_close(loss.detach(), torch.tensor(1.0))
    assert scores.grad.abs().max() < 1e-6


@pytest.mark.parametrize(("override", "meant"), [
    ('prepare.pii.types=["emails"]', "EMAIL"), ('prepare.pii.types=["names"]', "NAME"),
    ('prepare.quality.domain="Prose"', "prose")])
def test_a_prepare_choice_in_another_case_is_suggested(override, meant):
    """The PII types are upper case: 'emails' was refused with no suggestion, since the
    closest-match search compared letters with their case."""
    with pytest.raises(ConfigError, match=f"is not one of .* \\(did you mean '{meant}'\\?\\)"):
        load_config(None, [override])


@pytest.mark.parametrize(("override", "meant"), [
    ("train.device=gpu", "cuda"), ("train.device=GPU", "cuda"),
    ("train.precision=float32", "fp32"), ("eval.split=validation", "val")])
def test_a_choice_by_another_name_suggests_the_one_it_means(override, meant):
    """`train.device = "gpu"` was answered "did you mean 'cpu'?": one letter away, and the
    device the user did not want; `float32` and `validation` had no suggestion."""
    with pytest.raises(ConfigError, match=f"is not one of .* \\(did you mean '{meant}'\\?\\)"):
        load_config(None, [override])


@pytest.mark.parametrize("override", ['run.dir="runs/x', "run.dir='runs/x",
                                      'run.dir="runs/x"/y'])
def test_a_value_quoted_but_not_as_toml_is_refused(override):
    """`--set 'run.dir="runs/x'` (a quote left open) fell back to the bare word, quote and
    all: the run went to a folder named `"runs` in the current one, silently."""
    with pytest.raises(ConfigError, match=r"^override '.*': run\.dir is not valid TOML text "
                       r"\(.+\): quote the whole value once"):
        load_config(None, [override])
    assert load_config(None, ['run.dir=a"b']).run.dir == 'a"b'  # a bare word: as before


@pytest.mark.parametrize(("override", "hint"), [
    ("train.compile=yes", "(a TOML boolean is true or false: train.compile=true)"),
    ("train.compile=1", "(a TOML boolean is true or false: train.compile=true)"),
    ("model.qk_norm=off", "(a TOML boolean is true or false: model.qk_norm=false)"),
    ("train.keep_host_memory=0", "(a TOML boolean is true or false: train.keep_host_memory=false)"),
])
def test_a_boolean_spelled_otherwise_says_how_toml_writes_it(override, hint):
    """`yes`, `1`, `off` for a boolean were refused with no word of what to write (`True`
    alone had one)."""
    with pytest.raises(ConfigError, match=r"expected bool, got .*" + re.escape(hint) + "$"):
        load_config(None, [override])


@pytest.mark.parametrize(("override", "hint"), [
    ("train.steps=1e3", "(an integer in TOML has no point or exponent: train.steps=1000)"),
    ("model.dim=256.0", "(an integer in TOML has no point or exponent: model.dim=256)"),
])
def test_a_whole_float_for_an_int_key_says_the_integer(override, hint):
    """`train.steps=1e3` was refused as 'expected int, got float 1000.0', with no word that
    TOML reads an exponent as a float; 3.5 still has no integer to name."""
    with pytest.raises(ConfigError, match=re.escape(hint) + "$"):
        load_config(None, [override])
    with pytest.raises(ConfigError, match=r"expected int, got float 3\.5$"):
        load_config(None, ["train.steps=3.5"])


def test_a_mistake_in_the_recipe_names_the_recipe_and_one_in_set_does_not(tmp_path):
    """A recipe with a misspelt section or a quoted number was refused with the --set
    message ("unknown config key 'trian'"), no word of the file: the user looked for it
    among their options. The recipe's own mistake now names it; an override's does not."""
    recipe = tmp_path / "mine.toml"
    recipe.write_text('[trian]\nsteps = 3\n')
    with pytest.raises(ConfigError, match=r"^.*mine\.toml: unknown config key 'trian'"):
        load_config(recipe)
    recipe.write_text('[train]\nsteps = "3"\n')
    with pytest.raises(ConfigError, match=r"mine\.toml: train\.steps: expected int"):
        load_config(recipe)
    load_config(recipe, ["train.steps=3"])  # the override mends it
    recipe.write_text('[train]\nsteps = 3\n')
    with pytest.raises(ConfigError) as e:
        load_config(recipe, ["train.stepz=3"])
    assert str(e.value).startswith("unknown config key 'train.stepz'"), e.value


@pytest.mark.parametrize("given, items", [("it's here", ["it's here"]), ('"é"', ["é"]),
                                          ("[a, b]", ["a", "b"])])
def test_the_suggested_list_override_pastes_into_a_shell_and_loads(given, items):
    """`--set data.sources=it's here` was answered `--set 'data.sources=["it's here"]'`: the
    apostrophe ends the shell's quote, so the command pasted failed again; an accented
    prompt was shown as \\u00e9. The suggestion is quoted as a shell reads it, and loads."""
    import shlex

    key = "generate.prompts" if items == ["é"] else "data.sources"
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}={given}"])
    suggested = shlex.split(str(e.value).split("(on the command line: ")[1].removesuffix(")"))
    assert suggested[0] == "--set" and len(suggested) == 2, e.value
    assert "\\u" not in str(e.value)
    cfg = load_config(None, [suggested[1]])
    assert getattr(cfg, key.split(".")[0]).__dict__[key.split(".")[1]] == items


@pytest.mark.parametrize("sources", ['[""]', '["a", " "]'])
def test_an_empty_source_is_refused_by_name(tmp_path, sources):
    """`data.sources = [""]` (a template's blank) is Path(""), the current folder: it was
    read whole, or with the run dir below it refused as overlapping "entry ''". It is now
    refused as empty, naming the entry."""
    with pytest.raises(ConfigError, match=r"data\.sources\[\d\] is empty"):
        load_config(None, [f"data.sources={sources}", f'run.dir="{tmp_path / "run"}"'])


@pytest.mark.parametrize("override, message", [
    # TOML's integers are 64-bit: tomllib reads larger ones, which trained "forever"
    ("train.steps=10000000000000000000000", r"^train\.steps = 10,000,000,000,000,000,000,000 "
     r"is past the 64-bit integers TOML holds: from -2\*\*63 to 2\*\*63 - 1$"),
    (f"model.dim={2**63}", r"^model\.dim = 9,223,372,036,854,775,808 is past"),
    (f"model.top_k={-2**63 - 1}", r"^model\.top_k = -9,223,372,036,854,775,809 is past"),
    (f"prepare.arxiv.limit={2**70}", r"^prepare\.arxiv\.limit = .* is past"),
    # numpy's RandomState, which datatrove's MinHash seeds with, takes [0, 2**32)
    ("prepare.dedup_minhash.seed=-1",
     r"^prepare\.dedup_minhash\.seed must be in \[0, 2\*\*32\) .*, got -1$"),
    (f"prepare.dedup_minhash.seed={2**32}", r"^prepare\.dedup_minhash\.seed must be in \[0, 2"),
    ("prepare.tasks=999999", r"^prepare\.tasks must be from 1 to 100,000 .*, got 999,999$"),
    ("prepare.workers=999999", r"^prepare\.workers must be from 1 to 100,000 .*, got 999,999$"),
    # token and popularity counts are >= 0: M1 labelled no document junk, or none control
    ("prepare.brain_rot_m1.junk_max_tokens=0",
     r"^prepare\.brain_rot_m1\.junk_max_tokens = 0 must be >= 1 \(.*\)$"),
    ("prepare.brain_rot_m1.popularity_threshold=-1",
     r"^prepare\.brain_rot_m1\.popularity_threshold = -1 must be >= 0 \(.*\)$"),
    ("prepare.brain_rot_m1.control_min_tokens=-1",
     r"^prepare\.brain_rot_m1\.control_min_tokens = -1 must be >= 0 \(.*\)$"),
])
def test_numbers_no_run_can_use_are_refused_naming_the_key_and_range(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_the_largest_numbers_each_range_allows_load():
    load_config(None, [f"train.steps={2**63 - 1}", f"eval.max_batches={2**63 - 1}",
                       f"prepare.dedup_minhash.seed={2**32 - 1}", "prepare.dedup_minhash.seed=0",
                       "prepare.tasks=100000", "prepare.workers=100000",
                       "prepare.brain_rot_m1.junk_max_tokens=1",
                       "prepare.brain_rot_m1.popularity_threshold=0",
                       "prepare.brain_rot_m1.control_min_tokens=0"])


def test_a_float_for_an_integer_past_64_bits_suggests_no_integer_refused_next():
    """`train.steps=1e22` was told to write train.steps=10000000000000000000000 instead."""
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.steps=1e22"])
    assert str(e.value) == ("train.steps: expected int, got float 1e+22 (an integer in TOML "
                            "has no point or exponent, and is at most 2**63 - 1)")
