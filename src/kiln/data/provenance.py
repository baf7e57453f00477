"""Which documents and tokenizer a run's token shards were made from.

`kiln prepare` and `kiln tokenizer` can be re-run after `kiln tokenize`; the shards would
then silently describe documents that are gone, or ids another tokenizer maps to other
text. The index records what the shards were made from, and the verbs that read them
check it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tokenizers import Tokenizer

from kiln import strict_json
from kiln.data.long_documents import CUT_RULE_KEY
from kiln.data.prepare_config import stage_options
from kiln.data.prepare_signature import RULE_MARKERS
from kiln.data.prepared import HASHES, check_documents_unchanged, documents_renamed
from kiln.data.shard_hashes import check_shard_hashes
from kiln.data.shards import load_index, load_token_bytes
from kiln.data.stage_rules import RULES_KEYS
from kiln.data.tokenizer import load_tokenizer, token_byte_lengths
from kiln.data.yield_report import LAYOUT_FILE
from kiln.errors import RunDataError
from kiln.hashing import file_sha256

# 1 hashed prepare.json's bytes alone; 2 left out the stages' options; 3 left out the rule
# markers but the decontamination normalisation and the cut rule (documents re-made under
# another PII-forms or perplexity rule with the same counts kept their fingerprint)
FINGERPRINT_FORMAT = 4
# records still compared, each as its format hashed: a format-3 record (the documents and
# the tokenizer a run's shards were made from) stands while those documents are unchanged,
# so no run re-makes its shards, nor refuses its resume, for a change of format alone. Its
# fingerprint cannot tell a re-make under another of those two rules (the gap this closes).
COMPARED_FORMATS = (3, 4)


def tokenizer_path(run_dir: Path) -> Path:
    return Path(run_dir) / "tokenizer" / "tokenizer.json"


def documents_fingerprint(run_dir: Path, fmt: int = FINGERPRINT_FORMAT) -> str | None:
    """What the finished prepare made, hashed: its summary (stages, document and byte
    counts), the options of its stages (an injection seed, a filter threshold: other
    documents, or another order, with the same counts), the fingerprint of the files it
    read (names under their source folder, sizes, contents) and the rules of this Kiln its
    documents were made under (RULE_MARKERS). Re-made documents that differ change it, even
    with the same counts (an edited file, a rule changed); the same prepare re-run does not,
    nor one in another number of tasks, nor the same folder spelled another way (`d`, `d/`,
    an absolute path). `fmt`: as a Kiln that recorded that FINGERPRINT_FORMAT hashed it."""
    path = Path(run_dir) / "prepare.json"  # written last by a finished `kiln prepare`
    if not path.is_file():
        return None
    layout = Path(run_dir) / "logs" / "prepare" / LAYOUT_FILE
    try:
        summary = strict_json.loads(path.read_text(encoding="utf-8"))
        signature = (json.loads(layout.read_text(encoding="utf-8"))["signature"]
                     if layout.is_file() else {})
        inputs = signature["input_files"] if signature else None
        options = [stage_options(signature), signature.get("decontaminate_normalisation")]
        if "text_field" in signature:  # recorded only when not "text": older runs' stand
            options.append({"text_field": signature["text_field"]})
        # parts cut by another rule are other documents, perhaps with the same counts; only
        # where texts were cut (`long_texts`), so the documents of other runs keep theirs
        if "long_texts" in summary and CUT_RULE_KEY in signature:
            options.append({CUT_RULE_KEY: signature[CUT_RULE_KEY]})
        parts = [inputs, options]
        if fmt >= 4:  # each marker is recorded only where its stage ran (the cut rule: above);
            # the stages' rules versions too, as recorded (`pii_rules` by a Kiln before them,
            # so its runs' fingerprints stand)
            parts.append({k: signature[k] for k in (*RULE_MARKERS, *RULES_KEYS)
                          if k in signature and k != CUT_RULE_KEY})
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise RunDataError(f"{path} or {layout} is damaged ({e}); re-run `kiln prepare`") from e
    # the skipped files are named as the sources were spelled (`d/x`, `./d/x`): not what
    # was made, like the sources themselves
    # nor the documents files' hashes: gzip stamps the time, and tasks split them otherwise
    what = {k: v for k, v in summary.items()
            if k not in ("tasks", "sources", "skipped_examples", HASHES)}
    made = json.dumps([what, *parts], sort_keys=True)
    return hashlib.sha256(made.encode()).hexdigest()[:16]


def made_from(run_dir: Path, fmt: int = FINGERPRINT_FORMAT) -> dict:
    """What `kiln tokenize` records in the index it writes."""
    return {"documents": documents_fingerprint(run_dir, fmt), "format": fmt}


def recorded_format(record: object) -> int:
    """The fingerprint format a record (an index's `made_from`, a tokenizer's record) was
    written in, where it is one still compared; else this Kiln's (it then differs)."""
    fmt = record.get("format") if isinstance(record, dict) else None
    return fmt if fmt in COMPARED_FORMATS else FINGERPRINT_FORMAT


