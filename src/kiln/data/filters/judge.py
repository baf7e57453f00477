"""Brain Rot M2 judges: anything that turns a text into a junk score with reasons.

The paper asks gpt-4o-mini for a bare label, JUNK or HIGH-QUALITY. Offline we offer:
`PromptJudge` (any local text-generation callable, its reply parsed strictly), and
`KilnLabelJudge` (a Kiln checkpoint comparing the likelihoods of the two labels after the
prompt). `junk_heuristics.HeuristicJudge` is the model-free fallback. A reply that is not
a label gives `junk_score=None`: it goes to a reject bucket, never silently to "quality".
That departs on purpose from the authors' script, where any reply but exactly "JUNK" joins
the high-quality set: a refusal or a chatty reply would enter the control arm unseen.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

JUNK, HIGH_QUALITY = "JUNK", "HIGH-QUALITY"

# The authors' prompt (their repo, datasets/process/M2/M2_data_process_gpt.py) is a chat
# instruction: a "content quality classifier" role, the same six JUNK and five HIGH-QUALITY
# criteria, "respond with only the classification", then the tweet last, with no cue after
# it. Ours condenses the same criteria and ends in "Label:", so that the label is the text
# that follows, which is what `KilnLabelJudge` scores with a base (not instruction-tuned)
# model. Pass `template=` (a `{text}` where the tweet goes) to use the authors' wording.
M2_PROMPT = (
    "Classify the social-media post below as JUNK or HIGH-QUALITY.\n"
    "JUNK: conspiracy theories or exaggerated, unsupported claims; clickbait or sensational "
    "trigger words; extremely short content without context; misinformation; spam or "
    "promotional repetition; superficial lifestyle bragging (success, vacations, perfect "
    "relationships or looks).\n"
    "HIGH-QUALITY: factual and sourced; thoughtful analysis; educational or substantive; "
    "clear reasoning; a meaningful contribution.\n"
    "Answer with the label only.\n\nPost: {text}\nLabel:"
)


@dataclass(frozen=True)
class Verdict:
    """junk_score in [0, 1] (1 = junk), or None when the judge gave no usable answer."""

    junk_score: float | None
    reasons: tuple[str, ...] = ()


@runtime_checkable
class Judge(Protocol):
    def judge(self, text: str) -> Verdict: ...


def judge_identity(judge: Judge) -> str:
    """What a stored score is checked against before it is reused: the judge's `identity`
    (its kind and whatever changes its scores), else its class name."""
    return str(getattr(judge, "identity", None) or type(judge).__qualname__)


def _template_tag(template: str) -> str:
    return hashlib.sha256(template.encode()).hexdigest()[:12]


def parse_label(reply: str) -> str | None:
    """JUNK / HIGH-QUALITY from a bare-label reply ("junk.", "High quality"); else None."""
    norm = reply.strip().strip(".!\"'`*").strip().upper().replace("_", "-").replace(" ", "-")
    if norm == JUNK:
        return JUNK
    if norm in (HIGH_QUALITY, "HIGHQUALITY"):
        return HIGH_QUALITY
    return None


class PromptJudge:
    """Ask a local generator (prompt -> reply text) for the label; score 1 / 0 / None."""

    def __init__(self, generate: Callable[[str], str], template: str = M2_PROMPT):
        if "{text}" not in template:
            raise ValueError("the prompt template must contain '{text}'")
        try:  # here, not in a worker at the first post: str.format reads every brace
            template.format(text="")
        except (KeyError, IndexError, ValueError, AttributeError) as e:
            raise ValueError(f"the prompt template has a brace that is not '{{text}}' "
                             f"({type(e).__name__}: {e}): write a literal brace as {{{{ or }}}}"
                             ) from e
        self.generate, self.template = generate, template
        name = getattr(generate, "__qualname__", type(generate).__qualname__)
        self.identity = f"prompt:{name}:{_template_tag(template)}"

    def judge(self, text: str) -> Verdict:
        reply = self.generate(self.template.format(text=text))
        label = parse_label(reply)
        if label is None:
            return Verdict(None, (f"unparsed_reply:{reply.strip()[:60]}",))
        return Verdict(1.0 if label == JUNK else 0.0, (f"label:{label}",))


class KilnLabelJudge:
    """A Kiln checkpoint as a zero-shot labeller: P(JUNK) among the two label continuations.

    junk_score = sigmoid(log p(" JUNK" | prompt) - log p(" HIGH-QUALITY" | prompt)), the
    summed label-token log-likelihoods (the multiple-choice rule of lm-eval). The template's
    head and the post are tokenized as one text, as training saw such text: apart, the
    head's trailing space became a lone token and the post's first word lost its space. The
    post is truncated (its tokens, keeping its start) so that prompt + label[:-1], what the
    model reads, fit max_seq_len.
    """

    def __init__(self, run_dir: str | Path, template: str = M2_PROMPT, device: str = "cpu"):
        from kiln.data.filters.run_model import check_run_dir, checkpoint_identity

        if template.count("{text}") != 1:
            raise ValueError("the prompt template must contain '{text}' exactly once")
        self.run_dir, self.template, self.device = check_run_dir(run_dir), template, device
        # the checkpoint too: the run trained on is another judge, its stored scores not ours
        self.checkpoint = checkpoint_identity(run_dir)  # the weights `_load` must find
        self.identity = (f"kiln:{Path(self.run_dir).resolve()}:{self.checkpoint}:"
                         f"{_template_tag(template)}")
        self._loaded = None
        self._check_fit()

    def _check_fit(self) -> None:
        """The prompt must fit the model (tokenizer and config, no weights): checked when the
        judge is made, not in a task after the stages before it ran."""
        from kiln.data.filters.run_model import run_max_seq_len
        from kiln.data.provenance import run_tokenizer

        _, head_len, tail, labels = self._parts(run_tokenizer(self.run_dir))
        self._room(run_max_seq_len(self.run_dir), head_len, tail, labels)

    def _parts(self, tok) -> tuple[str, int, list[int], list[list[int]]]:
        """(template head, its token count, tail ids, the two labels' ids)."""
        head, tail = self.template.split("{text}")
        def ids(text: str) -> list[int]:  # as `kiln tokenize` encodes: no post-processor tokens
            return tok.encode(text, add_special_tokens=False).ids

        labels = [ids(" " + JUNK), ids(" " + HIGH_QUALITY)]
        return head, len(ids(head)), ids(tail), labels

    @staticmethod
    def _room(max_seq_len: int, head_len: int, tail: list[int], labels: list[list[int]]) -> int:
        """Tokens of head + post that fit before the tail and the longer label. The model
        reads prompt + label[:-1] (`continuation_nll`: a label's last token is predicted,
        never read), so the label takes one position fewer than its length."""
        label_inputs = max(map(len, labels)) - 1
        room = max_seq_len - len(tail) - label_inputs
        if room <= head_len:
            raise ValueError(f"the prompt template does not fit max_seq_len {max_seq_len}: its "
                             f"head, tail and longer label (all but its last token) take "
                             f"{head_len + len(tail)} + {label_inputs} tokens, leaving none "
                             "for the post")
        return room

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_loaded": None}

    def _load(self):
        if self._loaded is None:
            from kiln.data.filters.run_model import load_pinned_run_model

            # scores are stored under the checkpoint the judge was made with
            model, tok, _ = load_pinned_run_model(self.run_dir, self.device, self.checkpoint,
                                                  "M2 judge")
            self._loaded = (model, tok, *self._parts(tok))
        return self._loaded

    def prompt_ids(self, text: str) -> list[int]:
        model, tok, head, head_len, tail, labels = self._load()
        room = self._room(model.cfg.max_seq_len, head_len, tail, labels)
        from kiln.data.filters.first_tokens import first_token_ids

        # the prompt's first `room` tokens from a prefix, not the whole post (up to 1 MB)
        return first_token_ids(tok, [head + text], room)[0] + tail

    def judge(self, text: str) -> Verdict:
        from kiln.data.filters.run_model import continuation_nll

        model, *_, labels = self._load()
        prompt = self.prompt_ids(text)
        (junk_nll, _), (hq_nll, _) = continuation_nll(model, [prompt, prompt], labels, self.device)
        d = hq_nll - junk_nll  # log p(junk) - log p(high-quality); stable sigmoid below
        score = 1.0 / (1.0 + math.exp(-d)) if d >= 0 else math.exp(d) / (1.0 + math.exp(d))
        return Verdict(score, (f"logp_junk={-junk_nll:.3f}", f"logp_hq={-hq_nll:.3f}"))
