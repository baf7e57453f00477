"""The `kiln` command end to end: a tiny `kiln run`, and config errors at the command line."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY

REPO = Path(__file__).resolve().parents[1]


def kiln(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "kiln.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_quickstart_smoke_run(tmp_path):
    """`kiln run recipes/quickstart.toml` with a few steps: every stage leaves its output."""
    run_dir = tmp_path / "qs"
    sets = [a for kv in [*TINY, "train.steps=8", f'run.dir="{run_dir}"'] for a in ("--set", kv)]
    out = kiln("run", str(REPO / "recipes/quickstart.toml"), *sets, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    for name in ("prepare.json", "tokenizer/tokenizer.json", "tokens/index.json", "config.toml",
                 "env.json", "metrics.jsonl", "eval.json", "samples.json", "report.html",
                 "plots/loss.png", "export/config.json", "export/model.safetensors"):
        assert (run_dir / name).exists(), name
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["bpb"] > 0 and result["tokens"] > 0 and result["bytes_counted"] == "exact"
    exported = json.loads((run_dir / "export/kiln_export.json").read_text())
    assert exported == {"format": "hf-llama", "checkpoint": "step_00000008"}
    samples = json.loads((run_dir / "samples.json").read_text())
    assert [s["prompt"] for s in samples] == ["def ", "import os\n", "The "]
    assert {s["checkpoint"] for s in samples} == {"step_00000008"}  # which model wrote them
    html = (run_dir / "report.html").read_text()
    assert "plots/loss.png" in html and "bits" in html.lower()
    # each verb also runs alone on the run directory
    (run_dir / "report.html").unlink()
    inside = kiln("report", ".", cwd=run_dir)  # a made run is read from inside it too
    assert inside.returncode == 0 and (run_dir / "report.html").is_file(), inside.stderr[-2000:]
    refused = kiln("prepare", "--set", "run.dir=.", cwd=run_dir / "plots")  # making one is not
    assert refused.returncode == 2 and "is the current folder" in refused.stderr
    assert all(p.suffix == ".png" for p in (run_dir / "plots").iterdir())  # nothing made there
    assert (result["seq_len"], result["precision"]) == (32, "fp32")
    again = kiln("eval", str(run_dir), "--set", "eval.max_batches=2", "--set", "train.seq_len=16",
                 cwd=tmp_path)
    assert again.returncode == 0 and "bits/byte" in again.stdout
    assert "scored with 16-token windows; the model trained on 32" in again.stderr
    assert json.loads((run_dir / "eval.json").read_text())["seq_len"] == 16
    # a command that fails, or only reads the run, leaves the run's recorded config alone
    recorded = (run_dir / "config.toml").read_text()
    failed = kiln("train", str(run_dir), "--set", "model.dim=128", cwd=tmp_path)
    assert failed.returncode == 2 and "other settings (model.dim: 64 -> 128)" in failed.stderr
    assert "Traceback" not in failed.stderr
    report_made = (run_dir / "report.html").stat().st_mtime_ns
    rerun = kiln("run", str(run_dir), "--set", "model.dim=128", cwd=tmp_path)  # before prepare
    assert rerun.returncode == 2 and "other settings (model.dim: 64 -> 128)" in rerun.stderr
    assert "prepare:" not in rerun.stdout + rerun.stderr
    assert (run_dir / "report.html").stat().st_mtime_ns == report_made
    assert (run_dir / "config.toml").read_text() == recorded
    assert "max_batches = 2" not in recorded  # the eval above did not record its override
    # the data a checkpoint was trained on is not re-made with other settings ...
    index = (run_dir / "tokens/index.json").read_text()
    remake = kiln("tokenize", str(run_dir), "--set", "data.val_fraction=0.1", cwd=tmp_path)
    assert remake.returncode == 2 and "data.val_fraction: 0.05 -> 0.1" in remake.stderr
    assert (run_dir / "tokens/index.json").read_text() == index
    # ... while re-running with the same settings re-makes the same data
    same = kiln("tokenize", str(run_dir), cwd=tmp_path)
    assert same.returncode == 0, same.stderr[-2000:]
    assert (run_dir / "tokens/index.json").read_text() == index
    # `kiln run` again: the tokenizer and shards made from the same inputs are kept
    made = {p: p.stat().st_mtime_ns for p in [run_dir / "tokenizer/tokenizer.json",
                                                *(run_dir / "tokens").iterdir()]}
    rerun = kiln("run", str(REPO / "recipes/quickstart.toml"), *sets, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "tokenizer: kept" in rerun.stdout and "tokenize: kept" in rerun.stdout
    assert "nothing to train" in rerun.stderr + rerun.stdout
    assert {p: p.stat().st_mtime_ns for p in made} == made
    # --fresh moves the old model's checkpoints and outputs aside, but only once the new
    # settings are accepted
    refused = kiln("train", str(run_dir), "--fresh", "--set", "train.device=cuda", cwd=tmp_path)
    assert refused.returncode == 2 and "no CUDA device" in refused.stderr
    assert not (run_dir / "archive").exists() and (run_dir / "eval.json").exists()
    fresh = kiln("train", str(run_dir), "--fresh", "--set", "train.steps=2", cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    (archived,) = (run_dir / "archive").iterdir()
    assert archived.name.startswith("before-fresh-")
    for name in ("checkpoints", "metrics.jsonl", "eval.json", "samples.json", "export",
                 "report.html"):
        assert (archived / name).exists(), name
    for name in ("eval.json", "samples.json", "export", "report.html"):  # the old model's
        assert not (run_dir / name).exists(), name
    assert (archived / "checkpoints/step_00000008").is_dir()
    assert (run_dir / "checkpoints/step_00000002").is_dir()
    # Ctrl-C: the step in flight ends and is checkpointed, and one line says how to go on
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln.cli", "train", str(run_dir), "--set", "train.steps=100000",
         "--set", "train.checkpoint_every=1000000"], cwd=tmp_path, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "OMP_NUM_THREADS": "2"},
        # a suite started in the background inherits an ignored SIGINT; a terminal's is not
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    metrics = run_dir / "metrics.jsonl"
    logged = len(metrics.read_text().splitlines())
    deadline = time.monotonic() + 120  # interrupt once it trains (two more steps logged)
    while time.monotonic() < deadline and len(metrics.read_text().splitlines()) < logged + 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    stopped = re.search(r"stopped on SIGINT after step (\d+)", err)
    assert stopped and "Traceback" not in err, err[-2000:]
    assert (run_dir / f"checkpoints/step_{int(stopped[1]):08d}").is_dir()  # the step it stopped at


def test_user_mistakes_are_one_line_errors(tmp_path):
    binary = tmp_path / "model.safetensors"
    binary.write_bytes(b"\xff\xfe\x00binary")
    out = kiln("train", str(binary), cwd=tmp_path)
    assert out.returncode == 2 and "not a TOML recipe" in out.stderr
    (tmp_path / "notes.txt").write_text("x")
    out = kiln("prepare", "--set", 'run.dir="notes.txt"', cwd=tmp_path)
    assert out.returncode == 2 and "is a file" in out.stderr
    out = subprocess.run([sys.executable, "-m", "kiln.cli", "train", "--set",
                          f'run.dir="{tmp_path / "r"}"'], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "WORLD_SIZE": "2"}, timeout=120)
    assert out.returncode == 2 and "RANK is not" in out.stderr
    run = tmp_path / "run"
    (run / "tokenizer").mkdir(parents=True)
    (run / "tokenizer/tokenizer.json").write_text("{}")
    out = kiln("tokenize", "--set", f'run.dir="{run}"', cwd=tmp_path)
    assert out.returncode == 1 and "re-run `kiln tokenizer`" in out.stderr
    from kiln.run_dir import training_lock

    with training_lock(run):  # a second trainer on a run being trained is refused
        out = kiln("train", "--set", f'run.dir="{run}"', cwd=tmp_path)
    assert out.returncode == 1 and f"being trained by pid {os.getpid()}" in out.stderr
    out = kiln("eval", "nowhere", cwd=tmp_path)
    assert out.returncode == 2 and "no recipe or run directory at nowhere" in out.stderr
    for result in (out,):
        assert "Traceback" not in result.stderr


def test_config_error_exits_2_and_names_key(tmp_path):
    out = kiln("train", "--set", "train.stepz=3", cwd=tmp_path)
    assert out.returncode == 2
    assert "train.stepz" in out.stderr and "did you mean 'train.steps'" in out.stderr


def test_train_without_data_says_what_to_run(tmp_path):
    out = kiln("train", "--set", f'run.dir="{tmp_path / "empty"}"', cwd=tmp_path)
    assert out.returncode == 1
    assert "kiln tokenize" in out.stderr and "Traceback" not in out.stderr


def test_no_target_continues_the_recorded_run(tmp_path, monkeypatch):
    """`kiln train` with no target after the quickstart: the run in run.dir with its own
    recorded settings, not the built-in ones (which would differ and be recorded over it)."""
    from conftest import tiny_config

    from kiln.cli import resolve_config
    from kiln.config import ConfigError, load_config
    from kiln.run_dir import write_run_metadata

    monkeypatch.chdir(tmp_path)
    assert resolve_config(None, []) == load_config(None, [])  # nothing recorded: built-in
    cfg = tiny_config(Path("runs/quickstart"), "train.steps=77", "model.max_seq_len=4096")
    write_run_metadata(cfg)
    # train.seq_len 1024 fits the recorded max_seq_len, not the built-in 256
    resolved = resolve_config(None, ["train.eval_every=5", "train.seq_len=1024"])
    assert resolved.train.steps == 77 and resolved.train.eval_every == 5
    assert resolved.run_dir.resolve() == (tmp_path / "runs/quickstart").resolve()
    # a run directory as the target with run.dir naming another is refused, not merged
    with pytest.raises(ConfigError, match="the target is the run directory runs/quickstart, "
                       "but --set run.dir=runs/other names another"):
        resolve_config("runs/quickstart", ["run.dir=runs/other"])
    # written as a table, it went past the check and trained in the other folder
    with pytest.raises(ConfigError, match="names another"):
        resolve_config("runs/quickstart", ['run={dir="runs/other"}'])
    # no target: a table's run.dir is the run whose recorded settings are used
    assert resolve_config(None, ['run={dir="runs/quickstart"}']).train.steps == 77
    same = resolve_config("runs/quickstart", [f"run.dir={tmp_path / 'runs/quickstart'}"])
    assert same.train.steps == 77  # the same folder spelled another way is fine


def test_kiln_run_reports_a_run_whose_later_stage_failed(tmp_path, monkeypatch):
    """A stage after training fails (here generate's config check): the report is still
    written, and the error still ends the command. Settings refused before training
    started leave nothing new to report."""
    from conftest import tiny_config

    from kiln.commands import run as run_chain
    from kiln.config import ConfigError

    reported = []
    for name in ("cmd_prepare", "cmd_tokenizer", "cmd_tokenize", "cmd_eval", "cmd_export",
                 "cmd_train"):
        monkeypatch.setattr(run_chain, name, lambda cfg: None)
    monkeypatch.setattr(run_chain, "record_config", lambda cfg: None)
    monkeypatch.setattr(run_chain, "cmd_report", lambda cfg: reported.append(cfg.run_dir))

    def refuse(cfg):
        raise ConfigError("generate.prompts: too long (simulated)")

    monkeypatch.setattr(run_chain, "cmd_generate", refuse)
    cfg = tiny_config(tmp_path / "run")
    with pytest.raises(ConfigError, match="simulated"):
        run_chain.cmd_run(cfg)
    assert reported == [cfg.run_dir]
    reported.clear()
    monkeypatch.setattr(run_chain, "cmd_train", refuse)
    with pytest.raises(ConfigError, match="simulated"):
        run_chain.cmd_run(cfg)
    assert reported == []


def test_only_a_lost_peer_is_reported_as_one(monkeypatch):
    """A collective that failed because another rank went away is one line; a failure to
    join the group here (a port in use) or a bug in this rank keeps its own error."""
    import torch.distributed as dist

    from kiln.parallel.distributed import lost_a_rank as _lost_a_rank

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert _lost_a_rank(RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer"))
    assert _lost_a_rank(dist.DistBackendError("NCCL error: remote process exited"))
    assert not _lost_a_rank(dist.DistNetworkError("The server socket has failed to listen: EADDRINUSE"))
    # rank 0 of a hand launch holds the store: its death, seen while waiting on the store
    assert _lost_a_rank(dist.DistNetworkError("Connection reset by peer"))
    assert _lost_a_rank(dist.DistNetworkError("Failed to recv, got 0 bytes. Connection was "
                                              "likely closed. Did the remote server shutdown?"))
    assert not _lost_a_rank(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not _lost_a_rank(RuntimeError("Connection reset by peer"))


def test_ctrl_c_while_starting_is_one_line(monkeypatch, capsys):
    """A Ctrl-C in the first second (torch still importing, before the verb's own handler)
    ends with one line and exit status 130, not a traceback."""
    import kiln.cli

    def interrupted(shown):
        raise KeyboardInterrupt

    monkeypatch.setattr(kiln.cli, "_show_warning", interrupted)
    assert kiln.cli.main(["eval", "nowhere"]) == 130
    assert capsys.readouterr().err.strip() == "kiln: interrupted while starting; nothing was changed"


def test_a_run_dir_the_user_may_not_write_is_one_line(tmp_path, monkeypatch, capsys):
    """Permission denied in any verb (the lock file, a temporary sibling, datatrove's
    cache) is one line naming the path, not a traceback. As root nothing is denied, so the
    verb's write is made to fail the way the kernel reports it."""
    from kiln import cli

    def denied(cfg):
        raise PermissionError(13, "Permission denied", str(tmp_path / "ro" / ".train.lock"))

    monkeypatch.setitem(cli.VERBS, "prepare", (denied, "read raw sources"))
    code = cli.main(["prepare", "--set", f'run.dir="{tmp_path / "ro"}"'])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert f"kiln: prepare: permission denied on {tmp_path / 'ro' / '.train.lock'}; make the " \
           "run directory writable" in err

    def unreadable_source(cfg):
        raise PermissionError(13, "Permission denied", str(tmp_path / "theirs.txt"))

    monkeypatch.setitem(cli.VERBS, "prepare", (unreadable_source, "read raw sources"))
    assert cli.main(["prepare", "--set", f'run.dir="{tmp_path / "ro"}"']) == 1
    err = capsys.readouterr().err
    assert "theirs.txt; check that path's permissions" in err and "run directory" not in err


def test_kiln_run_refuses_a_batch_the_ranks_cannot_share_before_the_data_stages(
        tmp_path, monkeypatch, capsys):
    """3 ranks and global_batch 16: one line, and nothing prepared first (on a real corpus
    the data stages take hours)."""
    from kiln.cli import main

    monkeypatch.setenv("WORLD_SIZE", "3")
    run = tmp_path / "run"
    assert main(["run", "recipes/quickstart.toml", "--set", f'run.dir="{run}"',
                 "--set", "train.global_batch=16"]) == 2
    err = capsys.readouterr().err
    assert "train.global_batch (16) must be divisible by the number of ranks (3)" in err
    assert not (run / "documents").exists() and not (run / "prepare.json").exists()


def test_every_missing_data_stage_is_named_at_once(tmp_path, capsys):
    from kiln.cli import main

    run = tmp_path / "empty"
    assert main(["train", "--set", f'run.dir="{run}"']) == 1
    err = capsys.readouterr().err
    assert "run `kiln tokenize` first" in err  # the stage's own line, then all of them
    assert "lacks the output of 3 stages: run `kiln prepare`, then `kiln tokenizer`, then " \
        "`kiln tokenize`" in err
    assert main(["tokenizer", "--set", f'run.dir="{run}"']) == 1
    assert "lacks the output" not in capsys.readouterr().err  # one stage: its line says it


def test_a_refused_recipe_is_said_once_under_torchrun(monkeypatch, capsys, tmp_path):
    """Every rank of a node loads the same recipe and refuses it alike: its local rank 0
    says so, the others exit with the same status in silence (torchrun would show the line
    once per rank). Another node's first rank still speaks (its disk may differ)."""
    from kiln.cli import main
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "4")
    for rank, local, said in (("0", "0", True), ("1", "1", False), ("2", "0", True)):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", local)
        assert main(["train", "--set", "train.lrr=1"]) == 2
        err = capsys.readouterr().err
        assert ("kiln: config error: unknown config key 'train.lrr'" in err) == said, (rank, err)


def test_python_dash_m_kiln_is_the_kiln_command(tmp_path):
    """`python -m kiln` (and so `torchrun -m kiln`) runs the CLI, exit codes included."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "kiln", "train", "--set", "model.n_embd=3"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "unknown config key 'model.n_embd' (did you mean 'model.dim'?)" in out.stderr


def test_kiln_run_refuses_a_prompt_longer_than_the_context_before_training(tiny_run, capsys):
    """A prompt of more tokens than model.max_seq_len was refused by generate, after the
    whole training run, and the export after it never ran: now refused once the tokenizer is
    made. The message names the prompt and the context, and adds '...' only to a cut one."""
    from kiln.cli import main

    long = "word " * 100
    code = main(["run", str(tiny_run), "--set", f'generate.prompts=["def ", "{long}"]'])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not (tiny_run / "checkpoints").exists() and not (tiny_run / "metrics.jsonl").exists()
    assert f"kiln: config error: generate.prompts: {long[:40]!r}... is " in err
    assert "leaves no room in the model's context (model.max_seq_len = 64): shorten it" in err
    assert main(["run", str(tiny_run), "--set", "model.max_seq_len=2", "--set",
                 "train.seq_len=2", "--set", 'generate.prompts=["def f"]']) == 2
    assert "generate.prompts: 'def f' is " in capsys.readouterr().err


def test_prepare_draws_no_progress_bar_into_a_log(tmp_path, capfd):
    """As `kiln tokenize`: off a terminal, neither Kiln's reader bar nor datatrove's own
    (exact dedup's) are drawn; the summary line is."""
    from conftest import tiny_config

    from kiln.cli import cmd_prepare

    cmd_prepare(tiny_config(tmp_path / "run", 'prepare.stages=["read", "dedup_exact", "write"]'))
    out = capfd.readouterr()
    assert "%|" not in out.err and "it/s" not in out.err and "Initializing pq" not in out.err
    assert out.out.startswith("prepare: {")


def test_tokenize_draws_no_progress_bar_into_a_log(tiny_run, capsys):
    """Off a terminal (a log file, a scheduler's output) a bar's redraws pile up as text, as
    `kiln tokenizer` already knows: only the summary line is written."""
    from conftest import tiny_config

    from kiln.cli import cmd_tokenize

    cmd_tokenize(tiny_config(tiny_run))
    out = capsys.readouterr()
    assert "doc/s" not in out.err and out.out.startswith("tokenize: train ")


def test_tokenize_on_a_terminal_counts_to_the_documents_prepare_wrote(tiny_run, capsys,
                                                                     monkeypatch):
    """A long tokenize shows how far it is (a count with an end, so an ETA), not a bare
    count of documents done."""
    from conftest import tiny_config

    from kiln.cli import cmd_tokenize

    documents = json.loads((tiny_run / "prepare.json").read_text())["documents_out"]
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    cmd_tokenize(tiny_config(tiny_run))
    assert f"{documents}/{documents}" in capsys.readouterr().err


def test_a_file_or_folder_inside_a_run_is_refused_naming_the_run(tmp_path, capsys):
    """`kiln report RUN/metrics.jsonl` (or a checkpoint folder, for any verb taking RUN) names
    the run directory to give, not "invalid TOML"; a recorded config.toml still loads."""
    from conftest import tiny_config

    from kiln.cli import main, resolve_config
    from kiln.run_dir import write_run_metadata

    run = tmp_path / "run"
    write_run_metadata(tiny_config(run))
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 4.0}\n')
    (run / "checkpoints" / "step_00000001").mkdir(parents=True)
    for verb in ("report", "eval", "generate", "export"):
        for inside in (run / "metrics.jsonl", run / "checkpoints" / "step_00000001"):
            assert main([verb, str(inside)]) == 2
            err = capsys.readouterr().err
            assert f"inside the run directory {run}" in err and "give that run directory" in err
    assert resolve_config(str(run / "config.toml"), []).run_dir == run


def test_a_rank_told_that_rank_zero_was_interrupted_stops_in_one_line(tmp_path, monkeypatch,
                                                                      capsys):
    """Rank 1 of a launch whose rank 0 was stopped by SIGTERM mid-checkpoint: one line
    saying so, and rank 0's exit status, not a traceback."""
    from kiln import cli
    from kiln.errors import MainRankInterrupted

    def told(cfg, resume=True):
        raise MainRankInterrupted("rank 0 was interrupted while it wrote checkpoint X", 143)

    monkeypatch.setattr(cli, "cmd_train", told)
    assert cli.main(["train", "--set", f'run.dir="{tmp_path / "run"}"']) == 143
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "kiln: train stopped: rank 0 was interrupted while it wrote checkpoint X; the "
        "checkpoints are written atomically; "
        f"`kiln train {shlex.quote(str(tmp_path / 'run'))}` resumes from the latest (starts, "
        "if none was saved yet)"]  # the run named: it said `kiln train RUN`



