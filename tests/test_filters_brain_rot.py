"""Brain Rot junk rules: M1 engagement thresholds at their edges, M2 judges and parsing."""

from __future__ import annotations

import pytest
from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import get_filter_result

from kiln.data.filters import (
    EngagementFilter,
    HeuristicJudge,
    PromptJudge,
    SemanticQualityFilter,
    TokenizerLength,
    Verdict,
    m1_class,
    parse_label,
    popularity,
)
from kiln.data.tokenizer import train_tokenizer


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def n_words(text: str) -> int:
    return len(text.split())


def tweet(n: int, likes: int, retweets: int = 0, replies: int = 0, quotes: int = 0) -> Document:
    return Document(text=words(n), id=f"{n}-{likes}",
                    metadata=dict(likes=likes, retweets=retweets, replies=replies, quotes=quotes))


@pytest.mark.parametrize("n_tokens, pop, expected", [
    (10, 900, "junk"), (150, 20, "control"), (10, 20, "neither"), (150, 900, "neither"),
    (30, 900, "neither"),  # junk needs < 30 tokens (strict)
    (29, 900, "junk"),
    (10, 500, "neither"),  # junk needs popularity > 500 (strict)
    (10, 501, "junk"),
    (150, 500, "control"),  # control: popularity <= 500
    (100, 20, "neither"),  # control needs > 100 tokens (strict)
    (101, 20, "control"),
])
def test_m1_class_at_threshold_edges(n_tokens, pop, expected):
    assert m1_class(n_tokens, pop) == expected


def test_m1_filter_drops_junk_and_tags_metadata():
    flt = EngagementFilter(length=n_words)
    junk = tweet(29, likes=300, retweets=150, replies=50, quotes=1)  # sum 501 > 500
    edge = tweet(29, likes=300, retweets=150, replies=50, quotes=0)  # sum 500: not popular
    control = tweet(101, likes=10)
    assert get_filter_result(flt.filter(junk)) == (False, "m1_junk")
    assert junk.metadata["m1_class"] == "junk" and junk.metadata["m1_popularity"] == 501
    assert flt.filter(edge) is True and edge.metadata["m1_class"] == "neither"
    assert flt.filter(control) is True and control.metadata["m1_class"] == "control"
    assert control.metadata["m1_tokens"] == 101


def test_m1_likes_only_and_tag_mode():
    doc = tweet(10, likes=400, retweets=400)
    assert EngagementFilter(length=n_words, popularity_keys=("likes",)).filter(doc) is True
    assert doc.metadata["m1_class"] == "neither"
    assert EngagementFilter(length=n_words, mode="tag").filter(tweet(10, likes=900)) is True


def test_m1_missing_or_bad_engagement_is_unknown_and_kept():
    assert popularity({"likes": 3}) is None
    assert popularity({"likes": "9", "retweets": 0, "replies": 0, "quotes": 0}) is None
    assert popularity({"likes": -1, "retweets": 0, "replies": 0, "quotes": 0}) is None
    doc = Document(text=words(5), id="x", metadata={"likes": 10_000})
    assert EngagementFilter(length=n_words).filter(doc) is True
    assert doc.metadata["m1_class"] == "unknown"
    with pytest.raises(ValueError, match="mode"):
        EngagementFilter(length=n_words, mode="keep")


def test_m1_tokenizer_length_counts_a_local_tokenizer(tmp_path):
    path = tmp_path / "tok.json"
    tok = train_tokenizer(["hello world"] * 20, 300, path, show_progress=False)
    length = TokenizerLength(path)
    assert length("hello world hello") == len(tok.encode("hello world hello").ids)
    with pytest.raises(FileNotFoundError):
        TokenizerLength(tmp_path / "missing.json")


