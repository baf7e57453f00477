"""Brain Rot token-matched arms: junk and control documents mixed at a junk ratio r within a
fixed token budget B (Xing et al. 2025, arXiv:2510.13928: "classify until control tokens
exceed 1,223,412, cap junk at the same budget"; dose-response arms r in {0, .2, .5, .8, 1},
"total tokens fixed").

A budget needs every labelled document's token count, so, as perplexity selection does, it
is two passes: `plan_arms` (one task over the whole labelled pool: `ArmPlanner`) picks each
arm's cut in a fixed order, and `ArmSelector` applies the cut while streaming.

- Labels: M1's `m1_class` ("junk" / "control"; "neither" and "unknown" are dropped as
  `arms_m1_neither` / `arms_m1_unknown`), or M2's `m2_label` ("junk" / "high_quality" =
  control; "unparsed" dropped as `arms_m2_unparsed`).
- Targets: junk = round(r * B) tokens, control = B - junk (they add up to B exactly).
- Order: each arm's documents sorted by `order_key` = sha256 of (seed, id, text): seeded,
  and the same whatever `prepare.tasks` shards the input into (pool order is not). The
  parts of a text cut by the reader (`part_of`) share their text's key (`arm_key`): a
  fragment of a text in an arm without the rest of it is no sample of the pool.
- Fill: documents are taken in that order while the arm's total is still below its target,
  so the arm stops *after* crossing it (as the paper's "until control tokens exceed"): its
  tokens are in [target, target + the last document's tokens), one document of overshoot at
  most; a target of 0 takes nothing. Documents past the cut are dropped as
  `arms_junk_over_budget` / `arms_control_over_budget`.
- B = 0: B = min(junk tokens, control tokens) of the pool, the largest budget *every* ratio
  can fill, so the five dose-response arms made with B = 0 from one pool share their total
  (for r = 0.5 alone, 2 * min would fit, but then the arms' totals would differ).
- Documents of one key (a cut text's parts; exact duplicates, same id and text: run
  `dedup_exact` first) are kept or cut together and counted as one step of the fill, so
  the overshoot is at most that group's tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.writers.disk_base import DiskWriter

from kiln.atomic import write_json_atomic
from kiln.data.long_documents import cut_text_of

# the version of this stage's rules (kiln.data.stage_rules): bump it with any change to
# how the arms are planned and documents kept
RULES_VERSION = "2026-12-07"

ARMS = ("junk", "control")
LABEL_KEYS = {"m1": "m1_class", "m2": "m2_label"}
# label value -> arm; any other value is dropped as arms_<labels>_<value>
ARM_OF = {"m1": {"junk": "junk", "control": "control"},
          "m2": {"junk": "junk", "high_quality": "control"}}


def order_key(seed: int, doc_id: str, text: str) -> str:
    """The document's place in its arm's fill order (hex sha256; a seed reorders all)."""
    h = hashlib.sha256(f"{seed}\0{doc_id}\0".encode("utf-8", "surrogatepass"))
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def arm_key(seed: int, doc: Document) -> str:
    """`doc`'s `order_key`; for a part of a cut text, its text's (source, `part_of`), so all
    its parts fall on one side of the cut."""
    text = cut_text_of(doc)
    return order_key(seed, doc.id, doc.text) if text is None else order_key(
        seed, f"part_of\0{text[0]}\0{text[1]}", "")


def arm_of(doc: Document, labels: str) -> tuple[str | None, str]:
    """(arm, "") for a junk / control document, else (None, drop reason)."""
    key = LABEL_KEYS[labels]
    if key not in doc.metadata:
        raise KeyError(f"document {doc.id} has no metadata[{key!r}]: run brain_rot_{labels} "
                       "(mode 'tag') before brain_rot_arms")
    label = doc.metadata[key]
    arm = ARM_OF[labels].get(label)
    return (arm, "") if arm else (None, f"arms_{labels}_{label}")


def targets(ratio: float, budget: int) -> dict[str, int]:
    """Token targets of the two arms: junk round(r * B), control the rest of B."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"ratio must be in [0, 1], got {ratio}")
    junk = round(ratio * budget)
    return {"junk": junk, "control": budget - junk}


def _no_default_budget(ratio: float, pool: dict[str, int], has: str) -> str:
    """Why budget 0 (the scarcer arm's tokens) keeps nothing, and what to set instead: a
    budget in tokens when the ratio's arms have some, else labelled documents."""
    needed = [arm for arm, share in zip(ARMS, (ratio, 1 - ratio)) if share > 0]
    if all(pool[arm] for arm in needed):
        return (f"budget 0 tokens (as many as the scarcer arm holds) keeps nothing: {has}; set "
                f"the budget in tokens (ratio {ratio} takes {' and '.join(needed)} tokens: at "
                f"most {min(pool[arm] for arm in needed):,} here)")
    return (f"budget 0 tokens keeps nothing: {has}, and ratio {ratio} needs "
            f"{' and '.join(needed)} documents (label some, or change the ratio)")