def test_training_stopped_on_a_signal_names_a_run_with_spaces_as_a_shell_reads_it(
        tmp_path, monkeypatch, capsys):
    """The line after a stop at a step boundary gave `kiln train /a run dir` unquoted: pasted,
    the shell split it into three paths. It is quoted as the other stop lines quote it."""
    from kiln import cli
    from kiln.errors import TrainingInterrupted

    run = tmp_path / "my run"

    def stopped(cfg, resume=True):
        raise TrainingInterrupted(3, "SIGINT", str(cfg.run_dir / "checkpoints"))

    monkeypatch.setattr(cli, "cmd_train", stopped)
    assert cli.main(["train", "--set", f'run.dir="{run}"']) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"kiln: train: training stopped on SIGINT after step 3; a checkpoint of that step is in "
        f"{run / 'checkpoints'}; `kiln train {shlex.quote(str(run))}` goes on from there"]
    assert shlex.split(err.split("`")[1]) == ["kiln", "train", str(run)]

def test_fresh_help_says_the_earlier_run_moves_to_the_archive():
    """`kiln train --help` said --fresh would "ignore existing checkpoints": they move (with
    the metrics, eval, samples, export and report) to archive/before-fresh-<time>/."""
    from kiln.cli import build_parser

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    text = " ".join(train.format_help().split())
    assert "archive/before-fresh-" in text and "ignore" not in text


