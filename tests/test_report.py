"""The run report: tolerant metric reading, a complete page, and a partial one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kiln.report import build_report, read_metrics
from kiln.report.fmt import fmt_count, fmt_duration, fmt_flops

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ["loss", "bpb", "throughput", "lr"]


def _write_jsonl(path: Path, records: list[dict], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")


def _train(step: int, loss: float, tokens_per_s: float = 1000.0) -> dict:
    return {
        "kind": "train", "step": step, "loss": loss, "lr": 1e-3 * min(1.0, step / 5),
        "grad_norm": 1.0, "tokens": step * 512, "tokens_per_s": tokens_per_s,
        "elapsed_s": step * 0.5,
    }  # fmt: skip


def _val(step: int, bpb: float) -> dict:
    return {
        "kind": "val",
        "step": step,
        "val_loss": bpb * 0.9,
        "val_bpb": bpb,
        "tokens": step * 512,
    }


def _full_run(run: Path) -> None:
    records = []
    for step in range(1, 21):
        # throughput 100 early, 300 later: the last-half mean must be exactly 300
        records.append(_train(step, 5.0 - 0.1 * step, 100.0 if step < 10 else 300.0))
        if step % 5 == 0:
            records.append(_val(step, 3.0 - 0.05 * step))
    records.append({"kind": "checkpoint", "step": 20, "path": "checkpoints/20"})
    _write_jsonl(run / "metrics.jsonl", records)
    (run / "export").mkdir()
    (run / "export" / "kiln_export.json").write_text(
        json.dumps({"format": "hf-llama", "checkpoint": "step_00000020"}))
    (run / "config.toml").write_text(
        '[model]\ndim = 256\nn_layers = 4\nn_heads = 8\n\n[train]\nsteps = 20\nprecision = "bf16"\n'
    )
    (run / "env.json").write_text(json.dumps({
        "git_hash": "abc1234", "python": "3.11.7", "torch": "2.5.1",
        "platform": "Linux-x86_64", "device": "cpu", "versions": {"numpy": "1.26.4"},
    }))  # fmt: skip
    (run / "model.json").write_text(
        json.dumps({"params": 21_300_000, "params_non_embedding": 4_000_000,
                    "flops_per_token": 1_200_000_000})
    )  # fmt: skip
    (run / "prepare.json").write_text(
        json.dumps({"documents_in": 1200, "documents_out": 1100, "skipped": {"too_short": 100}})
    )
    (run / "tokens").mkdir()
    (run / "tokens/index.json").write_text(json.dumps({
        "dtype": "uint16", "vocab_size": 8192, "eos_id": 0, "unigram_bpb": 2.75,
        "train": {"documents": 1000, "tokens": 400_000, "bytes": 1_600_000, "shards": ["a", "b"]},
        "val": {"documents": 100, "tokens": 40_000, "bytes": 160_000, "shards": ["c"]},
    }))  # fmt: skip
    (run / "eval.json").write_text(json.dumps({
        "split": "val", "loss": 1.8, "perplexity": math.exp(1.8), "bpb": 2.1,
        "tokens": 40_000, "unigram_bpb": 2.75,
    }))  # fmt: skip
    (run / "samples.json").write_text(json.dumps([
        {"prompt": "Once upon", "completion": " a time <script>alert(1)</script> & more\x00\x1b\x85",
         "temperature": 0.8, "top_k": 50, "top_p": 0.95},
    ]))  # fmt: skip


def test_read_metrics_skips_truncated_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    _write_jsonl(path, [_train(1, 4.0), _train(2, 3.5)], tail='{"kind": "train", "step": 3, "lo')
    records = read_metrics(path)
    assert [r["step"] for r in records] == [1, 2]
    assert records[1]["loss"] == 3.5


def test_read_metrics_skips_lines_python_cannot_hold_as_json(tmp_path: Path) -> None:
    """Damaged lines Python's json refuses with other errors than a decode error (a value
    of 5,000 digits: ValueError; 100,000 nested arrays: RecursionError) failed the whole
    report; they are skipped as any unreadable line is."""
    path = tmp_path / "metrics.jsonl"
    _write_jsonl(path, [_train(1, 4.0)], tail='{"kind": "train", "step": 2, "loss": '
                 + "9" * 5000 + "}\n" + "1" * 5000 + "\n" + "[" * 100_000 + "\n"
                 + json.dumps(_train(3, 3.5)) + "\n")
    assert [(r["step"], r["loss"]) for r in read_metrics(path)] == [(1, 4.0), (3, 3.5)]
    (tmp_path / "eval.json").write_text("[" * 100_000)
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "3.5000" in page and "eval.json unreadable: maximum recursion depth" in page


def test_read_metrics_keeps_a_record_whose_kind_is_no_name(tmp_path: Path) -> None:
    """A line edited by hand with a list or an object as its kind: its (kind, step) key was
    unhashable and the whole report failed with a TypeError traceback."""
    path = tmp_path / "metrics.jsonl"
    _write_jsonl(path, [_train(1, 4.0), {"kind": ["train"], "step": 2, "loss": 9.0},
                        {"kind": {"a": 1}, "step": 2}, _train(2, 3.5)])
    records = read_metrics(path)
    assert [(r["step"], r["loss"]) for r in records if r["kind"] == "train"] == [(1, 4.0), (2, 3.5)]
    assert "3.5000" in build_report(tmp_path).read_text(encoding="utf-8")

def test_read_metrics_resumed_run_keeps_last_record_per_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    first = [_train(s, 10.0 + s) for s in (1, 2, 3, 4)] + [_val(4, 9.0)]
    resumed = [_train(s, 1.0 * s) for s in (3, 4, 5)] + [_val(4, 2.5)]
    _write_jsonl(path, first + resumed)
    records = read_metrics(path)
    train = [(r["step"], r["loss"]) for r in records if r["kind"] == "train"]
    assert train == [(1, 11.0), (2, 12.0), (3, 3.0), (4, 4.0), (5, 5.0)]
    assert [r["val_bpb"] for r in records if r["kind"] == "val"] == [2.5]


def test_full_run_report_has_headlines_and_valid_pngs(tmp_path: Path) -> None:
    _full_run(tmp_path)
    out = build_report(tmp_path)
    assert out == tmp_path / "report.html"
    page = out.read_text(encoding="utf-8")
    assert "not available" not in page
    assert "3.0000" in page  # final train loss: 5.0 - 0.1 * 20
    assert "2.0000 (step 20)" in page  # best val bpb: 3.0 - 0.05 * 20
    assert "10.2K" in page  # total tokens: 20 * 512
    assert "<td>300</td>" in page  # mean tokens/s over steps 11..20, the last half
    assert "10.0s" in page  # training time to the last logged step
    assert "21.3M" in page and "1.2 GFLOP" in page
    assert "abc1234" in page and "numpy" in page
    assert "Beats the unigram baseline" in page
    assert "4.000" in page  # bytes per token in the shard table
    assert "n_heads = 8" in page and "bf16" in page
    assert "too_short" in page
    for name in PLOTS:
        png = tmp_path / "plots" / f"{name}.png"
        assert f'src="plots/{name}.png"' in page
        data = png.read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_MAGIC)
    assert not list(tmp_path.rglob("*.tmp-*"))


def test_report_with_only_metrics_says_what_is_missing(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "metrics.jsonl", [_train(1, 4.0), _train(2, 3.0)])
    page = build_report(tmp_path).read_text(encoding="utf-8")
    for name in ["config.toml", "env.json", "model.json", "prepare.json",
                 "tokens/index.json", "eval.json", "samples.json"]:  # fmt: skip
        assert f"not available ({name} missing)" in page
    assert "not available (no val records in metrics.jsonl)" in page
    assert (tmp_path / "plots/loss.png").read_bytes().startswith(PNG_MAGIC)
    assert not (tmp_path / "plots/bpb.png").exists()
    assert "3.0000" in page


def test_empty_run_dir_still_produces_a_report(tmp_path: Path) -> None:
    (tmp_path / "eval.json").write_text("{not json")
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "not available (metrics.jsonl missing)" in page
    assert "not available (eval.json unreadable" in page


def test_folder_that_is_not_a_run_is_refused_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileNotFoundError, match="nothing to report"):
        build_report(tmp_path)
    with pytest.raises(FileNotFoundError, match="nothing to report"):
        build_report(tmp_path / "missing")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_truncated_metrics_line_is_tolerated_by_the_report(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "metrics.jsonl", [_train(1, 4.0), _train(2, 3.25)], tail='{"kind": "tr')
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "3.2500" in page


def test_sample_text_is_escaped(tmp_path: Path) -> None:
    _full_run(tmp_path)
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more\u2400\u241b\\x85" in page
    # a sampled control token shows as a stand-in: no NUL makes the file "binary"
    assert not any(ord(c) < 32 and c not in "\t\n\r" or 0x7F <= ord(c) < 0xA0 for c in page)


def test_eval_that_loses_to_unigram_says_so(tmp_path: Path) -> None:
    (tmp_path / "eval.json").write_text(
        json.dumps({"split": "val", "bpb": 3.1, "unigram_bpb": 2.9})
    )
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "Does NOT beat the unigram baseline" in page


def test_number_formats() -> None:
    assert fmt_count(21_300_000) == "21.3M"
    assert fmt_flops(1.2e9) == "1.2 GFLOP"
    assert fmt_duration(3 * 3600 + 5 * 60 + 7) == "3h 05m 07s"


def _checkpoints(run: Path, *steps: int, latest: int) -> None:
    """Complete checkpoint folders (trainer.pt is written last) and the `latest` pointer."""
    for step in steps:
        (run / "checkpoints" / f"step_{step:08d}").mkdir(parents=True)
        (run / "checkpoints" / f"step_{step:08d}" / "trainer.pt").write_bytes(b"")
    (run / "checkpoints" / "latest").write_text(f"step_{latest:08d}\n")


def test_eval_from_an_older_checkpoint_says_so(tmp_path: Path) -> None:
    (tmp_path / "eval.json").write_text(json.dumps(
        {"split": "val", "bpb": 2.1, "unigram_bpb": 2.9, "checkpoint": "step_00000040"}))
    _checkpoints(tmp_path, 40, 60, latest=60)
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "step_00000040" in page and "latest checkpoint is step_00000060" in page
    (tmp_path / "checkpoints" / "latest").write_text("step_00000040\n")
    assert "latest checkpoint is" not in build_report(tmp_path).read_text(encoding="utf-8")


def test_staleness_follows_the_checkpoint_the_verbs_use(tmp_path: Path) -> None:
    """A damaged latest checkpoint moved aside (as the error advises): eval, generate and
    export fall back to the newest complete one, and so does the report's staleness check."""
    (tmp_path / "eval.json").write_text(json.dumps(
        {"split": "val", "bpb": 2.1, "unigram_bpb": 2.9, "checkpoint": "step_00000040"}))
    _checkpoints(tmp_path, 40, 60, latest=60)
    ckpts = tmp_path / "checkpoints"
    (ckpts / "step_00000060").rename(ckpts / "step_00000060.bad")
    assert "latest checkpoint is" not in build_report(tmp_path).read_text(encoding="utf-8")
    (ckpts / "step_00000080").mkdir()  # a write killed before trainer.pt: not a checkpoint
    assert "latest checkpoint is" not in build_report(tmp_path).read_text(encoding="utf-8")


