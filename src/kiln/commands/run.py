"""`kiln run`: the whole chain of verbs in one command. Rank 0 makes the data while the
other ranks wait; training follows; then eval, generate, export and report, each needing
only the trained model, so one failing does not cost the others. `--fresh` archives the
earlier model's outputs before the data stages."""

from __future__ import annotations

import sys
import time
from functools import partial

from kiln.commands.data_stages import cmd_prepare, cmd_tokenize, cmd_tokenizer, record_config
from kiln.commands.evaluate import cmd_eval
from kiln.commands.export import cmd_export
from kiln.commands.generate import cmd_generate, refuse_prompts_that_do_not_fit
from kiln.commands.report import cmd_report
from kiln.commands.train import cmd_train
from kiln.config import Config, ConfigError, flat_settings
from kiln.errors import KilnError


def cmd_run(cfg: Config, fresh: bool = False) -> None:
    """The whole chain. Under torchrun, rank 0 prepares the data and finishes the run.
    `fresh`: as `kiln train --fresh`, the model starts again from step 0, its earlier
    outputs moved to archive/ first (before the data stages, which a trained model's
    checkpoints would otherwise keep from re-making the data)."""
    from kiln.parallel.distributed import init_distributed, shutdown
    from kiln.parallel.rank_waits import run_on_main
    from kiln.train.earlier_outputs import starting_over
    from kiln.train.precision import resolve_device

    env = init_distributed(resolve_device(cfg.train.device), flat_settings(cfg))
    stages = [("prepare", cmd_prepare), ("tokenizer", _tokenizer_unless_current),
              ("tokenize", _tokenize_unless_current)]

    def data_stages() -> None:
        if starting_over(cfg.run_dir, fresh):  # a fresh start cut short: finished first
            _archive_for_fresh(cfg)
        _timed(stages, cfg)
        record_config(cfg)
        refuse_prompts_that_do_not_fit(cfg)  # before hours of training, not after

    # the data stages may take hours: the other ranks wait, then learn how they went
    try:
        run_on_main(env, data_stages, _data_stages_told, KilnError)
    except BaseException:
        # the groups left standing at exit, the peers gone, gloo's threads abort the process
        # (SIGABRT: "terminate called without an active exception") instead of its exit
        shutdown(env)
        raise
    try:
        _timed([("train", partial(cmd_train, resume=False) if fresh else cmd_train)], cfg)
    except ConfigError:  # settings refused before any step ran: nothing new to report
        raise
    except KilnError:
        if env.is_main:  # a diverged run is when its report is needed most
            _report_anyway(cfg)
        raise
    if env.is_main:
        # each needs only the trained model, not the others: one failing (generate after
        # hours of training) must not cost the user the export; the report comes last,
        # of whatever was written, and then the run ends with what failed
        failed = _each_of([("eval", cmd_eval), ("generate", cmd_generate),
                           ("export", cmd_export), ("report", cmd_report)], cfg)
        if failed:
            raise _stages_failed(failed)


def _archive_for_fresh(cfg: Config) -> None:
    """`kiln run --fresh`: the earlier model's checkpoints, metrics and outputs move to
    archive/before-fresh-<time>/ (never deleted), as `kiln train --fresh` moves them."""
    from kiln.errors import CheckpointError
    from kiln.train.checkpoint import archive_checkpoints

    try:
        moved = archive_checkpoints(cfg.run_dir, "fresh")
    except OSError as e:
        raise CheckpointError(
            f"cannot move the earlier model's outputs to {cfg.run_dir / 'archive'} "
            f"({type(e).__name__}: {e}): is the disk full or read-only? nothing was trained; "
            "free space and run `kiln run --fresh` again") from e
    if moved:
        print(f"the earlier model's checkpoints, metrics and outputs moved to {moved}",
              file=sys.stderr)


def _data_stages_told(e: BaseException) -> str:
    """Rank 0's failure in the data stages as the other ranks raise it."""
    if isinstance(e, KeyboardInterrupt):
        return (f"rank 0 was interrupted in its data stages ({type(e).__name__}"
                f"{f': {e}' if str(e) else ''})")
    return f"rank 0's data stages failed ({type(e).__name__}: {e})"


def _tokenizer_unless_current(cfg: Config) -> None:
    """`kiln run` keeps a tokenizer trained on the same documents with the same settings
    (training it again would make the same one; on a large corpus it takes a while)."""
    from kiln.data.provenance import tokenizer_is_current, tokenizer_path

    t = cfg.tokenizer
    if tokenizer_is_current(cfg.run_dir, t.kind, t.vocab_size, t.min_frequency):
        print(f"tokenizer: kept {tokenizer_path(cfg.run_dir)} (trained on these documents with these "
              "settings)")
        return
    cmd_tokenizer(cfg)


def _tokenize_unless_current(cfg: Config) -> None:
    """`kiln run` keeps whole token shards made from these documents and this tokenizer
    with the same split."""
    from kiln.data.provenance import tokens_are_current
    from kiln.data.shards import load_index

    if tokens_are_current(cfg.run_dir, cfg.data.val_fraction, cfg.run.seed):
        index = load_index(cfg.run_dir / "tokens")
        print(f"tokenize: kept {cfg.run_dir / 'tokens'} (train {index['train']['tokens']:,} "
              f"tokens, val {index['val']['tokens']:,} tokens; made from these documents and "
              "this tokenizer)")
        return
    cmd_tokenize(cfg)


def _report_anyway(cfg: Config) -> None:
    try:
        cmd_report(cfg)
    except Exception as e:  # the stage's own error is the one to show
        print(f"kiln: no report either ({type(e).__name__}: {e})", file=sys.stderr)


def _each_of(stages, cfg: Config) -> list[tuple[str, Exception]]:
    """Run every stage, timed, whatever the ones before it did; returns those that failed
    and why, each said as it fails (Ctrl-C still stops the chain at once)."""
    failed = []
    for i, (name, fn) in enumerate(stages):
        try:
            _timed([(name, fn)], cfg)
        except Exception as e:
            later = ", ".join(n for n, _ in stages[i + 1:])
            print(f"kiln: run: {name} failed ({_why(e)})"
                  + (f"; {later} do not need it and go on" if later else ""), file=sys.stderr)
            failed.append((name, e))
    return failed


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _stages_failed(failed: list[tuple[str, Exception]]) -> Exception:
    """One failed stage ends the run with its own error (its exit status and message, as
    the verb alone would give); several with one error naming each."""
    import traceback

    if len(failed) == 1:
        return failed[0][1]
    for _, e in failed:
        if not isinstance(e, (KilnError, OSError)):  # a bug: its traceback is the clue
            traceback.print_exception(e)
    err = KilnError("run: " + "; ".join(f"{name} failed ({_why(e)})" for name, e in failed)
                    + "; the other stages finished: fix these and run their verbs alone")
    err.__cause__ = failed[0][1]
    return err


def _timed(stages, cfg: Config) -> None:
    from kiln.parallel.distributed import is_main_process

    for name, fn in stages:
        start = time.perf_counter()
        fn(cfg)
        if is_main_process():  # under torchrun, one line, not one per rank
            print(f"[{name} done in {time.perf_counter() - start:.1f}s]", file=sys.stderr)