def test_kiln_version_says_what_env_json_records(capsys):
    """`kiln --version` was refused (exit 2, a VERB is required); `kiln version` now points
    to it."""
    import torch

    import kiln
    from kiln.cli import main
    from kiln.run_dir import environment

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out.strip()
    env = environment()
    version = env["versions"]["kiln"] or kiln.__version__  # the package's metadata first
    assert out.startswith(f"kiln {version}") and f"torch {torch.__version__}" in out
    assert f"python {env['python']}" in out  # as the README and --help say
    git = env["git_hash"]
    assert (f"(git {git})" in out) == (git != "unknown")
    with pytest.raises(SystemExit) as done:
        main(["version"])
    assert done.value.code == 2 and "`kiln --version`" in capsys.readouterr().err


def test_version_help_names_every_fact_it_prints():
    """`kiln --help` said --version prints "Kiln's version, its git commit and torch's
    version"; it prints Python's too (the README says so), which the help left out."""
    from kiln.cli import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "--version" in text and "Python's" in text and "torch's" in text


def test_a_run_dir_that_cannot_be_made_names_run_dir(tmp_path, capsys):
    """run.dir = "/proc/x" was a bare `kiln: [Errno 2] No such file or directory: '/proc/x'`
    from deep in prepare."""
    from kiln.cli import main

    for verb in ("prepare", "run"):
        assert main([verb, "--set", 'run.dir="/proc/kiln-no-such/x"']) == 2
        err = capsys.readouterr().err
        assert "kiln: config error: run.dir: cannot make the folder /proc/kiln-no-such/x " \
               "(No such file or directory in /proc)" in err and "[Errno" not in err
    # the check makes a folder to know it can, and removes it: a command refused later
    # leaves none
    new = tmp_path / "new" / "run"
    assert main(["prepare", "--set", f'run.dir="{new}"',
                 "--set", f'data.sources=["{tmp_path / "missing"}"]']) == 1
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "new").exists()


