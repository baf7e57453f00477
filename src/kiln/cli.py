"""The `kiln` command: one small function per verb, each reading and writing the run directory."""

# (the docstring is `kiln --help`'s description.) The verbs' work lives in kiln.commands;
# here: the parser, the dispatch to a verb, and each way a verb ends as one line and an
# exit status.

from __future__ import annotations

import argparse
import errno
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

from kiln.closed_streams import readers_may_leave
from kiln.commands.data_stages import cmd_prepare, cmd_tokenize, cmd_tokenizer, record_config
from kiln.commands.early_refusals import refuse_new_model_design, refuse_remaking_trained_data
from kiln.commands.evaluate import cmd_eval
from kiln.commands.export import cmd_export
from kiln.commands.generate import cmd_generate
from kiln.commands.report import cmd_report
from kiln.commands.run import cmd_run
from kiln.commands.train import cmd_train
from kiln.config import (
    Config,
    ConfigError,
    check_run_dir_is_its_own,
    load_config,
    run_dir_override,
    run_dir_overrides,
)
from kiln.errors import (
    KilnError,
    MainRankInterrupted,
    Terminated,
    TrainingInterrupted,
    alike_on_every_rank,
    met_alike_on_every_rank,
)
from kiln.export_recovery import EXPORT_RECORD
from kiln.interrupts import signals_stop_at_once, stop_under_way
from kiln.out_of_memory import out_of_memory, out_of_memory_line
from kiln.run_dir import refuse_while_training, run_arg

# verbs that make the run's data: they record the config they used (train records its own;
# eval, generate, export and report read a run and leave its config.toml alone)
_DATA_VERBS = ("prepare", "tokenizer", "tokenize")


VERBS = {
    "prepare": (cmd_prepare, "read raw sources into clean documents"),
    "tokenizer": (cmd_tokenizer, "train a byte-level BPE tokenizer on the documents"),
    "tokenize": (cmd_tokenize, "pack documents into token shards (train/val)"),
    "train": (cmd_train, "train the model (resumes from the latest checkpoint)"),
    "eval": (cmd_eval, "loss, perplexity and bits per byte on the held-out split (eval.split = train: the train split)"),
    "generate": (cmd_generate, "sample from the latest checkpoint"),
    "export": (cmd_export, "write a Hugging Face (Llama / afmoe) or Kiln native folder"),
    "report": (cmd_report, "write report.html with plots"),
    "run": (cmd_run, "run every stage of a recipe"),
}


def resolve_config(target: str | None, overrides: list[str]) -> Config:
    """TARGET is a recipe (.toml) or a run directory (its config.toml is reused). Without
    one, the run in run.dir (runs/quickstart unless overridden) if it has been recorded,
    else the built-in config: `kiln train` after the quickstart continues the quickstart
    with its own settings, not the built-in ones."""
    if target is None:
        # run.dir alone first: the other overrides are checked against the recorded config
        where = load_config(None, run_dir_overrides(overrides))
        if (where.run_dir / "config.toml").exists():
            return resolve_config(str(where.run_dir), overrides)
        return load_config(None, overrides)
    if not target.strip():  # an unset shell variable, quoted: Path("") is the current folder
        raise ConfigError(f"the target is empty ({target!r}): give a recipe (a file ending in "
                          ".toml) or a run directory")
    path = Path(target)
    run = _enclosing_run(path)
    if path.name == "config.toml" and run == path.parent.absolute() and path.is_file() \
            and not run_dir_overrides(overrides):
        # a run's own record names its run: the run.dir in it is as the run was first given
        # (relative to the folder it started from), so from another folder it named another
        # run (`kiln eval RUN/config.toml`: "no checkpoint"; `kiln run`: a new run there)
        return resolve_config(str(path.parent), overrides)
    if _is_export(path):  # a native export holds a config.toml too: not a run to work in
        raise ConfigError(f"{path} is a Kiln export (it holds {EXPORT_RECORD}), not a recipe "
                          "or a run directory: give the run directory "
                          + (str(run) if run is not None else "it was exported from"))
    if run is not None and (path.is_dir() or path.suffix != ".toml"):  # a run's own file
        what = "folder" if path.is_dir() else "file"
        raise ConfigError(f"{path} is a {what} inside the run directory {run}, not a recipe or "
                          "a run directory: give that run directory instead")
    if path.exists() and not path.is_dir() and path.suffix.lower() != ".toml":
        # read as TOML, an empty file (or /dev/null) was a recipe of the defaults: `kiln run
        # notes.txt` trained the quickstart in runs/quickstart
        raise ConfigError(f"{path} is not a TOML recipe or a run directory: give a recipe "
                          "(a file ending in .toml) or a run directory (a folder holding "
                          "config.toml)")
    if path.is_dir():
        if not (path / "config.toml").exists():
            raise ConfigError(f"{path} is not a run directory (no config.toml)")
        moved = run_dir_overrides(overrides)
        if moved and load_config(None, moved).run_dir.resolve() != path.resolve():
            raise ConfigError(f"the target is the run directory {path}, but --set {moved[-1]} "
                              "names another: give the run directory once, as the target")
        return load_config(path / "config.toml", [run_dir_override(path), *overrides],
                           recorded=True)
    return load_config(path, overrides)


