"""Settings that could only fail inside a datatrove task, after the stages before it ran, are
refused when the pipeline is built: the scoring model's context, the judge's prompt, the M1
tokenizer file, the scoring device."""

import pytest
import torch
from test_filters_perplexity import run_dir  # noqa: F401  (module fixture: max_seq_len 48)

from kiln.config import ConfigError
from kiln.data import prepare_config as pc
from kiln.data.pipeline import PrepareConfig, build_pipeline, run_prepare


def _perplexity(run, **options) -> PrepareConfig:
    return PrepareConfig(stages=["read", "quality", "perplexity", "write"],
                         perplexity=pc.PerplexityOptions(run_dir=str(run), **options))


def test_max_tokens_per_doc_past_the_models_context_fails_before_any_stage(tmp_path,
                                                                          run_dir):  # noqa: F811
    run, _, _ = run_dir
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("some text to read\n")
    with pytest.raises(ConfigError) as e:
        run_prepare(_perplexity(run, max_tokens_per_doc=49), tmp_path / "out", [str(src)],
                    progress=False)
    msg = str(e.value)
    assert "prepare.perplexity.max_tokens_per_doc = 49" in msg and "max_seq_len 48" in msg
    assert "at most 48" in msg and str(run) in msg
    assert not (tmp_path / "out" / "logs" / "prepare").exists()  # no stage ran
    build_pipeline(_perplexity(run, max_tokens_per_doc=48), tmp_path / "out")  # fits: built


def test_a_device_the_tasks_cannot_use_fails_when_built(tmp_path, run_dir):  # noqa: F811
    run, _, _ = run_dir
    with pytest.raises(ConfigError, match="prepare.perplexity.device: 'gpu0'"):
        build_pipeline(_perplexity(run, device="gpu0"), tmp_path / "out")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="prepare.perplexity.device = 'cuda'"):
            build_pipeline(_perplexity(run, device="cuda"), tmp_path / "out")


def test_a_judge_prompt_longer_than_the_models_context_fails_when_built(tmp_path,
                                                                       run_dir):  # noqa: F811
    run, _, _ = run_dir  # the paper's M2 prompt is ~100 tokens: more than 48
    cfg = PrepareConfig(stages=["read", "brain_rot_m2", "write"],
                        brain_rot_m2=pc.BrainRotM2Options(judge=f"kiln:{run}"))
    with pytest.raises(ConfigError, match=r"prepare.brain_rot_m2.judge = 'kiln:.*max_seq_len 48"):
        build_pipeline(cfg, tmp_path / "out")


def test_an_m1_tokenizer_that_does_not_load_fails_when_built(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("not a tokenizer")
    cfg = PrepareConfig(stages=["read", "brain_rot_m1", "write"],
                        brain_rot_m1=pc.BrainRotM1Options(tokenizer=str(bad)))
    with pytest.raises(ConfigError, match="prepare.brain_rot_m1.tokenizer: .*tokenizer.json"):
        build_pipeline(cfg, tmp_path / "out")