def test_a_run_dir_this_user_may_not_write_is_refused_before_the_work(tiny_run, monkeypatch,
                                                                      capsys):
    """A run directory this user may not write (or on a read-only filesystem) is refused
    before training, naming run.dir (as root nothing is denied: `os.access` says it is)."""
    from kiln.cli import main

    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: False
                        if Path(path) == tiny_run and mode & os.W_OK else access(path, mode))
    assert main(["train", str(tiny_run)]) == 2
    err = capsys.readouterr().err
    assert f"kiln: config error: run.dir: {tiny_run} is not writable by this user" in err
    assert not (tiny_run / "checkpoints").exists()


def test_a_read_only_filesystem_met_in_a_verb_is_one_line_naming_run_dir(tmp_path, monkeypatch,
                                                                         capsys):
    """EROFS (a read-only mount) met in a verb's write was a traceback."""
    import errno

    from kiln import cli

    run_dir = tmp_path / "r"

    def read_only(cfg):
        raise OSError(errno.EROFS, "Read-only file system", str(run_dir / "logs"))

    monkeypatch.setitem(cli.VERBS, "prepare", (read_only, "read raw sources"))
    assert cli.main(["prepare", "--set", f'run.dir="{run_dir}"']) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"kiln: prepare: cannot write {run_dir / 'logs'} (Read-only file system) in the run " \
           f"directory (run.dir = {run_dir}): set run.dir to a folder on a writable disk" in err


