"""The `kiln` command: one small function per verb, each reading and writing the run directory."""

from __future__ import annotations

import argparse
import errno
import json
import sys
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path

from kiln.closed_streams import readers_may_leave
from kiln.config import (
    MIN_VOCAB,
    Config,
    ConfigError,
    check_run_dir_is_its_own,
    data_changes,
    design_problems,
    flat_settings,
    load_config,
    recorded_config,
    run_dir_override,
)
from kiln.errors import (
    KilnError,
    MainRankInterrupted,
    Terminated,
    TrainingInterrupted,
    alike_on_every_rank,
    met_alike_on_every_rank,
)
from kiln.interrupts import signals_stop_at_once, stop_under_way


def _tokenizer_path(cfg: Config) -> Path:
    from kiln.data.provenance import tokenizer_path

    return tokenizer_path(cfg.run_dir)


def cmd_prepare(cfg: Config) -> None:
    from kiln.data.edit_warnings import edit_warnings
    from kiln.data.pipeline import run_prepare
    from kiln.data.prepared import HASHES
    from kiln.data.sources import check_sources

    check_sources(cfg.data.sources)  # before anything is cleared
    p = cfg.prepare
    if p.executor == "local" and not p.console_logs:
        print(f"prepare: {' -> '.join(p.stages)} in {p.tasks} task(s); datatrove's task logs "
              f"(pipeline, per-step statistics) go to {cfg.run_dir / 'logs' / 'prepare'} "
              "(prepare.console_logs = true shows them here too)", file=sys.stderr)
    stats = run_prepare(cfg.prepare, cfg.run_dir, sources=cfg.data.sources,
                        max_bytes=cfg.data.max_bytes, text_field=cfg.data.text_field,
                        progress=sys.stderr.isatty())  # off a terminal: redraws pile up
    # the files behind each skip are in prepare.json and said below, line by line; the
    # documents files' hashes are a record for the later verbs, one per task
    shown = {k: v for k, v in stats.items() if k not in ("skipped_examples", HASHES)}
    print(f"prepare: {json.dumps(shown)}")
    for line in yield_warnings(cfg.run_dir, stats, cfg.data.text_field):
        print(f"warning: {line}", file=sys.stderr)
    for line in edit_warnings(cfg.run_dir):  # documents kept, but most of their text cut
        print(f"warning: {line}", file=sys.stderr)
    for line in skip_notes(stats):
        print(f"note: {line}", file=sys.stderr)


# a reader skipping more inputs than it reads, or stages keeping under a tenth of what was
# read, is most often a wrong source or setting rather than the data's own quality
LOW_KEPT_FRACTION = 0.1


def yield_warnings(run_dir: Path, summary: dict, text_field: str = "text") -> list[str]:
    """What a finished prepare lost that a user should look at before training on the rest
    (`text_field`: data.text_field, named where records lacked it)."""
    if summary.get("status") == "submitted":  # a Slurm chain: nothing has run yet
        return []
    from kiln.data.edit_warnings import yield_stages
    from kiln.data.skip_examples import describe

    out = []
    read, skipped = summary["documents"], summary["skipped"]
    if sum(skipped.values()) > read:
        out.append(f"the reader skipped {sum(skipped.values()):,} inputs and read {read:,} "
                   f"documents from {summary['sources']} (skipped by reason: "
                   + ", ".join(f"{k}={v:,}" for k, v in skipped.items())
                   + "): check data.sources")
    if read and summary["documents_out"] < LOW_KEPT_FRACTION * read:
        stages = yield_stages(run_dir)
        drops = "; ".join(
            f"{r['stage']}: " + ", ".join(f"{k}={v:,}" for k, v in
                                          sorted(r["drop_reasons"].items(), key=lambda kv: -kv[1]))
            for r in stages[1:] if r.get("documents_dropped") and r.get("drop_reasons"))
        out.append(f"prepare kept {summary['documents_out']:,} of the {read:,} documents it "
                   f"read ({summary['documents_out'] / read:.1%})"
                   + (f", dropped by {drops}" if drops else "")
                   + f"; see {run_dir / 'yield.json'} and the [prepare.<stage>] settings")
    if summary["stages"][:1] == ["read"]:  # a source that held nothing, beside others that did
        from kiln.data.pipeline import empty_sources
        from kiln.data.sources import no_files_message

        if empty := empty_sources(summary["sources"], run_dir):
            out.append(f"data.sources: {no_files_message(empty)}")
    # which files, and where; the fields of records without the text field
    lost = {r: e for r, e in summary.get("skipped_examples", {}).items() if r not in LOSSLESS_SKIPS}
    out += describe(lost, skipped, text_field)
    return out