def _enclosing_run(path: Path) -> Path | None:
    """The nearest folder above `path` that is a run directory (holds the config.toml and
    env.json Kiln records together), for a target inside a run (metrics.jsonl, a checkpoint)."""
    if not path.exists() or (path.is_dir() and (path / "config.toml").exists()
                             and not _is_export(path)):
        return None
    return next((p for p in path.absolute().parents
                 if (p / "config.toml").is_file() and (p / "env.json").is_file()), None)



def _is_export(path: Path) -> bool:
    """A folder `kiln export` wrote: a native one holds a config.toml, so it was taken for a
    run directory (`kiln generate RUN/export` told to run prepare there, `kiln report`
    wrote report.html into the export)."""
    return path.is_dir() and (path / EXPORT_RECORD).is_file()


class _Parser(argparse.ArgumentParser):
    """A command-line mistake (`--bogus`, a missing verb) is every rank's alike: under
    torchrun it is said by the first rank of each machine, as config errors are, and every
    rank exits 2."""

    def error(self, message: str):  # type: ignore[override]
        from kiln.parallel.distributed import first_on_its_node

        if "invalid choice: 'version'" in message:  # `kiln version`: an option, not a verb
            message += "; `kiln --version` prints Kiln's version"
        if first_on_its_node():
            super().error(message)
        self.exit(2)


class _Version(argparse.Action):
    """`kiln --version`, told only when asked (it imports torch and asks git)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print Kiln's version, its git commit (from a checkout), torch's and "
                 "Python's versions, and exit"):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from kiln.run_dir import version_line

        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kiln", description=__doc__)
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, (_, help_text) in VERBS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("target", nargs="?", help="recipe TOML or run directory (default: the run in run.dir, "
                       "runs/quickstart, else the built-in config)")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value, e.g. --set train.steps=100 (repeatable; "
                       "every key and its default: README.md's Configuration, or any run's "
                       "config.toml)")
        if name == "train":
            p.add_argument("--fresh", action="store_true",
                           help="start again from step 0: the earlier checkpoints, metrics and "
                           "outputs move to archive/before-fresh-<time>/")
        if name == "run":
            p.add_argument("--fresh", action="store_true",
                           help="train the model again from step 0, as `kiln train --fresh`: "
                           "the earlier checkpoints, metrics and outputs move to "
                           "archive/before-fresh-<time>/ first, so the data stages may re-make "
                           "the data with other settings")
        if name == "report":
            # one run per flag: `--compare A RUN` must not take RUN for a second compared run
            p.add_argument("--compare", action="append", default=[], metavar="RUN_DIR",
                           help="overlay this run's curves and figures on the report "
                           "(repeatable)")
    return parser


_KEPT = "what it had finished writing is kept (outputs are written atomically)"
_AFTER_INTERRUPT = {
    "prepare": "run the same command again (recipe and --set options: the run dir records "
               "its config.toml only once prepare finishes); datatrove skips the tasks that "
               "finished",
    "tokenizer": "tokenizer.json is written atomically, so the previous one (if any) is intact",
    "tokenize": "tokens/ is replaced only when complete, so the previous shards (if any) are "
                "intact; run it again",
    "train": "the checkpoints are written atomically; `kiln train {run}` resumes from the "
             "latest (starts, if none was saved yet)",
    "run": "what it had finished is kept (checkpoints and outputs are written atomically); "
           "`kiln run` again with the same recipe and --set options{fresh} goes on (prepare "
           "skips finished tasks, train resumes from its last checkpoint, or starts over with "
           "the earlier records archived if it had none)",
}
# a bare `kiln run` works on runs/quickstart, not on the run a recipe or --set named; and
# `--fresh` again would start over a model trained since
_NOT_FRESH = " (without --fresh: the earlier outputs are archived already)"


def _after_interrupt(verb: str, cfg: Config | None, fresh: bool = False) -> str:
    """What is kept after `verb` stopped, and the command that goes on (naming the run)."""
    return _AFTER_INTERRUPT.get(verb, _KEPT).replace(
        "{run}", "RUN" if cfg is None else run_arg(cfg.run_dir)).replace(
        "{fresh}", _NOT_FRESH if fresh else "")


def main(argv: list[str] | None = None) -> int:
    ranks = sys.modules.get("kiln.parallel.distributed")  # imported by a verb that joins
    if ranks is not None:
        ranks.joined_here(False)  # this command's group only (tests call `main` again)
    code = _said(argv)
    ranks = sys.modules.get("kiln.parallel.distributed")
    if ranks is not None:
        ranks.leave_the_process(code)  # said and done: gloo's threads never meet teardown
    return code


def _said(argv: list[str] | None) -> int:
    with readers_may_leave():  # its last line too may meet a closed pipe or hung-up terminal
        try:
            with signals_stop_at_once(), warnings.catch_warnings():
                warnings.showwarning = _show_warning(warnings.showwarning)
                return _main(argv)
        except KeyboardInterrupt as e:  # while starting (importing torch), before any verb ran
            print(f"\nkiln: {_stopped_by(e)} while starting; nothing was changed",
                  file=sys.stderr)
            return getattr(e, "exit_code", 130)


def _stopped_by(e: KeyboardInterrupt) -> str:
    return f"stopped on {e.signal_name}" if isinstance(e, Terminated) else "interrupted"


def _show_warning(shown: Callable) -> Callable:
    """Kiln's own warnings read like its other messages (`warning: ...`, once, on rank 0),
    not as a source location and line; other libraries' keep Python's format."""
    from kiln.parallel.distributed import is_main_process

    package = Path(__file__).resolve().parent

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if not Path(filename).resolve().is_relative_to(package):
            shown(message, category, filename, lineno, file, line)
        elif is_main_process():
            print(f"warning: {message}", file=file or sys.stderr)

    return show


def _permission_advice(e: PermissionError, cfg: Config | None) -> str:
    """What to do: a path in the run directory is the run's to make writable; another
    (a source, a recipe) is the user's to open up."""
    inside = cfg is not None and e.filename is not None and \
        Path(e.filename).absolute().is_relative_to(cfg.run_dir.absolute())
    return ("make the run directory writable, or set run.dir to a folder that is" if inside
            else "check that path's permissions")