def test_a_rank_refused_before_the_ranks_meet_says_why_before_it_tells_them(
        tmp_path, monkeypatch, capsys):
    """A hand launch's rank refused by its settings tells the ranks waiting to meet it, and
    waits a start-up's time (30 s) for them to hear it; its own line came after that wait,
    so a rank started first in its terminal sat silent for half a minute, its mistake
    unsaid."""
    import kiln.parallel.rank_meeting as rank_meeting
    from kiln import cli

    said_before: list[str] = []
    monkeypatch.setattr(rank_meeting, "tell_the_waiting",
                        lambda e: said_before.append(capsys.readouterr().err))
    monkeypatch.chdir(tmp_path)
    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["train", "--set", "train.stepz=3"]) == 2
    assert len(said_before) == 1 and "kiln: config error: " in said_before[0]
    assert "train.stepz" in said_before[0]


@pytest.mark.parametrize("fresh", [False, True], ids=["plain", "fresh"])
def test_kiln_run_stopped_says_how_to_go_on_with_this_run_not_the_quickstart(
        tmp_path, monkeypatch, capsys, fresh):
    """`kiln run RECIPE` stopped said "`kiln run` again goes on": typed so, it works on
    runs/quickstart (or the built-in config), not on the run the recipe or --set named; and
    the same command with --fresh would start over a model trained since. A stop in training
    names the run (its settings are recorded by then); any other asks for the recipe and
    --set options again, without --fresh."""
    from kiln import cli
    from kiln.errors import TrainingInterrupted

    run = tmp_path / "my run"
    argv = ["run", *(["--fresh"] if fresh else []), *[a for s in TINY for a in ("--set", s)],
            "--set", f'run.dir="{run}"']

    def stopped(cfg, fresh=False):
        raise TrainingInterrupted(3, "SIGINT", str(cfg.run_dir / "checkpoints"))

    monkeypatch.setattr(cli, "cmd_run", stopped)
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert f"`kiln run {shlex.quote(str(run))}` goes on from there" in err, err

    def interrupted(cfg, fresh=False):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_run", interrupted)
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert "`kiln run` again with the same recipe and --set options" in err, err
    assert ("without --fresh" in err) == fresh, err