def test_samples_and_export_from_an_older_checkpoint_say_so(tmp_path: Path) -> None:
    (tmp_path / "samples.json").write_text(json.dumps(
        [{"prompt": "def ", "completion": "f():", "checkpoint": "step_00000040"}]))
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "kiln_export.json").write_text(
        json.dumps({"format": "hf-llama", "checkpoint": "step_00000040"}))
    (tmp_path / "metrics.jsonl").write_text(json.dumps(_train(1, 4.0)) + "\n")
    _checkpoints(tmp_path, 40, 300, latest=300)
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "These samples are from step_00000040" in page and "`kiln generate`" in page
    assert "The exported weights are from step_00000040" in page and "hf-llama" in page
    (tmp_path / "checkpoints" / "latest").write_text("step_00000040\n")
    assert "are from step_00000040" not in build_report(tmp_path).read_text(encoding="utf-8")


def test_best_val_bpb_skips_a_diverged_nan(tmp_path: Path) -> None:
    from kiln.report.summary import summarize

    for order in ([_val(10, math.nan), _val(20, 3.0)], [_val(20, 3.0), _val(10, math.nan)]):
        summary = summarize(order)
        assert (summary.best_val_bpb, summary.best_val_step) == (3.0, 20)
    assert summarize([_val(10, 0.0), _val(20, 3.0)]).best_val_bpb == 0.0