@pytest.mark.parametrize("reply, label", [
    ("JUNK", "JUNK"), ("junk.", "JUNK"), (" Junk\n", "JUNK"), ("HIGH-QUALITY", "HIGH-QUALITY"),
    ("high quality", "HIGH-QUALITY"), ("High_Quality.", "HIGH-QUALITY"),
    ("maybe junk", None), ("", None), ("The label is JUNK", None),
])
def test_m2_label_parser(reply, label):
    assert parse_label(reply) == label


def test_m2_stub_llm_unknown_replies_go_to_reject_bucket():
    replies = iter(["JUNK", "HIGH-QUALITY", "I cannot decide"])
    judge = PromptJudge(lambda prompt: next(replies))
    flt = SemanticQualityFilter(judge)
    docs = [Document(text=f"post {i}", id=str(i)) for i in range(3)]
    results = [get_filter_result(flt.filter(d)) for d in docs]
    assert results == [(False, "m2_junk"), (True, None), (False, "m2_unparsed")]
    assert [d.metadata["m2_label"] for d in docs] == ["junk", "high_quality", "unparsed"]
    assert docs[2].metadata["m2_junk_score"] is None


CLICKBAIT = [
    "You won't believe what happened next!!! SHOCKING #viral #omg @everyone",
    "10 secrets doctors hate. Number 7 will blow your mind! Click here, link in bio",
    "WAKE UP. The truth about the vaccine they don't want you to know!!",
    "Living my best life in Bali, so blessed #goals #vacay #blessed",
]
INFORMATIVE = [
    "According to a 2023 survey of 2,000 households, energy use fell by 8 percent because "
    "heat pumps replaced gas boilers; however, the data cover only urban areas, so the "
    "result may not hold in rural regions.",
    "The study measured river temperatures at twelve sites over five years. Warmer water in "
    "late summer reduced oxygen levels, which means fish moved upstream, as a result of which "
    "the published counts shifted toward the colder tributaries.",
]


def test_m2_heuristic_separates_clickbait_from_informative():
    judge = HeuristicJudge()
    junk = [judge.judge(t) for t in CLICKBAIT]
    good = [judge.judge(t) for t in INFORMATIVE]
    assert all(v.junk_score >= 0.5 for v in junk), [v.junk_score for v in junk]
    assert all(v.junk_score == 0.0 for v in good), [v.junk_score for v in good]
    assert any(r.startswith("clickbait_template") for r in junk[1].reasons)
    assert "style:exclamations" in junk[0].reasons and "style:tags_mentions" in junk[0].reasons
    assert any(r.startswith("conspiracy") for r in junk[2].reasons)
    assert any(r.startswith("bragging") for r in junk[3].reasons)


def test_m2_threshold_changes_without_rescoring():
    class Counting:
        calls = 0

        def judge(self, text):
            Counting.calls += 1
            return Verdict(0.6, ("fixed",))

    doc = Document(text="anything", id="d")
    assert get_filter_result(SemanticQualityFilter(Counting(), threshold=0.5).filter(doc)) == (
        False, "m2_junk")
    assert SemanticQualityFilter(Counting(), threshold=0.7).filter(doc) is True
    assert doc.metadata["m2_label"] == "high_quality" and Counting.calls == 1
    SemanticQualityFilter(Counting(), threshold=0.7, rescore=True).filter(doc)
    assert Counting.calls == 2


def test_m2_rejects_bad_judge_and_threshold():
    with pytest.raises(TypeError):
        SemanticQualityFilter(judge=lambda t: 1.0)
    with pytest.raises(ValueError):
        SemanticQualityFilter(threshold=1.5)


def test_a_score_from_another_judge_is_judged_again():
    """Documents from an earlier run carry its judge's m2_junk_score: a filter with another
    judge must judge them itself, and the same judge reuses its own score."""
    from datatrove.data import Document

    from kiln.data.filters import HeuristicJudge, SemanticQualityFilter

    text = "SHOCKING!!! You won't believe what happened next. Link in bio, giveaway, RT IF you agree"
    stale = {"m2_junk_score": 0.0, "m2_reasons": [], "m2_judge": "kiln:/elsewhere:abc"}
    f = SemanticQualityFilter(HeuristicJudge())
    doc = Document(text, "x", metadata=dict(stale))
    assert f.filter(doc) == (False, "m2_junk")
    assert doc.metadata["m2_judge"].startswith("heuristic:")
    doc.metadata["m2_junk_score"] = 0.0  # the same judge's stored score is reused as it is
    assert f.filter(doc) is True