# skips that lose no text (an empty file, a dot-file): named in a note, not a warning
LOSSLESS_SKIPS = ("empty", "hidden")


def skip_notes(summary: dict) -> list[str]:
    """The files a finished prepare skipped without losing text, named for the record."""
    from kiln.data.skip_examples import describe

    examples = summary.get("skipped_examples", {})
    return describe({r: e for r, e in examples.items() if r in LOSSLESS_SKIPS},
                    summary.get("skipped", {}))


def cmd_tokenizer(cfg: Config) -> None:
    from kiln.data.math_tokenizer import train_tokenizer_of_kind
    from kiln.data.prepared import read_documents
    from kiln.data.provenance import record_tokenizer

    texts = (doc.text for doc in read_documents(cfg.run_dir))
    tok = train_tokenizer_of_kind(cfg.tokenizer.kind, texts, cfg.tokenizer.vocab_size,
                                  _tokenizer_path(cfg), min_frequency=cfg.tokenizer.min_frequency,
                                  show_progress=sys.stderr.isatty())  # off a terminal: blank lines
    record_tokenizer(cfg.run_dir, cfg.tokenizer.kind, cfg.tokenizer.vocab_size,
                     cfg.tokenizer.min_frequency)
    print(f"tokenizer ({cfg.tokenizer.kind}): {tok.get_vocab_size()} tokens -> "
          f"{_tokenizer_path(cfg)}")
    if tok.get_vocab_size() < cfg.tokenizer.vocab_size:
        print(f"note: the documents hold only {tok.get_vocab_size()} distinct tokens' worth of "
              f"merges, fewer than tokenizer.vocab_size = {cfg.tokenizer.vocab_size}: more data, "
              "or a smaller vocab_size", file=sys.stderr)


def cmd_tokenize(cfg: Config) -> None:
    from kiln.data.prepared import prepared_count, read_documents
    from kiln.data.provenance import shards_made_from, tokenizer_fits_other_documents
    from kiln.data.shards import write_shards
    from kiln.data.tokenizer import load_tokenizer

    tok = load_tokenizer(_tokenizer_path(cfg))
    made = shards_made_from(cfg.run_dir)
    if tokenizer_fits_other_documents(cfg.run_dir, made):  # kept on purpose is fine: said once
        print("note: the tokenizer was trained on other documents than the run holds now "
              "(`kiln prepare` ran since `kiln tokenizer`): its merges fit the earlier corpus; "
              "run `kiln tokenizer` first to fit these (`kiln run` does)", file=sys.stderr)
    index = write_shards(read_documents(cfg.run_dir), tok, cfg.run_dir / "tokens",
                         val_fraction=cfg.data.val_fraction, seed=cfg.run.seed,
                         made_from=made, total=prepared_count(cfg.run_dir),  # the bar's end
                         progress=sys.stderr.isatty())  # off a terminal: one line per redraw
    from kiln.data.yield_report import add_token_counts

    add_token_counts(cfg.run_dir)  # yield.json gains the tokens that came out
    if index["unigram_bpb"] is None:
        print(f"tokenize: train {index['train']['tokens']:,} tokens; the val split is empty "
              "(too few documents to hold one out): training needs one, so add documents",
              file=sys.stderr)
        return
    print(f"tokenize: train {index['train']['tokens']:,} tokens, val {index['val']['tokens']:,} "
          f"tokens, unigram baseline {index['unigram_bpb']:.3f} bits/byte")
    _warn_val_share(index, cfg.data.val_fraction)
    window = cfg.train.seq_len + 1
    short = [s for s in ("train", "val") if index[s]["tokens"] < window]
    if short:
        splits = "train and val splits hold" if len(short) == 2 else f"{short[0]} split holds"
        print(f"warning: the {splits} fewer tokens than one training "
              f"window (train.seq_len + 1 = {window}); `kiln train` will refuse it: the split "
              f"is by whole document ({index['train']['documents']} train, "
              f"{index['val']['documents']} val), so change data.val_fraction or add data",
              file=sys.stderr)