def test_eval_on_the_train_split_is_not_judged_against_the_val_baseline(tmp_path: Path) -> None:
    (tmp_path / "eval.json").write_text(
        json.dumps({"split": "train", "bpb": 3.1, "unigram_bpb": 2.9}))
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "unigram baseline" in page and "Does NOT beat" not in page
    assert "Evaluated on the train split" in page


def test_the_token_table_lists_the_splits_and_nothing_else(tmp_path: Path) -> None:
    _full_run(tmp_path)
    index = json.loads((tmp_path / "tokens/index.json").read_text())
    index["made_from"] = {"documents": "cec8c24d63a67cd6", "format": 2}
    (tmp_path / "tokens/index.json").write_text(json.dumps(index))
    page = build_report(tmp_path).read_text(encoding="utf-8")
    shards = page[page.index("Token shards"):]
    shards = shards[:shards.index("</section>")]
    assert "<td>train</td>" in shards and "<td>val</td>" in shards
    assert "made_from" not in shards and "cec8c24d" not in shards


def test_an_export_from_before_kiln_recorded_its_checkpoint_is_not_missing(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(json.dumps(_train(1, 4.0)) + "\n")
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text("{}")
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "exported before Kiln recorded its checkpoint" in page
    assert "kiln_export.json missing" not in page


def test_an_export_folder_without_a_model_or_with_a_damaged_record_is_not_an_old_export(
        tmp_path: Path) -> None:
    """An export/ holding only the user's model card, or a kiln_export.json that does not
    parse, was said to hold "a model exported before Kiln recorded its checkpoint"."""
    (tmp_path / "metrics.jsonl").write_text(json.dumps(_train(1, 4.0)) + "\n")
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "README.md").write_text("my model card")
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "exported before Kiln recorded" not in page
    assert "not available (export/kiln_export.json missing)" in page
    (tmp_path / "export" / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "export" / "config.json").write_text("{}")
    (tmp_path / "export" / "kiln_export.json").write_text('{"format": "hf-llama", "check')
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "exported before Kiln recorded" not in page
    assert "not available (export/kiln_export.json unreadable" in page