def plan_arms(items: Iterable[tuple[str, str, int]], ratio: float, budget: int) -> dict:
    """Each arm's cut from (arm, order_key, tokens) of every labelled document.

    Returns {"budget", "ratio", "pool": {arm: tokens}, arm: {"target", "tokens", "docs",
    "cutoff"}}, `cutoff` the largest key kept (None: none kept). Raises ValueError when the
    pool holds fewer tokens than an arm's target, or (budget 0) an arm has none, naming what
    each arm has.
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    targets(ratio, budget)  # the ratio checked
    # {arm: {key: [tokens, documents]}}: a key's documents (a text's parts, duplicates) are
    # kept together, so they are counted together (counted one by one, the fill stopped
    # inside a group and the selector kept the rest unreported)
    by_arm: dict[str, dict[str, list[int]]] = {arm: {} for arm in ARMS}
    for arm, key, tokens in items:
        group = by_arm[arm].setdefault(key, [0, 0])
        group[0] += int(tokens)
        group[1] += 1
    pool = {arm: sum(t for t, _ in groups.values()) for arm, groups in by_arm.items()}
    docs = {arm: sum(n for _, n in groups.values()) for arm, groups in by_arm.items()}
    has = (f"the pool has {pool['junk']:,} junk tokens ({docs['junk']} documents) and "
           f"{pool['control']:,} control tokens ({docs['control']} documents)")
    if budget == 0 and min(pool.values()) == 0:  # "lower the budget" cannot help here
        raise ValueError(_no_default_budget(ratio, pool, has))
    if budget == 0:
        budget = min(pool.values())
    want = targets(ratio, budget)
    if any(pool[arm] < want[arm] for arm in ARMS):
        raise ValueError(
            f"budget {budget:,} tokens at ratio {ratio} needs {want['junk']:,} junk and "
            f"{want['control']:,} control tokens, but {has}: lower the budget (0: the most "
            "both arms allow)")
    plan: dict = {"budget": budget, "ratio": ratio, "pool": pool}
    for arm in ARMS:
        total, taken, cutoff = 0, 0, None
        for key in sorted(by_arm[arm]):
            if total >= want[arm]:
                break
            tokens, n = by_arm[arm][key]
            total, taken, cutoff = total + tokens, taken + n, key
        plan[arm] = {"target": want[arm], "tokens": total, "docs": taken, "cutoff": cutoff}
    return plan


class ArmSelector(BaseFilter):
    """Keep the documents of the plan's arms (`order_key <= cutoff`), tagging `brain_rot_arm`;
    the plan is a dict or the JSON file the planning pass wrote (read in the worker)."""

    name = "⚖️ Brain Rot arms"

    def __init__(self, labels: str, seed: int, plan: dict | Path,
                 exclusion_writer: DiskWriter | None = None):
        super().__init__(exclusion_writer)
        if labels not in LABEL_KEYS:
            raise ValueError(f"labels must be one of {list(LABEL_KEYS)}, got {labels!r}")
        self.labels, self.seed = labels, seed
        self.plan_path = None if isinstance(plan, dict) else Path(plan)
        self._plan = plan if isinstance(plan, dict) else None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_plan": None if self.plan_path else self._plan}

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        if self._plan is None:
            from kiln import strict_json

            self._plan = strict_json.loads(self.plan_path.read_text(encoding="utf-8"))
        arm, reason = arm_of(doc, self.labels)
        if arm is None:
            return False, reason
        cutoff = self._plan[arm]["cutoff"]
        if cutoff is None or arm_key(self.seed, doc) > cutoff:
            return False, f"arms_{arm}_over_budget"
        doc.metadata["brain_rot_arm"] = arm
        return True


class ArmPlanner(PipelineStep):
    """One task over every labelled document: each Brain Rot arm's cut -> a JSON file.

    Token counts: those of `tokenizer` (a local tokenizer.json, special tokens included, as
    the paper): for M2 labels, and for M1's where a stage since M1 rewrote the texts; else
    M1's own `m1_tokens` (the same count of the same text).
    """

    type = "📊 - SCORER"
    name = "⚖️ Kiln Brain Rot arms plan"

    def __init__(self, labels: str, ratio: float, budget: int, seed: int, tokenizer: str,
                 out: Path):
        super().__init__()
        self.labels, self.ratio, self.budget, self.seed = labels, ratio, budget, seed
        self.tokenizer, self.out = tokenizer, Path(out)

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        from kiln.data.filters.engagement import TokenizerLength
        from kiln.errors import RunDataError

        if world_size != 1:
            raise ValueError("the Brain Rot arms plan needs every document: run with tasks=1")
        length = TokenizerLength(self.tokenizer) if self.tokenizer else None

        def items():
            for doc in data or ():
                arm, _ = arm_of(doc, self.labels)
                if arm is not None:
                    tokens = length(doc.text) if length else doc.metadata["m1_tokens"]
                    yield arm, arm_key(self.seed, doc), tokens

        try:
            plan = plan_arms(items(), self.ratio, self.budget)
        except ValueError as e:
            raise RunDataError(f"prepare.brain_rot_arms.budget: {e}") from None
        for arm in ("junk", "control"):
            self.stat_update(f"{arm}_tokens", value=plan[arm]["tokens"])
        write_json_atomic(self.out, {"labels": self.labels, "seed": self.seed, **plan})
        return
        yield  # a generator that yields nothing: the documents stay in the intermediate folder
