"""Score every document's perplexity under a Kiln checkpoint (the "surplexity" score pass).

Gambetta et al. (arXiv:2410.12341) select training documents by the current model's
perplexity, exp(mean over positions of -log p(x_t | x_<t)), truncated to 512 tokens. This
step only *scores*: it writes `ppl`, `nll` (mean nats per token) and `ppl_tokens` into
`doc.metadata`, so selection (`selection.py`) can change thresholds without rescoring.

Both score a 512-position window. The paper's code truncates the *input* to 512 tokens, its
tokenizer's BOS included, and scores the 511 document tokens after BOS; Kiln puts EOS (the
separator it trains with) where BOS was and also scores the 512th token, which that window
predicts but the paper's truncation cut off: one token more per long document.

The parts of a text the reader cut (over 1,000,000 characters: metadata `part_of`) are one
document: each takes the score of the first of them that reaches this step, its text's first
512 tokens as the paper scores a document. Scored alone, each part was scored on its own
start, and selection kept some parts of a book and dropped others (a text with holes).
"""

from __future__ import annotations

import math
from pathlib import Path

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.batching import batched

from kiln.data.filters.first_tokens import first_token_ids
from kiln.data.filters.run_model import (
    check_run_dir,
    checkpoint_identity,
    continuation_nll,
    load_pinned_run_model,
    run_max_seq_len,
)
from kiln.data.long_documents import FirstPartVerdict

# the version of this stage's rules (kiln.data.stage_rules): bump it with any change to
# how a document is scored (its tokens, its parts)
RULES_VERSION = "2026-12-07"

PAPER_MAX_TOKENS = 512  # the paper truncates every document to its first 512 tokens


def doc_token_limit(max_seq_len: int, max_tokens_per_doc: int | None) -> int:
    """Tokens scored per document: `max_tokens_per_doc`, else the paper's 512 or what the
    model holds; ValueError when the model cannot hold them.

    Scoring n tokens feeds the model n positions, EOS and the first n - 1 tokens (the last
    token is only predicted, never an input), so a model scores up to max_seq_len tokens."""
    limit = max_tokens_per_doc or min(PAPER_MAX_TOKENS, max_seq_len)
    if limit > max_seq_len:
        raise ValueError(f"max_tokens_per_doc = {limit} does not fit the model: its context "
                         f"(model.max_seq_len {max_seq_len}) holds EOS + {max_seq_len - 1} "
                         f"document tokens, which predict {max_seq_len}; set at most "
                         f"{max_seq_len}, or leave it unset (0) for the paper's "
                         f"{PAPER_MAX_TOKENS} tokens or what the model holds")
    return limit


def _scores(doc: Document) -> dict:
    return {k: doc.metadata[k] for k in ("ppl", "nll", "ppl_tokens")}


class PerplexityScorer(PipelineStep):
    """Mean token NLL and perplexity of each document under `run_dir`'s latest checkpoint.

    Documents are tokenized with the run's tokenizer (a prefix long enough to give the same
    first tokens: time and memory do not grow with the document), truncated to `max_tokens_per_doc`
    tokens (default: 512 as in the paper, or max_seq_len when the model is shorter),
    preceded by EOS (the separator training puts before every document) and scored in
    batches without gradients. Empty documents get `ppl = None` (counted as `ppl_empty`).
    """

    type = "📊 - SCORER"
    name = "🔥 Kiln perplexity"

    def __init__(
        self,
        run_dir: str | Path,
        batch_size: int = 8,
        max_tokens_per_doc: int | None = None,
        device: str = "cpu",
    ):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_tokens_per_doc is not None and max_tokens_per_doc < 1:
            raise ValueError(f"max_tokens_per_doc must be >= 1, got {max_tokens_per_doc}")
        self.run_dir = check_run_dir(run_dir)
        doc_token_limit(run_max_seq_len(self.run_dir), max_tokens_per_doc)  # here, not in a task
        self.checkpoint = checkpoint_identity(self.run_dir)  # every task scores with these weights
        self.batch_size = batch_size
        self.max_tokens_per_doc = max_tokens_per_doc
        self.device = device
        self._loaded = None
        self._first = FirstPartVerdict()  # a cut text's first part (its scores once scored)

    def _load(self):
        if self._loaded is None:
            model, tok, _ = load_pinned_run_model(self.run_dir, self.device, self.checkpoint,
                                                  "perplexity scorer")
            from kiln.data.tokenizer import eos_id

            limit = doc_token_limit(model.cfg.max_seq_len, self.max_tokens_per_doc)
            self._loaded = (model, tok, eos_id(tok), limit)
        return self._loaded

    def __getstate__(self) -> dict:  # never ship a loaded model to executor workers
        return {**self.__dict__, "_loaded": None, "_first": FirstPartVerdict()}

    def score(self, docs: list[Document]) -> None:
        """Write ppl / nll / ppl_tokens into each document's metadata, in place; a later part
        of a cut text copies them from its first part (see the module note)."""
        followers: list[tuple[Document, Document | dict]] = []
        scored: list[Document] = []
        for doc in docs:
            held = self._first.of(doc)
            if held is not None:
                followers.append((doc, held))
                continue
            scored.append(doc)
            self._first.keep(doc, doc)
        if scored:
            self._score(scored)
        for doc, first in followers:
            doc.metadata.update(first if isinstance(first, dict) else _scores(first))
            self.stat_update("ppl_part_as_text")
        if isinstance(self._first.value, Document):  # its scores, not the part's text, kept
            self._first.value = _scores(self._first.value)

    def _score(self, docs: list[Document]) -> None:
        model, tok, eos, limit = self._load()
        # no post-processor tokens (`kiln tokenize` adds none); a prefix of each text, not the
        # whole up to 1 MB: the same ids (first_tokens)
        ids = first_token_ids(tok, [d.text for d in docs], limit)
        results = continuation_nll(model, [[eos]] * len(ids), ids, self.device, eos_id=eos)
        for doc, (nats, count) in zip(docs, results):
            if count == 0:
                doc.metadata.update(ppl=None, nll=None, ppl_tokens=0)
                self.stat_update("ppl_empty")
                continue
            mean = nats / count
            doc.metadata.update(ppl=math.exp(mean), nll=mean, ppl_tokens=count)
            self.stat_update("ppl_scored")

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        for batch in batched(data, self.batch_size):
            with self.track_time("batch"):
                self.score(batch)
            for doc in batch:
                self.update_doc_stats(doc)
                yield doc