@pytest.mark.parametrize("verb", ["eval", "generate", "export"])
def test_a_verb_reading_the_run_says_the_data_settings_it_leaves_unused(tiny_run, capsys, verb):
    """`kiln eval RUN --set data.val_fraction=0.2` measured the split on disk, made with
    0.05, without a word (the model settings are refused so). The data settings given that
    differ from the recorded ones are now named, with the verbs that make data."""
    from kiln import cli

    cli.main([verb, str(tiny_run), "--set", "data.val_fraction=0.2"])
    err = capsys.readouterr().err
    assert f"warning: data.val_fraction: 0.05 -> 0.2: `kiln {verb}` reads the data already " \
        "made" in err, err
    cli.main([verb, str(tiny_run), "--set", "eval.max_batches=2"])
    assert "warning: data." not in capsys.readouterr().err


def test_a_verb_on_a_run_with_no_checkpoint_names_the_run_to_train(tiny_run, tmp_path, capsys):
    """eval, generate and export on a run not trained yet said "run `kiln train` first": typed
    bare, that trains runs/quickstart, not this run. The run is named, quoted for the shell."""
    from kiln import cli

    run = tmp_path / "my run"
    tiny_run.rename(run)
    for verb in ("eval", "generate", "export"):
        assert cli.main([verb, str(run)]) == 1
        said = capsys.readouterr().err
        assert f"run `kiln train {shlex.quote(str(run))}` first" in said, said


def test_a_resume_refused_for_other_settings_exits_2_as_other_refused_settings_do(tiny_run,
                                                                                  capsys):
    """`kiln train RUN --set model.dim=...` on a trained run exited 1, where `kiln eval`
    with the same override, and `kiln tokenize` with other data settings, exit 2: each is
    the user's settings refused (a config error), nothing of the run damaged."""
    from kiln.cli import main

    assert main(["train", str(tiny_run), "--set", "train.steps=4"]) == 0
    capsys.readouterr()
    for verb, change in (("train", "model.dim=128"), ("run", "model.dim=128"),
                         ("train", "optim.name=muon"), ("train", "data.val_fraction=0.1"),
                         ("eval", "model.dim=128"), ("tokenize", "data.val_fraction=0.1")):
        assert main([verb, str(tiny_run), "--set", change]) == 2, (verb, change)
        err = capsys.readouterr().err
        assert err.startswith("kiln: config error: ") and change.split("=")[0] in err, err