def tokens_match_documents(run_dir: Path) -> bool:
    """The shards were made from the documents now in the run (True where it cannot be
    told: an index written before Kiln recorded this or in a format no longer compared,
    and a run with no prepared documents to compare)."""
    made = load_index(Path(run_dir) / "tokens").get("made_from")
    if not isinstance(made, dict) or made.get("format") not in COMPARED_FORMATS:
        return True
    # None: shards brought into a run without documents
    now = documents_fingerprint(run_dir, made["format"])
    return now is None or made.get("documents") == now


def shards_documents(run_dir: Path, made: dict) -> object:
    """The documents `made` (the run's index's `made_from`) records, as this Kiln's format
    hashes them, so that runs whose shards were recorded in two formats compare by their data
    (`kiln report --compare`): a record in an older format still compared stands for the
    documents now where they still match it; else (format, fingerprint) as recorded, equal
    to no record of another format."""
    fmt, recorded = made.get("format"), made.get("documents")
    if fmt == FINGERPRINT_FORMAT or fmt not in COMPARED_FORMATS or not recorded:
        return recorded
    try:
        if documents_fingerprint(run_dir, fmt) == recorded:
            return documents_fingerprint(run_dir)
    except (OSError, RunDataError):
        pass
    return (fmt, recorded)


def documents_unchanged(run_dir: Path) -> bool:
    """The documents files are the ones prepare wrote (by the sha256 it recorded, taken again
    only where a file's stat changed), or prepare.json records none to compare (a prepare from
    before Kiln took them). The fingerprint is of what prepare read and reported: a word
    edited in a documents file since leaves it as it was, not the text re-made data would hold."""
    try:
        check_documents_unchanged(run_dir)
    except (OSError, RunDataError):
        return False
    return not documents_renamed(run_dir)


def check_tokenizer(run_dir: Path, tok: Tokenizer) -> None:
    """Refuse a tokenizer other than the one the shards (and so a model trained on them)
    were made with: compared by vocabulary size and by the bytes each id stands for."""
    tokens = Path(run_dir) / "tokens"
    trained, saved = load_index(tokens)["vocab_size"], load_token_bytes(tokens)
    if tok.get_vocab_size() != trained or (
            saved is not None and not (token_byte_lengths(tok) == saved).all()):
        raise RunDataError(
            f"{tokenizer_path(run_dir)} is not the tokenizer the run's token shards were made "
            f"with ({tokens}: {trained} tokens; it has {tok.get_vocab_size()}"
            f"{', with other tokens' if tok.get_vocab_size() == trained else ''}): restore the "
            "run's tokenizer, or re-run `kiln tokenize` and train again")


def run_tokenizer(run_dir: Path) -> Tokenizer:
    """The run's tokenizer, checked against its token shards."""
    tok = load_tokenizer(tokenizer_path(run_dir))
    check_tokenizer(run_dir, tok)
    return tok


def check_tokens_current(run_dir: Path) -> None:
    """Before training: the shards were made from the run's documents and tokenizer."""
    tokens = Path(run_dir) / "tokens"
    if not tokens_match_documents(run_dir):
        raise RunDataError(
            f"{tokens} was made from other documents than the run holds now (`kiln prepare` "
            "ran since `kiln tokenize`): re-run `kiln tokenize` (a run with checkpoints then "
            "starts over with `kiln train --fresh`)")
    if tokenizer_path(run_dir).is_file():  # none: nothing the shards could disagree with
        run_tokenizer(run_dir)


# -- what `kiln run` may keep: a tokenizer and shards already made from the same inputs ------

TOKENIZER_RECORD = "made_from.json"  # beside tokenizer.json


def _file_hash(path: Path) -> str:
    return file_sha256(path)[:16]


def _tokenizer_inputs(run_dir: Path, kind: str, vocab_size: int, min_frequency: int,
                      fmt: int = FINGERPRINT_FORMAT) -> dict:
    return {"documents": documents_fingerprint(run_dir, fmt), "kind": kind,
            "vocab_size": vocab_size, "min_frequency": min_frequency, "format": fmt}


