"""What `kiln run` and the data verbs refuse before any work, where the trainer would refuse
it only after hours of data stages: re-making the data a trained run's checkpoints came
from, and a model design (or batch, or memory need) the trainer would not take."""

from __future__ import annotations

from kiln.config import (
    MIN_VOCAB,
    Config,
    ConfigError,
    data_changes,
    design_problems,
    recorded_config,
)


def refuse_remaking_trained_data(cfg: Config, verb: str, fresh: bool = False) -> None:
    """A run with checkpoints keeps the data they were trained on: re-making it with other
    settings, or from sources that changed since (a file added or edited), would leave the
    checkpoints (and a resume's loader position) describing data that is gone. The same
    settings on the same files re-make the same data, so a plain re-run is fine."""
    from kiln.data.pipeline import changed_inputs
    from kiln.data.prepare_signature import rules_made_otherwise
    from kiln.run_dir import run_arg
    from kiln.train.checkpoint_dirs import latest_checkpoint
    from kiln.train.earlier_outputs import starting_over

    if starting_over(cfg.run_dir, fresh) or latest_checkpoint(cfg.run_dir / "checkpoints") is None:
        return  # fresh: archived first
    old = recorded_config(cfg.run_dir)
    if old is None:
        return
    changed = data_changes(old, cfg)
    what, touched = f"data made with other settings ({', '.join(changed[:4])})", ""
    if not changed and verb in ("prepare", "run"):
        changed = changed_inputs(cfg.prepare, cfg.run_dir, cfg.data.sources)
        what = f"the sources as they were; they changed since ({'; '.join(changed[:4])})"
        if any("touched" in c for c in changed):
            touched = ("; if only the files' times changed (a touch, a checkout), `kiln train "
                       f"{run_arg(cfg.run_dir)}` and the later verbs go on with the "
                       "data already made")
    if not changed and verb in ("prepare", "run"):  # a rule of how Kiln makes them changed
        changed = rules_made_otherwise(cfg.prepare, cfg.data.sources, cfg.data.max_bytes,
                                       cfg.run_dir / "logs" / "prepare", cfg.data.text_field)
        what = (f"documents whose {', and whose '.join(changed)}: this Kiln makes them "
                "otherwise, so it would make them again")
        touched = (f"; `kiln train {run_arg(cfg.run_dir)}` and the later verbs go on with "
                   "the data already made")
    if changed:
        raise ConfigError(
            f"{cfg.run_dir} holds checkpoints trained on {what}; re-making the data would "
            "orphan them: use another run.dir, "
            + "start the model over with `kiln run --fresh` (its checkpoints, metrics and "
            "outputs move to archive/"
            + ("), " if verb == "run" else "; it then makes the data and trains again), ")
            + f"or move the trained model's {cfg.run_dir / 'checkpoints'} and metrics.jsonl "
            f"aside first{touched}")


def refuse_new_model_design(cfg: Config, fresh: bool = False) -> None:
    """The trainer refuses a global batch the ranks cannot share, a design that trains wrong
    for a new model, one whose training state cannot fit in memory, and for a trained one
    other [model] settings; `kiln run` asks before its data stages rather than after."""
    import dataclasses

    from kiln.parallel.distributed import launched_ranks
    from kiln.train.checkpoint_dirs import latest_checkpoint
    from kiln.train.earlier_outputs import starting_over
    from kiln.train.train_setup import fit_micro_batch

    # a batch the ranks cannot share is refused before hours of data stages, not after
    fit_micro_batch(cfg.train.global_batch, cfg.train.micro_batch, launched_ranks())
    over = starting_over(cfg.run_dir, fresh)
    ckpt = None if over else latest_checkpoint(cfg.run_dir / "checkpoints")
    if ckpt is not None:  # a trained model goes on as it was: another [model] is refused now
        from kiln.errors import RunDataError
        from kiln.train.resume_settings import refuse_changed_model
        from kiln.train.train_setup import model_config_for_run

        try:  # model.vocab_size 0 is the tokenizer's, as the trainer resolves it
            model = model_config_for_run(cfg, cfg.run_dir / "tokens")
        except (FileNotFoundError, RunDataError):  # no shards: the data stages make them
            return
        refuse_changed_model(ckpt, recorded_config(cfg.run_dir), dataclasses.replace(cfg, model=model))
        return
    problems = design_problems(cfg.model)
    if problems:
        raise ConfigError(problems[0])
    from kiln.train.memory_fit import check_training_fits
    from kiln.train.precision import resolve_device

    # the vocabulary is the tokenizer's, not made yet: count the fewest it can have (its
    # 256 bytes and EOS), so this early check never refuses what the trainer would take
    # on a GPU the trainer checks, once each rank has its own device
    device = resolve_device(cfg.train.device)
    if device.type == "cpu":
        smallest = dataclasses.replace(cfg.model, vocab_size=cfg.model.vocab_size or MIN_VOCAB)
        check_training_fits(smallest, cfg.optim.name, device, cfg.train.parallel,
                            launched_ranks(),
                            planned_vocab=None if cfg.model.vocab_size else cfg.tokenizer.vocab_size)
