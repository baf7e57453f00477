"""An offline stand-in for Brain Rot's M2 LLM labeller: explainable junk-style signals.

The paper labels each post JUNK / HIGH-QUALITY with gpt-4o-mini. Its junk cues: conspiracy
or exaggerated, unsupported claims; clickbait and sensational trigger words; extremely short
posts without context; spam / promotional repetition; superficial lifestyle bragging. Its
quality cues: factual and sourced, thoughtful analysis, educational content, clear reasoning.
Without an LLM we score surface markers of those cues. Each signal adds a fixed weight
(capped per signal) and quality cues subtract; the score is clipped to [0, 1]. The weights
are ours (not the paper's): they are a documented heuristic to be validated against a
local-model judge's labels before trusting them on a new corpus.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kiln.data.filters.judge import Verdict

# (signal, pattern list, weight per hit, cap). Patterns are lowercase, matched on word bounds.
_LEXICONS: tuple[tuple[str, tuple[str, ...], float, float], ...] = (
    ("sensational", (
        "shocking", "unbelievable", "insane", "mind-blowing", "mind blowing", "jaw-dropping",
        "you won't believe", "you wont believe", "omg", "epic fail", "gone wrong", "exposed",
        "destroyed", "breaking", "must see", "must-see", "crazy", "bombshell",
    ), 0.25, 0.5),
    ("conspiracy", (
        "they don't want you to know", "wake up", "sheeple", "cover-up", "cover up", "hoax",
        "the truth about", "mainstream media", "do your own research", "plandemic",
        "false flag", "secret agenda", "big pharma", "deep state",
    ), 0.35, 0.7),
    ("bragging", (
        "living my best life", "blessed", "#goals", "vacay", "so lucky", "perfect body",
        "perfect life", "killing it", "boss babe", "hustle", "rich life", "first class",
        "new lambo", "just bought",
    ), 0.25, 0.5),
    ("promotional", (
        "click here", "link in bio", "follow me", "dm me", "giveaway", "buy now",
        "limited time", "subscribe", "use code", "retweet if", "like and share", "rt if",
        "follow for more", "sign up now", "free followers",
    ), 0.3, 0.6),
)

_CLICKBAIT_TEMPLATES = tuple(re.compile(p) for p in (
    r"^\s*\d+\s+(things|reasons|ways|tricks|secrets|signs|facts|photos)\b",
    r"\bwhat happen(s|ed) next\b",
    r"\bthis is why\b",
    r"\bwill (blow your mind|shock you|make you cry)\b",
    r"\bnumber \d+ will\b",
    r"\b(doctors|experts|scientists) hate\b",
    r"\bone weird trick\b",
))
_CLICKBAIT_WEIGHT, _CLICKBAIT_CAP = 0.4, 0.8

_QUALITY_LEXICONS: tuple[tuple[str, tuple[str, ...], float, float], ...] = (
    ("reasoning", ("because", "therefore", "however", "thus", "which means", "as a result",
                   "in contrast", "for example", "since"), 0.15, 0.3),
    ("evidence", ("according to", "study", "studies", "data", "research", "percent",
                  "et al", "source:", "published", "measured", "survey"), 0.15, 0.3),
)

_WORD = re.compile(r"[^\s]+")
_TAG = re.compile(r"(?<!\w)[#@]\w+")
_URL = re.compile(r"https?://\S+")


def _hits(text: str, phrases: tuple[str, ...]) -> list[str]:
    return [p for p in phrases if re.search(r"(?<!\w)" + re.escape(p) + r"(?!\w)", text)]


@dataclass(frozen=True)
class StyleThresholds:
    """Surface-style limits; exceeding one adds its weight once."""

    caps_word_ratio: float = 0.3  # share of >= 2-letter words written in ALL CAPS
    exclamations_per_word: float = 0.1
    tags_per_word: float = 0.2  # hashtags + @-mentions
    urls_per_word: float = 0.1
    min_words: int = 5  # "extremely short content without context"
    long_words: int = 30  # substantive length: a small quality cue


class HeuristicJudge:
    """Junk score in [0, 1] from lexicons, clickbait templates and style; reasons name each cue."""

    def __init__(self, style: StyleThresholds | None = None):
        self.style = style or StyleThresholds()
        self.identity = f"heuristic:{self.style}"  # scores stored under other cues are redone

    def judge(self, text: str) -> Verdict:
        low = text.lower()
        words = _WORD.findall(text)
        n = max(len(words), 1)
        junk, quality, reasons = 0.0, 0.0, []
        for name, phrases, weight, cap in _LEXICONS:
            if hits := _hits(low, phrases):
                junk += min(weight * len(hits), cap)
                reasons += [f"{name}:{h}" for h in hits]
        templates = [t.pattern for t in _CLICKBAIT_TEMPLATES if t.search(low)]
        if templates:
            junk += min(_CLICKBAIT_WEIGHT * len(templates), _CLICKBAIT_CAP)
            reasons += [f"clickbait_template:{p}" for p in templates]
        s = self.style
        alpha = [w for w in words if sum(c.isalpha() for c in w) >= 2]
        style = {
            "all_caps": sum(w.isupper() for w in alpha) / max(len(alpha), 1) > s.caps_word_ratio,
            "exclamations": text.count("!") / n > s.exclamations_per_word or "!!" in text,
            "tags_mentions": len(_TAG.findall(text)) / n > s.tags_per_word,
            "urls": len(_URL.findall(text)) / n > s.urls_per_word,
            "too_short": len(words) < s.min_words,
        }
        weights = {"all_caps": 0.3, "exclamations": 0.2, "tags_mentions": 0.3, "urls": 0.2,
                   "too_short": 0.3}
        for name, fired in style.items():
            if fired:
                junk += weights[name]
                reasons.append(f"style:{name}")
        for name, phrases, weight, cap in _QUALITY_LEXICONS:
            if hits := _hits(low, phrases):
                quality += min(weight * len(hits), cap)
                reasons += [f"quality_{name}:{h}" for h in hits]
        if len(words) >= s.long_words:
            quality += 0.1
            reasons.append("quality_length")
        return Verdict(junk_score=min(max(junk - quality, 0.0), 1.0), reasons=tuple(reasons))