def test_m1_config_defaults_are_the_papers_rule():
    """`[prepare.brain_rot_m1]` copies the filter's constants (prepare_config stays free of
    datatrove): both must be the paper's junk < 30 tokens and popularity > 500, control
    > 100 tokens, popularity the sum of the four twitter100m engagement counts."""
    from kiln.data import prepare_config as pc
    from kiln.data.filters import engagement as e

    o = pc.BrainRotM1Options()
    assert (o.junk_max_tokens, o.control_min_tokens, o.popularity_threshold) == (30, 100, 500)
    assert (e.JUNK_MAX_TOKENS, e.CONTROL_MIN_TOKENS, e.POPULARITY_THRESHOLD) == (30, 100, 500)
    assert tuple(o.popularity_keys) == e.ENGAGEMENT_KEYS == ("likes", "retweets", "replies",
                                                             "quotes")
    assert (pc.BrainRotM2Options().threshold, pc.BrainRotM2Options().mode) == (0.5, "drop")


@pytest.mark.parametrize("template", ['Reply as {"label": ...}. Post: {text}', "{0} {text}",
                                      "{text} }", "{text} {text:x!}",
                                      "{text} {text.title_case}"])
def test_a_prompt_template_with_a_stray_brace_is_refused_when_the_judge_is_made(template):
    """str.format fills the template: a literal brace (a JSON example in the prompt) raised
    KeyError in a worker at the first post, after the stages before it ran."""
    with pytest.raises(ValueError, match="a brace that is not '{text}'.*{{ or }}"):
        PromptJudge(lambda prompt: "JUNK", template=template)
    seen: list[str] = []
    judge = PromptJudge(lambda prompt: seen.append(prompt) or "JUNK",
                        template='Reply as {{"label": ...}}. Post: {text}')
    assert judge.judge("x").junk_score == 1.0 and seen == ['Reply as {"label": ...}. Post: x']


def test_a_popularity_field_named_twice_is_refused():
    """popularity_keys = ["likes", "likes"] summed the likes twice: a tweet of 300 likes had
    popularity 600 and went as junk (> 500), silently. The filter and the config refuse it."""
    from kiln.config import load_config
    from kiln.errors import ConfigError

    with pytest.raises(ValueError, match="names a field twice"):
        EngagementFilter(length=n_words, popularity_keys=("likes", "likes"))
    with pytest.raises(ConfigError, match=r"popularity_keys names \['likes'\] more than once"):
        load_config(None, ['prepare.brain_rot_m1.popularity_keys=["likes", "quotes", "likes"]'])


def test_the_parts_of_a_cut_text_take_its_first_parts_m2_verdict():
    """A text over 1,000,000 characters comes as parts (`part_of`): a junk-looking part was
    judged alone and dropped from a kept text. Every part takes its first part's verdict."""
    from kiln.data.long_documents import PART_OF

    calm = ("According to the survey data, the results were measured because the study "
            "design required it; therefore the findings are published with their sources.")
    loud = "SHOCKING!!! You won't believe it. Link in bio, giveaway, RT IF you agree"
    parts = [Document(text=t, id=f"book#{i + 1}", metadata={PART_OF: "book"})
             for i, t in enumerate((calm, loud, calm))]
    flt = SemanticQualityFilter(HeuristicJudge())
    assert [flt.filter(d) for d in parts] == [True, True, True]
    assert len({d.metadata["m2_junk_score"] for d in parts}) == 1
    alone = Document(text=loud, id="next#1", metadata={PART_OF: "next"})
    assert get_filter_result(flt.filter(alone)) == (False, "m2_junk")  # another text, judged