def test_late_throughput_is_tokens_over_training_time():
    """The second half's windows: 1000 tokens at 100/s (10 s) and 3000 tokens at 3000/s
    (1 s) are 4000 tokens in 11 s, not the 1550/s the mean of the two rates would say."""
    from kiln.report.summary import summarize

    records = [{"kind": "train", "step": s, "loss": 1.0, "tokens": t, "tokens_per_s": r}
               for s, t, r in [(10, 1000, 10.0), (20, 2000, 50.0), (30, 3000, 100.0),
                               (40, 6000, 3000.0)]]
    assert summarize(records).mean_tokens_per_s == pytest.approx(4000 / 11)


def test_a_series_of_one_record_is_drawn(tmp_path: Path) -> None:
    """A run killed after its first log (or train.steps <= log_every) has one point per
    curve: it must show in the PNG as a marker (a one-point line draws no pixel)."""
    import matplotlib.image

    from kiln.report.plots import Series, save_plot

    path = tmp_path / "loss.png"
    save_plot(path, "Train loss", "loss", [Series("loss", [10], [3.5])])
    pixels = matplotlib.image.imread(path)[..., :3]
    c0 = (0x1F / 255, 0x77 / 255, 0xB4 / 255)  # matplotlib's first line colour
    near = (abs(pixels[..., 0] - c0[0]) < 0.05) & (abs(pixels[..., 1] - c0[1]) < 0.05) \
        & (abs(pixels[..., 2] - c0[2]) < 0.05)
    assert near.sum() >= 10


def test_steps_logged_past_the_latest_checkpoint_are_noted(tmp_path: Path) -> None:
    """A killed run logged steps it never saved: the summary says a resume trains them again."""
    _write_jsonl(tmp_path / "metrics.jsonl", [_train(s, 5.0 - 0.1 * s) for s in range(1, 76)])
    _checkpoints(tmp_path, 40, 60, latest=60)
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "logged steps up to 75, but its latest checkpoint is step_00000060 (step 60)" in page
    _write_jsonl(tmp_path / "metrics.jsonl", [_train(s, 5.0 - 0.1 * s) for s in range(1, 61)])
    assert "logged steps up to" not in build_report(tmp_path).read_text(encoding="utf-8")


