"""Document filters as datatrove pipeline steps: per-domain quality rules, Brain Rot junk rules
(M1 engagement, M2 semantic judge, token-matched arms) and perplexity scoring + surplexity
selection."""

from kiln.data.filters.arms import ArmSelector, order_key, plan_arms
from kiln.data.filters.engagement import EngagementFilter, TokenizerLength, m1_class, popularity
from kiln.data.filters.judge import (
    M2_PROMPT,
    Judge,
    KilnLabelJudge,
    PromptJudge,
    Verdict,
    parse_label,
)
from kiln.data.filters.junk_heuristics import HeuristicJudge, StyleThresholds
from kiln.data.filters.perplexity import PerplexityScorer
from kiln.data.filters.quality import DOMAINS, quality_filters
from kiln.data.filters.selection import (
    PerplexitySelector,
    quantile_band,
    scores_from,
    threshold_for_count,
    threshold_for_fraction,
)
from kiln.data.filters.semantic import SemanticQualityFilter

__all__ = [
    "ArmSelector", "order_key", "plan_arms",
    "DOMAINS", "EngagementFilter", "HeuristicJudge", "Judge", "KilnLabelJudge", "M2_PROMPT",
    "PerplexityScorer", "PerplexitySelector", "PromptJudge", "SemanticQualityFilter",
    "StyleThresholds", "TokenizerLength", "Verdict", "m1_class", "parse_label", "popularity",
    "quality_filters", "quantile_band", "scores_from", "threshold_for_count",
    "threshold_for_fraction",
]