def _warn_val_share(index: dict, val_fraction: float) -> None:
    """The split is by whole document, so a few large documents can put far more than
    `data.val_fraction` of the text in val (2 files: half of it), which training never sees."""
    val, total = index["val"]["tokens"], index["train"]["tokens"] + index["val"]["tokens"]
    if total and val / total > max(2 * val_fraction, val_fraction + 0.05):
        n_docs = index["train"]["documents"] + index["val"]["documents"]
        print(f"warning: the val split holds {val / total:.0%} of the tokens (data.val_fraction "
              f"= {val_fraction}): the split is by whole document ({index['val']['documents']} of "
              f"{n_docs} documents in val), and training never sees val: add documents, or cut "
              "long files into several", file=sys.stderr)


def cmd_train(cfg: Config, resume: bool = True) -> None:
    from kiln.parallel.distributed import is_main_process
    from kiln.run_dir import training_lock

    # rank 0 speaks for the run (the other ranks of a torchrun share its lock)
    lock = training_lock(cfg.run_dir) if is_main_process() else nullcontext()
    with lock:
        _train(cfg, resume)


def _train(cfg: Config, resume: bool) -> None:
    from kiln.parallel.distributed import shutdown
    from kiln.train.trainer import Trainer

    # first: a setting it refuses leaves the run alone (--fresh archives when training starts)
    trainer = Trainer(cfg, resume=resume)
    try:
        trainer.fit()
    finally:
        shutdown(trainer.env)


def cmd_eval(cfg: Config, distributed: bool = False) -> None:
    """`distributed`: under torchrun, the ranks share the windows and rank 0 reports (`kiln
    run` evaluates on rank 0 alone, after training has closed the process group)."""
    import torch

    from kiln.atomic import write_json_atomic
    from kiln.data.shards import load_index
    from kiln.eval import eval_file, perplexity_text
    from kiln.eval.perplexity import evaluate
    from kiln.parallel.distributed import DistEnv, init_distributed, local_device, shutdown
    from kiln.train.precision import resolve_device, resolve_precision
    from kiln.train.trained_run import load_trained_model

    device = resolve_device(cfg.train.device)
    env = init_distributed(device, flat_settings(cfg)) if distributed else DistEnv()
    device = local_device(device, env)
    try:
        with alike_on_every_rank():  # every rank reads the same checkpoint
            model, ckpt = load_trained_model(cfg)
        precision = resolve_precision(cfg.train.precision, device)
        model.to(device)
        e = cfg.eval
        with torch.inference_mode():
            result = evaluate(model, cfg.run_dir / "tokens", e.split, cfg.train.seq_len,
                              e.batch_size, e.max_batches, device, precision, env,
                              doc_mask=cfg.model.doc_mask)
    finally:
        shutdown(env)
    if not env.is_main:
        return
    result["unigram_bpb"] = load_index(cfg.run_dir / "tokens")["unigram_bpb"]
    result["checkpoint"], result["ranks"] = ckpt.name, env.world_size
    result["batch_size"], result["max_batches"] = e.batch_size, e.max_batches
    result["seq_len"], result["precision"] = cfg.train.seq_len, precision
    name = eval_file(e.split)
    write_json_atomic(cfg.run_dir / name, result)
    trained = recorded_config(cfg.run_dir)
    if trained is not None and trained.train.seq_len != cfg.train.seq_len:
        print(f"note: scored with {cfg.train.seq_len}-token windows; the model trained on "
              f"{trained.train.seq_len} (recorded in {name})", file=sys.stderr)
    baseline = result.get("unigram_bpb_scored")
    if baseline is not None:  # the baseline on exactly the tokens scored, whatever the split
        verdict = "below" if result["bpb"] < baseline else "NOT below"
        against = f"{verdict} the unigram baseline {baseline:.4f} on the same tokens"
    elif e.split == "val" and not e.max_batches:
        verdict = "below" if result["bpb"] < result["unigram_bpb"] else "NOT below"
        against = f"{verdict} the unigram baseline {result['unigram_bpb']:.4f}"
    else:  # shards from before the counts were saved: the baseline is the whole val split's
        against = (f"the whole val split's unigram baseline is {result['unigram_bpb']:.4f}, "
                   "not measured on these tokens: re-run `kiln tokenize` for one that is")
    print(f"eval ({e.split}): loss {result['loss']:.4f}, "
          f"perplexity {perplexity_text(result['perplexity'])}, "
          f"{result['bpb']:.4f} bits/byte ({against})")