def record_tokenizer(run_dir: Path, kind: str, vocab_size: int, min_frequency: int) -> None:
    """After `kiln tokenizer`: the documents and settings it was trained from, and its hash."""
    from kiln.atomic import write_json_atomic

    record = {**_tokenizer_inputs(run_dir, kind, vocab_size, min_frequency),
              "tokenizer": _file_hash(tokenizer_path(run_dir))}
    write_json_atomic(tokenizer_path(run_dir).parent / TOKENIZER_RECORD, record)


def tokenizer_is_current(run_dir: Path, kind: str, vocab_size: int, min_frequency: int) -> bool:
    """The run's tokenizer was trained, by `kiln tokenizer`, on the documents now in the run
    (unchanged since prepare) with these settings, and is unchanged since: training it again would make the same one."""
    path = tokenizer_path(run_dir)
    record = path.parent / TOKENIZER_RECORD
    if (documents_fingerprint(run_dir) is None or not path.is_file() or not record.is_file()
            or not documents_unchanged(run_dir)):
        return False
    try:
        recorded = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    inputs = _tokenizer_inputs(run_dir, kind, vocab_size, min_frequency,
                               recorded_format(recorded))
    return recorded == {**inputs, "tokenizer": _file_hash(path)}


def tokenizer_fits_other_documents(run_dir: Path, made: dict) -> bool:
    """The run's tokenizer, as `kiln tokenizer` trained it (file unchanged since), was
    trained on other documents than the run holds now: `kiln prepare` ran since. `made` is
    `shards_made_from(run_dir)` (the documents and tokenizer now). A tokenizer put in by
    hand, or kept on purpose, has no such record or another hash."""
    try:
        record = strict_json.loads((tokenizer_path(run_dir).parent / TOKENIZER_RECORD)
                            .read_text(encoding="utf-8"))
        return (made["documents"] is not None and record.get("tokenizer") == made["tokenizer"]
                and record.get("documents")
                != documents_fingerprint(run_dir, recorded_format(record)))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return False


def shards_made_from(run_dir: Path, fmt: int = FINGERPRINT_FORMAT) -> dict:
    """What `kiln tokenize` records in the index: the documents (checked before training)
    and the tokenizer file (so `kiln run` can tell the shards current)."""
    return {**made_from(run_dir, fmt), "tokenizer": _file_hash(tokenizer_path(run_dir))}


def tokens_are_current(run_dir: Path, val_fraction: float, seed: int) -> bool:
    """The token shards were made from the documents (unchanged since prepare) and tokenizer
    now in the run with this split, and every shard is whole and unchanged (its hash, where the index has one, checked
    as the loader does): `kiln tokenize` would write the same ones."""
    import numpy as np

    tokens = Path(run_dir) / "tokens"
    if not tokenizer_path(run_dir).is_file():
        return False
    if documents_fingerprint(run_dir) is None or not documents_unchanged(run_dir):
        return False
    try:
        index = load_index(tokens)
        expected = shards_made_from(run_dir, recorded_format(index.get("made_from")))
        itemsize = np.dtype(index["dtype"]).itemsize
        whole = all((tokens / shard["file"]).stat().st_size == shard["tokens"] * itemsize
                    for split in ("train", "val") for shard in index[split]["shards"])
        if whole:
            for split in ("train", "val"):
                check_shard_hashes(tokens, index[split]["shards"])
    except (OSError, ValueError, TypeError, KeyError, RunDataError):
        return False
    return (whole and index.get("val_fraction") == val_fraction and index.get("seed") == seed
            and index.get("made_from") == expected)


def data_settings_differ(run_dir: Path, seed: int, val_fraction: float,
                         tokenizer: dict[str, object]) -> list[str]:
    """'key: made with X, set to Y' for the settings the run's shards and tokenizer were made
    with (tokens/index.json, tokenizer/made_from.json) that differ from these. A new model
    trained on them would record settings that do not describe its data, and the next
    `kiln run` would re-make the data under the trained model."""
    try:
        index = load_index(Path(run_dir) / "tokens")
    except (OSError, RunDataError):
        return []
    made = {"run.seed": (index.get("seed"), seed),
            "data.val_fraction": (index.get("val_fraction"), val_fraction)}
    try:
        record = strict_json.loads((tokenizer_path(run_dir).parent / TOKENIZER_RECORD).read_text(
            encoding="utf-8"))
    except (OSError, ValueError):
        record = {}
    if isinstance(record, dict):
        made |= {f"tokenizer.{k}": (record.get(k), v) for k, v in tokenizer.items()}
    return [f"{key}: made with {was!r}, set to {now!r}" for key, (was, now) in made.items()
            if was is not None and was != now]
