"""Brain Rot M2 as a pipeline step: judge each document, store the score, drop or tag junk.

The judge's score and reasons go into `doc.metadata` (`m2_junk_score`, `m2_reasons`,
`m2_label`, and `m2_judge`: which judge gave the score); a document that already carries a
score from the same judge is not judged again unless `rescore=True`, so a stricter or
looser `threshold` can be applied without re-running the (possibly expensive) judge. A
score from another judge (documents from an earlier run, judged by the heuristics, now
filtered with a Kiln model) is judged again, not reused.

The parts of a text the reader cut (over 1,000,000 characters: metadata `part_of`) are one
document: each takes the verdict of the first of them that reaches this filter (a Kiln
judge reads a long post's start anyway). Judged alone, a junk-looking part was dropped from
a kept text, leaving a hole.
"""

from __future__ import annotations

from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.writers.disk_base import DiskWriter

from kiln.data.filters.judge import Judge, judge_identity
from kiln.data.long_documents import FirstPartVerdict

# the version of this stage's rules (kiln.data.stage_rules): bump it with any change to
# how M2 labels, drops or tags a document by its judge's score
RULES_VERSION = "2026-12-07"

M2_FIELDS = ("m2_junk_score", "m2_reasons", "m2_judge")


class SemanticQualityFilter(BaseFilter):
    """Label = "junk" when junk_score >= threshold, "high_quality" below, "unparsed" when the
    judge gave no answer. mode "drop" removes junk (`m2_junk`) and unparsed (`m2_unparsed`,
    the reject bucket); mode "tag" keeps everything and only writes metadata.
    """

    name = "🧠 Brain Rot M2 semantic quality"

    def __init__(
        self,
        judge: Judge | None = None,
        threshold: float = 0.5,
        mode: str = "drop",
        rescore: bool = False,
        exclusion_writer: DiskWriter | None = None,
    ):
        super().__init__(exclusion_writer)
        if mode not in ("drop", "tag"):
            raise ValueError(f"SemanticQualityFilter mode must be 'drop' or 'tag', got {mode!r}")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        if judge is None:
            from kiln.data.filters.junk_heuristics import HeuristicJudge

            judge = HeuristicJudge()
        if not isinstance(judge, Judge):
            raise TypeError(f"judge must have a judge(text) -> Verdict method, got {type(judge)}")
        self.judge, self.threshold, self.mode, self.rescore = judge, threshold, mode, rescore
        self.judge_id = judge_identity(judge)
        self._first = FirstPartVerdict()  # the M2 fields of a cut text's first part

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        md = doc.metadata
        held = self._first.of(doc)
        if held is not None:
            md.update(held)
        else:
            if self.rescore or "m2_junk_score" not in md or md.get("m2_judge") != self.judge_id:
                verdict = self.judge.judge(doc.text)
                md["m2_junk_score"] = verdict.junk_score
                md["m2_reasons"] = list(verdict.reasons)
                md["m2_judge"] = self.judge_id
                self.stat_update("m2_judged")
            self._first.keep(doc, {k: md.get(k) for k in M2_FIELDS})
        score = doc.metadata["m2_junk_score"]
        if score is None:
            label = "unparsed"
        else:
            label = "junk" if score >= self.threshold else "high_quality"
        doc.metadata["m2_label"] = label
        self.stat_update(f"m2_{label}")
        if self.mode == "drop" and label != "high_quality":
            return False, f"m2_{label}"
        return True