def _prompt_seed(seed: int, prompt: str, repeat: int) -> int:
    """The seed of a prompt's generator: from the run's seed, the prompt's text and how many
    identical prompts came before it (a repeated prompt draws another sample)."""
    import hashlib

    key = f"{seed}\0{repeat}\0{prompt}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1


def _prompt_ids(tok, prompt: str, max_len: int) -> list[int]:
    """The ids `prompt` starts from, refused when they leave no room in the model's context
    (`max_len`) for a new token."""
    from kiln.data.tokenizer import eos_id

    # "" samples a document from its start: the EOS that ends the one before is the context
    ids = tok.encode(prompt).ids if prompt else [eos_id(tok)]
    if len(ids) >= max_len:
        shown = repr(prompt[:40]) + ("..." if len(prompt) > 40 else "")
        raise ConfigError(f"generate.prompts: {shown} is {len(ids)} tokens, which leaves no "
                          f"room in the model's context (model.max_seq_len = {max_len}): "
                          "shorten it")
    return ids


def _refuse_prompts_that_do_not_fit(cfg: Config) -> None:
    """`kiln run` asks, once the tokenizer is made, what `kiln generate` would refuse after
    training (and before the export that follows it)."""
    from kiln.data.tokenizer import load_tokenizer

    if not _tokenizer_path(cfg).is_file():  # no data stages ran: generate says what to run
        return
    tok = load_tokenizer(_tokenizer_path(cfg))
    for prompt in cfg.generate.prompts:
        _prompt_ids(tok, prompt, cfg.model.max_seq_len)


