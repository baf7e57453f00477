"""The benchmark scripts run in their quick modes, end with a well-formed RESULT line whose
keys benchmarks/README.md names, and measure what they say: a checkpoint save without the
imports it pulls in, a read of a text file that is valid UTF-8, a GPU check that stops
before it runs anything it cannot finish."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
import common  # noqa: E402
import gpu_train_check  # noqa: E402
import read_memory  # noqa: E402

RESULT = re.compile(r"RESULT( [a-z][a-z0-9_]*=-?(\d+(\.\d*)?|\.\d+)(e[-+]?\d+)?)+")


def result_keys(out: str) -> list[str]:
    """The keys of the RESULT line `out` ends with; fails unless it is the last line and
    every value is a plain number."""
    last = out.strip().splitlines()[-1]
    assert RESULT.fullmatch(last), f"not a RESULT line of plain numbers: {last!r}"
    return [pair.split("=")[0] for pair in last.split()[1:]]


def readme_section(script: str) -> str:
    """The script's row of benchmarks/README.md's table, or its own section."""
    text = (BENCH / "README.md").read_text(encoding="utf-8")
    for line in text.splitlines():
        if line.startswith(f"| `{script}"):
            return line
    return text.split(f"## {script}", 1)[1].split("\n## ", 1)[0]


def undocumented(keys: list[str], section: str) -> list[str]:
    """Keys the section names neither as they are nor through a `<placeholder>` pattern."""
    names = set(re.findall(r"`([a-z0-9_<>]+)`", section))
    patterns = [re.compile(re.sub(r"<[a-z]+>", "[a-z0-9_]+", n)) for n in names if "<" in n]
    return [k for k in keys if k not in names and not any(p.fullmatch(k) for p in patterns)]


def test_result_line_prints_plain_numbers():
    line = common.result_line(bf16=True, n=3, x=0.123456, big=12345.6)
    assert line == "RESULT bf16=1 n=3 x=0.1235 big=12346"
    assert result_keys(line) == ["bf16", "n", "x", "big"]


def test_the_key_check_reads_placeholders():
    section = "| `kv_cache.py` | ... | `speedup_vs_cat_<n>`, `threads` |"
    assert undocumented(["speedup_vs_cat_64", "threads", "other"], section) == ["other"]


@pytest.mark.parametrize("script,argv", [
    ("moe_layer.py", ["--quick"]),
    ("muon_step.py", ["--quick"]),
    ("kv_cache.py", ["--quick", "--rounds", "1"]),
    ("load_memory.py", ["--quick", "--rounds", "1"]),
    ("pii_eval.py", []),
    ("shard_hashing.py", ["--tokens", "200000"]),
    ("read_memory.py", ["--mb", "1", "--kinds", "txt,json"]),
    ("minhash_cluster.py", ["--dups", "3000", "--rounds", "1"]),
])
def test_quick_mode_ends_with_documented_result(script, argv, monkeypatch, capsys):
    module = importlib.import_module(script.removesuffix(".py"))
    monkeypatch.setattr(sys, "argv", [script, *argv])
    threads = torch.get_num_threads()
    try:
        module.main()
    finally:
        torch.set_num_threads(threads)
    keys = result_keys(capsys.readouterr().out)
    assert not undocumented(keys, readme_section(script)), f"{script}: README lacks them"


def written_keys(source: str) -> list[str]:
    """RESULT keys a script names literally: `result_line`'s keyword arguments and the
    `name=` of an f-string starting "RESULT " (keys built at run time are left out)."""
    keys = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "result_line":
            keys += [k.arg for k in node.keywords if k.arg]
        elif isinstance(node, ast.JoinedStr):
            parts = [v.value for v in node.values if isinstance(v, ast.Constant)]
            if parts and parts[0].startswith("RESULT "):
                keys += [m for p in parts for m in re.findall(r"([a-z][a-z0-9_]*)=$", p)]
    return keys


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_every_benchmark_imports_and_documents_its_keys(path):
    """Imports break where a script no test runs calls a renamed kiln function; keys the
    README does not name leave a reader of `grep ^RESULT` guessing."""
    importlib.import_module(path.stem)
    keys = written_keys(path.read_text(encoding="utf-8"))
    if keys:
        assert not undocumented(keys, readme_section(path.name)), path.name


def test_written_keys_finds_both_forms():
    src = 'print(result_line(a=1, b_2=x))\nprint(f"RESULT c={c:.2f} d_e={d} "\n      f"f={f}")'
    assert written_keys(src) == ["a", "b_2", "c", "d_e", "f"]


def test_step_profile_and_throughput_keys_are_documented():
    """Their keys as the scripts build them (both run in their own tests)."""
    throughput_keys = ["speedup_vs_hf", "peak_fraction", "peak_fraction_vs_best",
                       "floor_fraction", "hf_over_floor", "bf16", "batch", "mfu", "hf_mfu",
                       "params", "speedup_vs_hf_bf16", "hf_eager_over_sdpa_fp32",
                       "kiln_tokens_per_s_fp32", "round_ratio_min_bf16"]
    assert not undocumented(throughput_keys, readme_section("throughput.py"))
    step_keys = ["step_ms", "op_ms", "gemm_ms", "gemm_share", "bf16"]
    assert not undocumented(step_keys, readme_section("step_profile.py"))


def test_checkpoint_save_measures_the_save_not_the_imports(tmp_path):
    """A 2 MB save adds ~1 MB over the tensors; the modules `_save` imported once counted
    as ~50 MB of it (and ~0.5 s), in both variants alike. The script as run, its children
    spawned by its own small parent (from pytest's, ru_maxrss hid any extra)."""
    out = subprocess.run(
        [sys.executable, str(BENCH / "checkpoint_save.py"), "--mb", "2", "--repeats", "1",
         "--dir", str(tmp_path)], check=True, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")}).stdout
    assert result_keys(out)
    got = dict(pair.split("=") for pair in out.strip().splitlines()[-1].split()[1:])
    assert 0 < float(got["hashed_extra_mb"]) < 16, got
    assert 0 < float(got["read_back_extra_mb"]) < 16, got
    assert not list(tmp_path.iterdir())  # each save's folder removed


def test_a_childs_peak_memory_is_its_own():
    """A child of this (pytest) process reads its own peak, not this one's: ru_maxrss
    carries a parent's peak through fork and exec, VmHWM starts afresh. The child's own
    peak is torch's import: ~220 MB for the CPU build, ~510 MB for PyPI's CUDA build."""
    big = torch.ones(400 * 2**20)  # 1.6 GB touched here, in the parent
    code = (f"import resource, sys; sys.path.insert(0, {str(BENCH)!r}); import common; "
            "print(common.peak_rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    own, inherited = map(float, out.split())
    big_mb = big.numel() * 4 / 2**20
    assert 0 < own < big_mb / 2 < big_mb <= inherited


def test_text_files_end_on_a_character(tmp_path):
    """Sizes that fall inside a multi-byte character (5 MB did): the file is still UTF-8,
    at most 3 bytes short, so the reader reads it instead of skipping it."""
    block = read_memory.prose_block()
    inside = [n for n in range(1, 2000) if block[n] & 0xC0 == 0x80][:3]
    assert inside
    for n in inside + [len(block) + inside[0]]:
        path = tmp_path / f"{n}.txt"
        read_memory.write_text(path, n)
        data = path.read_bytes()
        data.decode("utf-8")
        assert n - 3 <= len(data) <= n


def test_a_skipped_file_is_no_measurement(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"text\xff\xfe more text")
    assert "not read" in read_memory.measure(bad)["error"]


def _no_runs(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"ran {args}")

    monkeypatch.setattr(gpu_train_check, "kiln", refuse)
    monkeypatch.setattr(gpu_train_check.subprocess, "Popen", refuse)


def _tokenized(tmp_path: Path) -> Path:
    (tmp_path / "tokens").mkdir(parents=True)
    (tmp_path / "tokens" / "index.json").write_text("{}")
    return tmp_path


def test_gpu_check_stops_before_running_without_a_gpu(tmp_path, monkeypatch, capsys):
    _no_runs(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device is visible"):
        gpu_train_check.main([str(_tokenized(tmp_path))])


@pytest.mark.parametrize("argv,message", [
    (["--steps", "60", "--every", "50", "--device", "cpu"], "--steps must leave room"),
    (["--device", "cpu"], "not a tokenized run directory"),
])
def test_gpu_check_checks_its_arguments_first(argv, message, tmp_path, monkeypatch, capsys):
    """Checked after the reference run (minutes of a GPU session), or not at all."""
    _no_runs(monkeypatch)
    run = _tokenized(tmp_path / "run") if "--steps" in argv else tmp_path
    with pytest.raises(SystemExit):
        gpu_train_check.main([str(run), *argv])
    assert message in capsys.readouterr().err


def test_report_long_run_times_rounds_after_a_warm_up(tmp_path, monkeypatch, capsys):
    """The report was timed once, its first call (matplotlib's fonts loaded in it) against
    one plain pass: no warm-up, no repetition. Now an untimed report of a small run, then
    each contender once a round."""
    import report_long_run

    calls: list[str] = []
    real = report_long_run.build_report
    monkeypatch.setattr(report_long_run, "build_report",
                        lambda run: calls.append(run.name) or real(run))
    monkeypatch.setattr(sys, "argv", ["report_long_run.py", "--records", "1000", "--rounds", "2",
                                      "--dir", str(tmp_path)])
    report_long_run.main()
    assert calls == ["warm", "run", "run"]
    out = capsys.readouterr().out
    assert "median of 2 rounds" in out
    assert not undocumented(result_keys(out), readme_section("report_long_run.py"))


def test_tokenizer_benchmark_counts_each_tokenizers_single_tokens(tmp_path):
    """The math tokenizer's count of seeded commands kept whole was printed as all of them,
    never counted; a tokenizer without them counts none."""
    import tokenizer_bytes_per_token as bench

    from kiln.data.math_tokenizer import MATH_SEED_COMMANDS, train_math_tokenizer
    from kiln.data.tokenizer import train_tokenizer

    texts = list(bench.read_tex(bench.DEFAULT_DIRS[:1]).values()) * 2
    plain = train_tokenizer(texts, 600, tmp_path / "bpe.json", show_progress=False)
    math = train_math_tokenizer(texts, 600, tmp_path / "math.json", show_progress=False)
    assert bench.single_tokens(math) == len(MATH_SEED_COMMANDS)
    assert bench.single_tokens(plain) < len(MATH_SEED_COMMANDS)


def test_load_memory_alternates_which_way_loads_first(monkeypatch, capsys):
    """Every round loaded the CPU build first and the meta one second (after it, the
    checkpoint's pages freshly read): now A B, then B A."""
    import load_memory

    order: list[str] = []

    def child(way, ckpt, shape):
        order.append(way)
        return {"s": 1.0, "load_mb": 1.0, "digest": 0.0}

    monkeypatch.setattr(load_memory, "run_child", child)
    monkeypatch.setattr(sys, "argv", ["load_memory.py", "--quick", "--rounds", "2"])
    load_memory.main()
    assert order == ["cpu", "meta", "meta", "cpu"]


def test_trinity_vs_dense_quick_settings_load_for_both_recipes():
    """--quick's overrides are valid settings of both recipes (a typo would fail only after
    the first run's prepare), and leave log records in the second half of the steps, which
    the tokens/s ratio is read from."""
    import trinity_vs_dense

    from kiln.config import load_config

    for name in trinity_vs_dense.RECIPES:
        cfg = load_config(ROOT / "recipes" / f"{name}.toml", trinity_vs_dense.QUICK)
        t = cfg.train
        assert t.steps <= 20 and t.global_batch <= 4 and cfg.data.max_bytes > 0
        assert t.steps // t.log_every >= 4  # two records or more past the middle


def test_trinity_vs_dense_gives_its_runs_the_threads_asked_for(monkeypatch):
    """--threads reaches each `kiln` subprocess as OMP_NUM_THREADS; without it the
    environment is left as it is."""
    import trinity_vs_dense

    seen = []

    def fake_run(cmd, **kw):
        seen.append(kw.get("env"))
        return subprocess.CompletedProcess(cmd, 0, stdout="")

    monkeypatch.setattr(trinity_vs_dense.subprocess, "run", fake_run)
    trinity_vs_dense.kiln("report", "x", threads=1)
    trinity_vs_dense.kiln("report", "x")
    assert seen[0]["OMP_NUM_THREADS"] == "1" and seen[1] is None