# the data stages in order, and the file each one finishes with
_DATA_OUTPUTS = (("prepare", "prepare.json"), ("tokenizer", "tokenizer/tokenizer.json"),
                 ("tokenize", "tokens/index.json"))


def _all_missing_stages(cfg: Config | None, verb: str) -> str:
    """When more than one earlier data stage has not run, name them all at once (each
    stage's own error names only the one just before it)."""
    if cfg is None or verb not in ("tokenizer", "tokenize", "train", "eval", "generate",
                                   "export"):
        return ""
    order = [v for v, _ in _DATA_OUTPUTS]
    needed = _DATA_OUTPUTS[:order.index(verb)] if verb in order else _DATA_OUTPUTS
    missing = [v for v, f in needed if not (cfg.run_dir / f).is_file()]
    if len(missing) < 2:
        return ""
    steps = ", then ".join(f"`kiln {v}`" for v in missing)
    return f"\n  {cfg.run_dir} lacks the output of {len(missing)} stages: run {steps} " \
        "(or `kiln run` with the recipe, which does them all)"


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    cfg, fresh = None, getattr(args, "fresh", False)
    from kiln.parallel.distributed import (
        first_on_its_node,
        is_main_process,
        launched_ranks,
        lost_a_rank,
    )

    try:
        with alike_on_every_rank():
            cfg = resolve_config(args.target, args.overrides)
            _refuse_unwritable_run_dir(cfg, args.verb)
        fn = VERBS[args.verb][0]
        if args.verb in _READING_VERBS and is_main_process():
            from kiln.inert_settings import data_settings_unread

            for line in data_settings_unread(cfg, args.verb):
                print(f"warning: {line}", file=sys.stderr)
        if args.verb in _RANK_ZERO_VERBS and launched_ranks() > 1:
            if not is_main_process():  # one rank does the work: N would race on the same files
                return 0
            print(f"note: `kiln {args.verb}` runs on rank 0 alone; the other ranks exit",
                  file=sys.stderr)
        if args.verb == "train":  # the trainer records its config once it has resumed
            cmd_train(cfg, resume=not args.fresh)
        elif args.verb == "eval":
            cmd_eval(cfg, distributed=True)
        elif args.verb == "report":
            cmd_report(cfg, compare=args.compare)
        else:
            with alike_on_every_rank():  # the settings and the run's files, before any work
                if args.verb in (*_DATA_VERBS, "run"):
                    check_run_dir_is_its_own(cfg)
                    refuse_while_training(cfg.run_dir)
                    refuse_remaking_trained_data(cfg, args.verb, fresh)
                if args.verb == "run":
                    refuse_new_model_design(cfg, fresh)  # before the data stages, not after
            if args.verb == "run":
                cmd_run(cfg, fresh)
            else:
                fn(cfg)
        if args.verb in _DATA_VERBS and is_main_process():
            record_config(cfg)  # only after success: a failed command leaves the run's as it was
    except ConfigError as e:
        _ending_with_the_others(e)
        # a recipe or --set refused (while loading, or checked before any work) is refused
        # alike by every rank of a node: said once per node (a node whose recipe differs
        # still says why it stopped)
        if _said_here(e):
            print(f"kiln: config error: {_advice_for(args.verb, e)}", file=sys.stderr)
        _tell_the_waiting(args.verb, e)  # after its line: it may wait a start-up's time
        return 2
    except FileNotFoundError as e:  # a missing earlier stage: the message says what to run
        if _said_here(e):
            print(f"kiln: {e}{_all_missing_stages(cfg, args.verb)}", file=sys.stderr)
        return 1
    except PermissionError as e:  # a run dir (or a file in it) this user may not write
        if _said_here(e):
            print(f"kiln: {args.verb}: permission denied on {e.filename or e}; "
                  f"{_permission_advice(e, cfg)}; {_KEPT}", file=sys.stderr)
        return 1
    except OSError as e:  # a read-only filesystem, a full disk: in the run directory
        said = _unwritable_run_dir(e, cfg, args.verb)
        if said is None:
            raise
        if _said_here(e):
            print(said, file=sys.stderr)
        return 1
    except KilnError as e:  # a damaged checkpoint or run file, data that does not fit
        _ending_with_the_others(e)
        if _said_here(e):
            print(f"kiln: {_advice_for(args.verb, e)}", file=sys.stderr)
        _tell_the_waiting(args.verb, e)  # after its line: it may wait a start-up's time
        return 1
    except KeyboardInterrupt as e:
        stop_under_way()  # torchrun's SIGTERM once another rank exits must not cut this short
        if isinstance(e, TrainingInterrupted):  # stopped at a step boundary and saved it
            if is_main_process():
                # the data stages recorded the run's settings: its folder names them
                again = f"`kiln {args.verb} {run_arg(cfg.run_dir)}`"
                print(f"kiln: {args.verb}: training {e}; {again} goes on from there",
                      file=sys.stderr)
            return e.exit_code
        if isinstance(e, MainRankInterrupted):  # rank 0 stopped in work this rank waited for
            if first_on_its_node():  # rank 0 says it on its own node: one line per machine
                print(f"kiln: {args.verb} stopped: {e}; "
                      f"{_after_interrupt(args.verb, cfg, fresh)}", file=sys.stderr)
            return e.exit_code
        print(f"\nkiln: {args.verb} {_stopped_by(e)}; {_after_interrupt(args.verb, cfg, fresh)}",
              file=sys.stderr)
        return getattr(e, "exit_code", 130)
    except RuntimeError as e:
        if out_of_memory(e):  # activations: the check before training counts only the state
            said = _out_of_memory_said(args.verb, e)
            if said is not None:
                print(f"{said}; {_KEPT}", file=sys.stderr)
            return 1
        if not lost_a_rank(e):
            raise
        from kiln.parallel.rank_stops import RAN_OUT, lost_rank_said, stopped_ranks

        after = _after_interrupt(args.verb, cfg, fresh)
        if (stopped := stopped_ranks()) and \
                all(how.startswith(RAN_OUT) for how in stopped.values()):
            return 1  # the lowest rank that ran out says it, for every rank
        if stopped:  # a signal to those ranks alone: not a crash
            who = "; ".join(f"rank {r} {how}" for r, how in sorted(stopped.items()))
            print(f"kiln: {args.verb} stopped: {who} (a signal to it alone) while this rank "
                  f"went on, and this launch cannot go on without it; {after}",
                  file=sys.stderr)
            return 1
        print(f"kiln: {args.verb} stopped: another rank of this launch failed or was killed "
              f"({lost_rank_said(e)}); {after}", file=sys.stderr)
        return 1
    return 0