def cmd_generate(cfg: Config) -> None:
    import torch

    from kiln.atomic import write_json_atomic
    from kiln.data.provenance import run_tokenizer
    from kiln.data.sample_text import decode_sample
    from kiln.data.tokenizer import eos_id
    from kiln.model.sampling import decoding_settings, generate
    from kiln.train.precision import resolve_device
    from kiln.train.trained_run import load_trained_model

    model, ckpt = load_trained_model(cfg)
    model.to(resolve_device(cfg.train.device))
    tok = run_tokenizer(cfg.run_dir)
    g = cfg.generate
    samples = []
    max_len = model.cfg.max_seq_len
    seen: dict[str, int] = {}
    # every prompt checked before any is sampled: a long one last would waste the others' time
    prompt_ids = [_prompt_ids(tok, prompt, max_len) for prompt in g.prompts]
    for prompt, ids in zip(g.prompts, prompt_ids, strict=True):
        # one generator per prompt, seeded from its text: its sample depends neither on the
        # other prompts nor on its place in the list; on CPU, so samples match across devices
        repeat = seen[prompt] = seen.get(prompt, -1) + 1
        rng = torch.Generator().manual_seed(_prompt_seed(cfg.run.seed, prompt, repeat))
        if len(ids) + g.max_new_tokens > max_len:
            print(f"note: {prompt[:40]!r}: at most {max_len - len(ids)} new tokens fit the "
                  f"model's context of {max_len} (generate.max_new_tokens = {g.max_new_tokens})",
                  file=sys.stderr)
        out = generate(model, ids, g.max_new_tokens, temperature=g.temperature, top_k=g.top_k,
                       top_p=g.top_p, eos_id=eos_id(tok), generator=rng,
                       vocab_size=tok.get_vocab_size())
        # the sample's complete characters: a stop can cut the last one short
        completion, cut = decode_sample(tok, out, eos_id(tok))
        sample = {"prompt": prompt, "completion": completion}
        if cut:
            sample["incomplete_bytes_dropped"] = cut
        samples.append({**sample, **decoding_settings(g.temperature, g.top_k, g.top_p),
                        "checkpoint": ckpt.name})
        print(f"--- {prompt!r}{'' if prompt else ' (a document from its start)'}\n"
              f"{prompt}{completion}")
        if cut:
            print(f"note: {prompt[:40]!r}: the sample stopped inside a character; its last "
                  f"{cut} byte{'s' if cut > 1 else ''} (an incomplete UTF-8 character) "
                  f"{'are' if cut > 1 else 'is'} left out", file=sys.stderr)
    write_json_atomic(cfg.run_dir / "samples.json", samples)


def cmd_export(cfg: Config) -> None:
    from safetensors import SafetensorError

    from kiln.data.provenance import run_tokenizer
    from kiln.export import export_model
    from kiln.export.earlier import other_files_set_aside
    from kiln.export_recovery import is_whole_export, recover_export
    from kiln.train.trained_run import load_trained_model

    model, ckpt = load_trained_model(cfg)
    run_tokenizer(cfg.run_dir)
    out = cfg.run_dir / "export"
    recovered = recover_export(out, cfg.run_dir)  # the previous export, back before it is replaced
    if recovered:
        print(f"note: {recovered}", file=sys.stderr)
    try:
        with other_files_set_aside(out, cfg.run_dir) as moved:  # the export replaces it whole
            result = export_model(model, _tokenizer_path(cfg), out, cfg, ckpt.name)
    except (FileNotFoundError, PermissionError):  # each has its own advice
        raise
    except (OSError, SafetensorError) as e:  # a full disk: in safetensors' writer or ours
        kept = "the previous export is intact" if is_whole_export(out) else "nothing was exported"
        raise KilnError(f"cannot write {out} ({type(e).__name__}: {e}): is the disk full or "
                        f"read-only? {kept}; free space and run `kiln export` again") from e
    if moved:
        print(f"note: {moved}", file=sys.stderr)
    print(f"export ({result.format}): {ckpt.name} -> {result.path} ({result.note})")


def cmd_report(cfg: Config, compare: list[str] | tuple[str, ...] = ()) -> None:
    from kiln.report import build_report

    print(f"report: {build_report(cfg.run_dir, compare=[Path(c) for c in compare])}")