def test_a_run_training_now_is_not_read_as_a_killed_one(tmp_path: Path) -> None:
    """A report made mid-run (a trainer holds the run's lock): its steps past the latest
    checkpoint are its newest, not steps a resume would train again."""
    from kiln.run_dir import training_lock

    _write_jsonl(tmp_path / "metrics.jsonl", [_train(s, 5.0 - 0.1 * s) for s in range(1, 76)])
    _checkpoints(tmp_path, 40, 60, latest=60)
    with training_lock(tmp_path):
        page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "The run is training now (pid " in page
    assert "steps up to 75; its latest checkpoint is step_00000060 (step 60)" in page
    assert "was killed?" not in page
    page = build_report(tmp_path).read_text(encoding="utf-8")  # the trainer gone: killed
    assert "training now" not in page and "was killed?" in page


def test_a_bool_step_is_no_step_to_any_reader(tmp_path: Path) -> None:
    """JSON `true` is an int to Python: read_metrics keeps such records as stepless, and the
    report's series and summary must not take them for step 1."""
    from kiln.report.metrics_io import records_of_kind
    from kiln.report.summary import summarize

    _write_jsonl(tmp_path / "metrics.jsonl",
                 [_train(1, 4.0), {"kind": "train", "step": True, "loss": 9.0}, _train(2, 3.0)])
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records_of_kind(records, "train")] == [1, 2]
    assert summarize(records).last_step == 2


def test_greedy_samples_say_greedy_not_their_unused_top_k_and_top_p(tmp_path: Path) -> None:
    (tmp_path / "samples.json").write_text(json.dumps([
        {"prompt": "a", "completion": "b", "temperature": 0.0, "decoding": "greedy"},
        {"prompt": "c", "completion": "d", "temperature": 0.0, "top_k": 50, "top_p": 0.9},
        {"prompt": "e", "completion": "f", "temperature": 0.8, "top_k": 50, "top_p": 0.9},
    ]))  # the second as `kiln generate` wrote greedy samples before
    (tmp_path / "metrics.jsonl").write_text(json.dumps(_train(1, 4.0)) + "\n")
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "<h3>Sample 1 — greedy</h3>" in page and "<h3>Sample 2 — greedy</h3>" in page
    assert "<h3>Sample 3 — temperature 0.8, top_k 50, top_p 0.9</h3>" in page


def test_samples_that_utf8_cannot_hold_or_of_other_types_still_make_a_report(tmp_path: Path) -> None:
    """samples.json may hold a lone surrogate (JSON's "\\ud800": a prompt cut inside a pair)
    and, edited by hand, a checkpoint that is not a name: the report failed on both with a
    traceback (UnicodeEncodeError writing the page; a list is no set member)."""
    _full_run(tmp_path)
    (tmp_path / "samples.json").write_text(
        '[{"prompt": "half \\ud83d", "completion": " <b>\\udc80", "checkpoint": "step_00000020"},'
        ' {"prompt": "x", "completion": "y", "checkpoint": ["step_00000020"]}]')
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "<b>half \\ud83d</b> &lt;b&gt;\\udc80</pre>" in page
    assert "<h3>Sample 2</h3>" in page


def test_a_run_on_a_filesystem_without_locks_is_reported(tmp_path: Path, monkeypatch) -> None:
    """A run dir on a filesystem that takes no flock (NFS without its lock service: ENOLCK)
    holding a .train.lock: asking whether a trainer holds it failed the whole report with
    a traceback. No trainer can hold a lock there: the run is not said to be training."""
    import errno
    import fcntl

    _write_jsonl(tmp_path / "metrics.jsonl", [_train(s, 5.0 - 0.1 * s) for s in range(1, 76)])
    _checkpoints(tmp_path, 40, 60, latest=60)
    (tmp_path / ".train.lock").write_text("pid 1 on elsewhere", encoding="utf-8")

    def no_locks(f, how):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "training now" not in page and "was killed?" in page