def _refuse_unwritable_run_dir(cfg: Config, verb: str) -> None:
    """Every verb writes into the run directory; the data verbs and `kiln run` make it. The
    others on a folder not made yet say which stage to run first, as before."""
    from kiln.parallel.distributed import is_main_process, launched_ranks
    from kiln.run_dir import check_run_dir_writable

    if verb in _RANK_ZERO_VERBS and launched_ranks() > 1 and not is_main_process():
        return  # rank 0 alone works (and writes)
    check_run_dir_writable(cfg, may_make=verb in (*_DATA_VERBS, "run"))


# a write the disk refused, met outside the writers that say so themselves
_UNWRITABLE = {errno.EROFS: "set run.dir to a folder on a writable disk",
               errno.ENOSPC: "free space (or set run.dir to a folder on another disk) and run "
                             "it again",
               errno.EDQUOT: "free space within your quota (or set run.dir to a folder on "
                             "another disk) and run it again"}


def _unwritable_run_dir(e: OSError, cfg: Config | None, verb: str) -> str | None:
    """The one line for a write into the run directory that the disk refused, naming
    run.dir; None for any other OSError (a bug's traceback is its clue)."""
    if cfg is None or e.errno not in _UNWRITABLE or e.filename is None or \
            not Path(e.filename).absolute().is_relative_to(cfg.run_dir.absolute()):
        return None
    return (f"kiln: {verb}: cannot write {e.filename} ({e.strerror}) in the run directory "
            f"(run.dir = {cfg.run_dir}): {_UNWRITABLE[e.errno]}; {_KEPT}")