def cmd_run(cfg: Config, fresh: bool = False) -> None:
    """The whole chain. Under torchrun, rank 0 prepares the data and finishes the run.
    `fresh`: as `kiln train --fresh`, the model starts again from step 0, its earlier
    outputs moved to archive/ first (before the data stages, which a trained model's
    checkpoints would otherwise keep from re-making the data)."""
    from kiln.parallel.distributed import init_distributed, run_on_main, shutdown
    from kiln.train.precision import resolve_device

    env = init_distributed(resolve_device(cfg.train.device), flat_settings(cfg))
    stages = [("prepare", cmd_prepare), ("tokenizer", _tokenizer_unless_current),
              ("tokenize", _tokenize_unless_current)]

    def data_stages() -> None:
        if fresh:
            _archive_for_fresh(cfg)
        _timed(stages, cfg)
        _record_config(cfg)
        _refuse_prompts_that_do_not_fit(cfg)  # before hours of training, not after

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
    from kiln.data.provenance import tokenizer_is_current

    t = cfg.tokenizer
    if tokenizer_is_current(cfg.run_dir, t.kind, t.vocab_size, t.min_frequency):
        print(f"tokenizer: kept {_tokenizer_path(cfg)} (trained on these documents with these "
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


# verbs that make the run's data: they record the config they used (train records its own;
# eval, generate, export and report read a run and leave its config.toml alone)
_DATA_VERBS = ("prepare", "tokenizer", "tokenize")


def _refuse_remaking_trained_data(cfg: Config, verb: str, fresh: bool = False) -> None:
    """A run with checkpoints keeps the data they were trained on: re-making it with other
    settings, or from sources that changed since (a file added or edited), would leave the
    checkpoints (and a resume's loader position) describing data that is gone. The same
    settings on the same files re-make the same data, so a plain re-run is fine."""
    from kiln.data.pipeline import changed_inputs
    from kiln.train.checkpoint_dirs import latest_checkpoint

    if fresh or latest_checkpoint(cfg.run_dir / "checkpoints") is None:  # fresh: archived first
        return
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
                       "RUN` and the later verbs go on with the data already made")
    if changed:
        raise ConfigError(
            f"{cfg.run_dir} holds checkpoints trained on {what}; re-making the data would "
            "orphan them: use another run.dir, "
            + "start the model over with `kiln run --fresh` (its checkpoints, metrics and "
            "outputs move to archive/"
            + ("), " if verb == "run" else "; it then makes the data and trains again), ")
            + f"or move the trained model's {cfg.run_dir / 'checkpoints'} and metrics.jsonl "
            f"aside first{touched}")


def _refuse_new_model_design(cfg: Config, fresh: bool = False) -> None:
    """The trainer refuses a global batch the ranks cannot share, a design that trains wrong
    for a new model, one whose training state cannot fit in memory, and for a trained one
    other [model] settings; `kiln run` asks before its data stages rather than after."""
    import dataclasses

    from kiln.parallel.distributed import launched_ranks
    from kiln.train.checkpoint_dirs import latest_checkpoint
    from kiln.train.trainer import fit_micro_batch

    # a batch the ranks cannot share is refused before hours of data stages, not after
    fit_micro_batch(cfg.train.global_batch, cfg.train.micro_batch, launched_ranks())
    ckpt = None if fresh else latest_checkpoint(cfg.run_dir / "checkpoints")
    if ckpt is not None:  # a trained model goes on as it was: another [model] is refused now
        from kiln.errors import RunDataError
        from kiln.train.trainer import model_config_for_run, refuse_changed_model

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


def _record_config(cfg: Config) -> None:
    """Record the config the data was made with. A run with checkpoints keeps the config
    they were trained with: training records its own once it accepts the settings (a
    resume compares against the recorded one, and refuses some changes)."""
    from kiln.run_dir import write_run_metadata
    from kiln.train.checkpoint_dirs import latest_checkpoint

    if latest_checkpoint(cfg.run_dir / "checkpoints") is None:
        write_run_metadata(cfg)


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
        where = load_config(None, [o for o in overrides if o.split("=", 1)[0].strip() == "run.dir"])
        if (where.run_dir / "config.toml").exists():
            return resolve_config(str(where.run_dir), overrides)
        return load_config(None, overrides)
    path = Path(target)
    run = _enclosing_run(path)
    if run is not None and (path.is_dir() or path.suffix != ".toml"):  # a run's own file
        what = "folder" if path.is_dir() else "file"
        raise ConfigError(f"{path} is a {what} inside the run directory {run}, not a recipe or "
                          "a run directory: give that run directory instead")
    if path.is_dir():
        if not (path / "config.toml").exists():
            raise ConfigError(f"{path} is not a run directory (no config.toml)")
        moved = [o for o in overrides if o.split("=", 1)[0].strip() == "run.dir"]
        if moved and load_config(None, moved).run_dir.resolve() != path.resolve():
            raise ConfigError(f"the target is the run directory {path}, but --set {moved[-1]} "
                              "names another: give the run directory once, as the target")
        return load_config(path / "config.toml", [run_dir_override(path), *overrides],
                           recorded=True)
    return load_config(path, overrides)


