"""The data verbs, `kiln prepare`, `kiln tokenizer` and `kiln tokenize`: each makes one stage
of a run's data, and says what a user should look at before training on it (what prepare
lost, a tokenizer short of its vocabulary, a val split too large or too small)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kiln.config import Config


def cmd_prepare(cfg: Config) -> None:
    from kiln.data.edit_warnings import edit_warnings
    from kiln.data.pipeline import run_prepare
    from kiln.data.prepare_checks import validate_prepare
    from kiln.data.prepared import HASHES
    from kiln.data.sources import check_sources

    check_sources(cfg.data.sources)  # before anything is cleared
    # the checks of making data (`build_pipeline` runs them again): a refusal said alone,
    # not after the plan line below as if the prepare had started
    validate_prepare(cfg.prepare, making_data=True)
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
    from kiln.data.provenance import record_tokenizer, tokenizer_path

    path = tokenizer_path(cfg.run_dir)
    texts = (doc.text for doc in read_documents(cfg.run_dir))
    tok = train_tokenizer_of_kind(cfg.tokenizer.kind, texts, cfg.tokenizer.vocab_size,
                                  path, min_frequency=cfg.tokenizer.min_frequency,
                                  show_progress=sys.stderr.isatty())  # off a terminal: blank lines
    record_tokenizer(cfg.run_dir, cfg.tokenizer.kind, cfg.tokenizer.vocab_size,
                     cfg.tokenizer.min_frequency)
    print(f"tokenizer ({cfg.tokenizer.kind}): {tok.get_vocab_size()} tokens -> "
          f"{path}")
    if tok.get_vocab_size() < cfg.tokenizer.vocab_size:
        print(f"note: the documents hold only {tok.get_vocab_size()} distinct tokens' worth of "
              f"merges, fewer than tokenizer.vocab_size = {cfg.tokenizer.vocab_size}: more data, "
              "or a smaller vocab_size", file=sys.stderr)


def cmd_tokenize(cfg: Config) -> None:
    from kiln.data.prepared import prepared_count, read_documents
    from kiln.data.provenance import (
        shards_made_from,
        tokenizer_fits_other_documents,
        tokenizer_path,
    )
    from kiln.data.shards import write_shards
    from kiln.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_path(cfg.run_dir))
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


def record_config(cfg: Config) -> None:
    """Record the config the data was made with. A run with checkpoints keeps the config
    they were trained with: training records its own once it accepts the settings (a
    resume compares against the recorded one, and refuses some changes)."""
    from kiln.run_dir import write_run_metadata
    from kiln.train.checkpoint_dirs import latest_checkpoint
    from kiln.train.earlier_outputs import keep_earlier_records

    if latest_checkpoint(cfg.run_dir / "checkpoints") is None:
        keep_earlier_records(cfg.run_dir)  # an earlier model's, for its archive to come
        write_run_metadata(cfg)