def _advice_for(verb: str, e: BaseException) -> str:
    """`e`'s message, its advice to start over as `kiln run` gives it: `kiln train --fresh`
    would need the recipe's --set options again, and would not re-make the data."""
    if verb != "run":
        return str(e)
    return str(e).replace("`kiln train --fresh`", "`kiln run --fresh` with the same recipe "
                          "and --set options")


def _ending_with_the_others(e: BaseException) -> None:
    """An error every rank of a launch ends with (met alike, or agreed on): once one rank
    has exited, torchrun SIGTERMs the others, which would end this one, on its way out with
    the same status, as killed by SIGTERM. Ignored from here, as a stop under way ignores a
    repeated signal."""
    from kiln.parallel.distributed import launched_ranks

    if met_alike_on_every_rank(e) and launched_ranks() > 1:
        stop_under_way()


def _out_of_memory_said(verb: str, e: BaseException) -> str | None:
    """The out-of-memory line, said once for the ranks of a launch that ran out (each left
    word of it: `rank_stops`), naming them: by the lowest of them, or by the first to say it
    where one ran out after the others' line was said; None on the others. (Every rank said
    the same line; the ranks that met one of them gone said it was lost.)"""
    from kiln.parallel.distributed import launched_ranks

    line = out_of_memory_line(verb, e)
    if launched_ranks() <= 1:
        return line
    import os

    from kiln.parallel.rank_stops import ran_out_too, said_by_another

    rank = int(os.environ.get("RANK", "0"))
    ranks = sorted([rank, *ran_out_too()])
    if ranks[0] != rank or said_by_another():
        return None
    named = f"rank {rank}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    return line.replace(": out of memory (", f": {named} ran out of memory (", 1)


def _tell_the_waiting(verb: str, e: BaseException) -> None:
    """A rank of a hand launch refused before the ranks met (a check of the settings or the
    run, the training lock), alike or on it alone: the ranks waiting to meet it hear why
    now, where they waited for it the group's half hour."""
    if verb in _MEETING_VERBS:
        from kiln.parallel.rank_meeting import tell_the_waiting

        tell_the_waiting(e)


def _said_here(e: BaseException) -> bool:
    """Whether this rank says `e`: an error every rank meets alike is said by the first
    rank of each node alone; any other by the rank that met it."""
    from kiln.parallel.distributed import first_on_its_node

    return not met_alike_on_every_rank(e) or first_on_its_node()


# verbs that read a run's data as made, whatever the data settings given now
_READING_VERBS = ("eval", "generate", "export")
# verbs whose ranks meet (a process group): the others wait for rank 0 to join
_MEETING_VERBS = ("train", "eval", "run")
# verbs with nothing to share between ranks: under torchrun rank 0 runs them alone
_RANK_ZERO_VERBS = (*_DATA_VERBS, "generate", "export", "report")


if __name__ == "__main__":
    sys.exit(main())