def _enclosing_run(path: Path) -> Path | None:
    """The nearest folder above `path` that is a run directory (holds the config.toml and
    env.json Kiln records together), for a target inside a run (metrics.jsonl, a checkpoint)."""
    if not path.exists() or (path.is_dir() and (path / "config.toml").exists()):
        return None
    return next((p for p in path.absolute().parents
                 if (p / "config.toml").is_file() and (p / "env.json").is_file()), None)


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
                       help="override a config value, e.g. --set train.steps=100 (repeatable)")
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
    "train": "the checkpoints are written atomically; `kiln train RUN` resumes from the latest",
    "run": "what it had finished is kept (checkpoints and outputs are written atomically); "
           "`kiln run` again goes on (prepare skips finished tasks, train resumes from its last "
           "checkpoint, or starts over with the earlier records archived if it had none)",
}


def main(argv: list[str] | None = None) -> int:
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
                    _refuse_remaking_trained_data(cfg, args.verb, fresh)
                if args.verb == "run":
                    _refuse_new_model_design(cfg, fresh)  # before the data stages, not after
            if args.verb == "run":
                cmd_run(cfg, fresh)
            else:
                fn(cfg)
        if args.verb in _DATA_VERBS and is_main_process():
            _record_config(cfg)  # only after success: a failed command leaves the run's as it was
    except ConfigError as e:
        # a recipe or --set refused (while loading, or checked before any work) is refused
        # alike by every rank of a node: said once per node (a node whose recipe differs
        # still says why it stopped)
        if _said_here(e):
            print(f"kiln: config error: {_advice_for(args.verb, e)}", file=sys.stderr)
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
        if _said_here(e):
            print(f"kiln: {_advice_for(args.verb, e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        stop_under_way()  # torchrun's SIGTERM once another rank exits must not cut this short
        if isinstance(e, TrainingInterrupted):  # stopped at a step boundary and saved it
            if is_main_process():
                again = "`kiln run` again" if args.verb == "run" else \
                    f"`kiln train {cfg.run_dir}`"
                print(f"kiln: {args.verb}: training {e}; {again} goes on from there",
                      file=sys.stderr)
            return e.exit_code
        if isinstance(e, MainRankInterrupted):  # rank 0 stopped in work this rank waited for
            if first_on_its_node():  # rank 0 says it on its own node: one line per machine
                print(f"kiln: {args.verb} stopped: {e}; "
                      f"{_AFTER_INTERRUPT.get(args.verb, _KEPT)}", file=sys.stderr)
            return e.exit_code
        print(f"\nkiln: {args.verb} {_stopped_by(e)}; {_AFTER_INTERRUPT.get(args.verb, _KEPT)}",
              file=sys.stderr)
        return getattr(e, "exit_code", 130)
    except RuntimeError as e:
        if not lost_a_rank(e):
            raise
        from kiln.parallel.rank_stops import lost_rank_said, stopped_ranks

        after = _AFTER_INTERRUPT.get(args.verb, _KEPT)
        if stopped := stopped_ranks():  # a signal to those ranks alone: not a crash
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


def _said_here(e: BaseException) -> bool:
    """Whether this rank says `e`: an error every rank meets alike is said by the first
    rank of each node alone; any other by the rank that met it."""
    from kiln.parallel.distributed import first_on_its_node

    return not met_alike_on_every_rank(e) or first_on_its_node()


# verbs with nothing to share between ranks: under torchrun rank 0 runs them alone
_RANK_ZERO_VERBS = (*_DATA_VERBS, "generate", "export", "report")


if __name__ == "__main__":
    sys.exit(main())
