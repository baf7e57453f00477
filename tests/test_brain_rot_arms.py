"""Brain Rot token-matched arms (`brain_rot_arms`): the digest's budget-matcher checks, the
fill order (seeded, the same for any `prepare.tasks`) and the refusals."""

from __future__ import annotations

import json
import random

import pytest
from datatrove.data import Document
from datatrove.pipeline.base import PipelineStep

from kiln.config import ConfigError
from kiln.data import pipeline as pl
from kiln.data import prepare_config as pc
from kiln.data import stage_registry
from kiln.data.filters.arms import ArmSelector, arm_key, order_key, plan_arms, targets
from kiln.data.pipeline import PrepareConfig, register_stage, run_prepare
from kiln.data.prepare_checks import validate_prepare
from kiln.data.prepared import read_documents
from kiln.data.tokenizer import train_tokenizer
from kiln.errors import RunDataError


def pool(n: int = 2000, seed: int = 7) -> list[Document]:
    """Labelled tweets of random lengths: junk 3..29 tokens, control 101..300, some neither."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        label = rng.choice(["junk", "control", "neither"])
        tokens = rng.randint(3, 29) if label == "junk" else rng.randint(101, 300)
        docs.append(Document(text=f"tweet {i}", id=f"d{i}",
                             metadata={"m1_class": label, "m1_tokens": tokens}))
    return docs


def build(docs: list[Document], ratio: float, budget: int, seed: int = 0) -> tuple[dict, list]:
    items = [(d.metadata["m1_class"], arm_key(seed, d), d.metadata["m1_tokens"])
             for d in docs if d.metadata["m1_class"] in ("junk", "control")]
    plan = plan_arms(items, ratio, budget)
    sel = ArmSelector("m1", seed, plan)
    kept = [d for d in docs if sel.filter(d) is True]
    return plan, kept


def arm_tokens(kept: list[Document], arm: str) -> list[int]:
    return [d.metadata["m1_tokens"] for d in kept if d.metadata["brain_rot_arm"] == arm]


@pytest.mark.parametrize("ratio", [0.0, 0.2, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_arm_reaches_its_target_and_overshoots_by_at_most_one_document(ratio, seed):
    docs = pool(seed=seed)
    budget = 8_000
    plan, kept = build(docs, ratio, budget, seed)
    want = targets(ratio, budget)
    for arm in ("junk", "control"):
        tokens = arm_tokens(kept, arm)
        assert sum(tokens) == plan[arm]["tokens"] and len(tokens) == plan[arm]["docs"]
        if want[arm] == 0:
            assert tokens == []  # r = 0 and r = 1 are pure
            continue
        last = sorted((order_key(seed, d.id, d.text), d.metadata["m1_tokens"]) for d in kept
                      if d.metadata["brain_rot_arm"] == arm)[-1][1]
        assert want[arm] <= sum(tokens) < want[arm] + last  # stops just after crossing
        assert sum(tokens) - last < want[arm]  # one document fewer would fall short


def _kept_as_planned(plan: dict, kept: list[Document]) -> None:
    for arm in ("junk", "control"):
        tokens = arm_tokens(kept, arm)
        assert (sum(tokens), len(tokens)) == (plan[arm]["tokens"], plan[arm]["docs"]), arm


@pytest.mark.parametrize("seed", range(3))
def test_a_cut_texts_parts_are_kept_or_cut_together(seed):
    """The parts of a text the reader cut (`part_of`) had keys of their own: the cut fell
    between them and an arm held a fragment of the text without the rest."""
    rng = random.Random(seed)
    parts = [Document(text=f"part {k} of text {t}", id=f"big{t}.txt#{k}",
                      metadata={"m1_class": "control", "m1_tokens": rng.randint(101, 300),
                                "part_of": f"big{t}.txt", "source": "src"})
             for t in range(60) for k in range(3)]
    plan, kept = build(pool(400, seed) + parts, 0.0, 30_000, seed)
    kept_parts = {d.id for d in kept}
    for t in range(60):
        assert len({f"big{t}.txt#{k}" in kept_parts for k in range(3)}) == 1, t
    assert any(d.id in kept_parts for d in parts) and not all(d.id in kept_parts for d in parts)
    _kept_as_planned(plan, kept)


def test_documents_of_one_key_are_counted_as_the_selector_keeps_them():
    """Exact duplicates share a key and are kept together, but the plan counted them one by
    one: the fill stopped between two copies, the selector kept both, and the arm held more
    tokens and documents than its plan said."""
    docs = pool(600)
    plan, kept = build(docs + [Document(d.text, d.id, metadata=dict(d.metadata)) for d in docs],
                       0.5, 8_000)
    _kept_as_planned(plan, kept)


@pytest.mark.parametrize("seed", range(5))
def test_a_20_percent_mixture_has_a_fifth_junk_tokens(seed):
    _, kept = build(pool(seed=seed), 0.2, 8_000, seed)
    junk, control = sum(arm_tokens(kept, "junk")), sum(arm_tokens(kept, "control"))
    assert 0.19 <= junk / (junk + control) <= 0.21


def test_pure_arms_and_neither_documents_dropped_by_reason():
    docs = pool()
    for ratio, arm in ((0.0, "control"), (1.0, "junk")):
        _, kept = build(docs, ratio, 3_000)
        assert kept and {d.metadata["m1_class"] for d in kept} == {arm}
    sel = ArmSelector("m1", 0, build(docs, 0.5, 3_000)[0])
    neither = next(d for d in docs if d.metadata["m1_class"] == "neither")
    assert sel.filter(neither) == (False, "arms_m1_neither")
    reasons = {sel.filter(d) for d in docs if d.metadata["m1_class"] != "neither"}
    assert {(False, "arms_junk_over_budget"), (False, "arms_control_over_budget"), True} == reasons


def test_the_fill_order_is_seeded_and_deterministic():
    docs = pool()
    ids = [sorted(d.id for d in build(docs, 0.5, 6_000, seed)[1]) for seed in (0, 0, 1)]
    assert ids[0] == ids[1] and ids[0] != ids[2]


def test_budget_zero_is_what_the_scarcer_arm_holds():
    docs = pool()
    plan, _ = build(docs, 0.5, 0)
    assert plan["budget"] == min(plan["pool"].values())
    for ratio in (0.0, 1.0):  # every ratio fills that budget, so the arms share their total
        assert build(docs, ratio, 0)[0]["budget"] == plan["budget"]


def test_a_budget_past_the_pool_names_what_each_arm_has():
    docs = pool()
    plan, _ = build(docs, 0.5, 0)
    junk, control = plan["pool"]["junk"], plan["pool"]["control"]
    with pytest.raises(ValueError, match=rf"pool has {junk:,} junk tokens .* {control:,} control"):
        build(docs, 1.0, junk + 1)
    with pytest.raises(ValueError, match="ratio must be in"):
        targets(1.5, 10)
    only_control = [d for d in docs if d.metadata["m1_class"] != "junk"]
    with pytest.raises(ValueError, match=r"budget 0 tokens .* pool has 0 junk tokens \(0 doc"):
        build(only_control, 0.0, 0)  # a budget of 0 would keep nothing, not even at ratio 0


def test_budget_zero_with_an_empty_arm_says_what_to_set():
    """A pool without junk and budget 0 was told "needs 0 junk and 0 control tokens, but the
    pool has ... 120 control tokens: lower the budget": a budget of 0 cannot be lowered, and
    the control arm (ratio 0) can be filled. The message names the budget that would do,
    or (ratio 0.5) that junk documents are missing."""
    control = [Document(text=f"c{i}", id=f"c{i}",
                        metadata={"m1_class": "control", "m1_tokens": t})
               for i, t in enumerate((50, 70))]
    for ratio, message in ((0.0, "set the budget in tokens .*at most 120 here"),
                           (0.5, "ratio 0.5 needs junk and control documents")):
        with pytest.raises(ValueError, match=message) as caught:
            build(control, ratio, 0)
        assert "lower the budget" not in str(caught.value)
    assert build(control, 0.0, 120)[0]["control"]["docs"] == 2  # the named budget works


def test_m2_labels_high_quality_is_control_and_unparsed_is_dropped():
    plan = {"junk": {"cutoff": "f" * 64}, "control": {"cutoff": "f" * 64}}
    sel = ArmSelector("m2", 0, plan)
    labelled = {lab: Document(text="t", id=lab, metadata={"m2_label": lab})
                for lab in ("junk", "high_quality", "unparsed")}
    assert sel.filter(labelled["junk"]) is True
    assert sel.filter(labelled["high_quality"]) is True
    assert labelled["high_quality"].metadata["brain_rot_arm"] == "control"
    assert sel.filter(labelled["unparsed"]) == (False, "arms_m2_unparsed")
    with pytest.raises(KeyError, match="m2_label.*brain_rot_m2"):
        sel.filter(Document(text="t", id="x", metadata={}))


# ---- through the prepare pipeline --------------------------------------------------------------

class FakeM1(PipelineStep):
    """M1's tags from each record's `kind` field, tokens = words (no tokenizer file needed)."""

    name = "fake M1"

    def run(self, data, rank: int = 0, world_size: int = 1):
        for doc in data:
            doc.metadata.update(m1_class=doc.metadata["kind"], m1_tokens=len(doc.text.split()))
            yield doc


@pytest.fixture
def fake_m1():
    saved, saved_f = dict(pl.STAGES), dict(stage_registry._FACTORIES)
    register_stage("brain_rot_m1", lambda ctx: FakeM1())
    yield
    pl.STAGES.clear(), pl.STAGES.update(saved)
    stage_registry._FACTORIES.clear(), stage_registry._FACTORIES.update(saved_f)


def tweets_corpus(tmp_path):
    rng = random.Random(3)
    src = tmp_path / "src"
    src.mkdir()
    for f in range(6):
        with open(src / f"s{f}.jsonl", "w") as out:
            for i in range(60):
                kind = rng.choice(["junk", "control", "neither"])
                n = rng.randint(2, 29) if kind == "junk" else rng.randint(101, 160)
                words = " ".join(f"w{f}_{i}_{k}" for k in range(n))
                out.write(json.dumps({"text": words, "kind": kind}) + "\n")
    return src


def arms_cfg(tasks: int, **options) -> PrepareConfig:
    return PrepareConfig(stages=["read", "brain_rot_m1", "brain_rot_arms", "write"], tasks=tasks,
                         brain_rot_m1=pc.BrainRotM1Options(tokenizer="unused", mode="tag"),
                         brain_rot_arms=pc.BrainRotArmsOptions(**options))


def test_the_arms_are_the_same_for_one_and_three_tasks(tmp_path, fake_m1):
    src = tweets_corpus(tmp_path)
    kept, plans = [], []
    for tasks in (1, 3):
        run = tmp_path / f"t{tasks}"
        run_prepare(arms_cfg(tasks, ratio=0.2, budget=6000, seed=5), run, [str(src)],
                    progress=False)
        docs = list(read_documents(run))
        kept.append(sorted((d.id, d.metadata["brain_rot_arm"]) for d in docs))
        plans.append(json.loads((run / "prepare_work/brain_rot_arms/arms.json").read_text()))
        junk = sum(d.metadata["m1_tokens"] for d in docs if d.metadata["brain_rot_arm"] == "junk")
        total = sum(d.metadata["m1_tokens"] for d in docs)
        assert 0.19 <= junk / total <= 0.21 and 6000 <= total
        assert plans[-1]["junk"]["target"] == 1200 and plans[-1]["control"]["target"] == 4800
        yields = json.loads((run / "yield.json").read_text())
        assert "arms_m1_neither" in json.dumps(yields)  # dropped, counted by reason
    assert kept[0] == kept[1] and plans[0] == plans[1]


def test_a_budget_the_pool_cannot_fill_stops_the_prepare(tmp_path, fake_m1):
    src = tweets_corpus(tmp_path)
    with pytest.raises(RunDataError, match=r"prepare.brain_rot_arms.budget: .*pool has [\d,]+ "
                                           r"junk tokens .* [\d,]+ control tokens"):
        run_prepare(arms_cfg(1, ratio=1.0, budget=10**9), tmp_path / "run", [str(src)],
                    progress=False)


@pytest.mark.parametrize(("change", "message"), [
    (dict(arms=dict(ratio=1.5)), r"brain_rot_arms.ratio must be in \[0, 1\].*1.5"),
    (dict(arms=dict(ratio=-0.1)), r"brain_rot_arms.ratio must be in \[0, 1\]"),
    (dict(arms=dict(budget=-1)), r"brain_rot_arms.budget must be >= 0"),
    (dict(arms=dict(labels="m3")), r"brain_rot_arms.labels: 'm3'"),
    (dict(stages=["read", "brain_rot_arms", "write"]),
     r"'brain_rot_arms' needs 'brain_rot_m1' or 'brain_rot_m2' before it"),
    (dict(stages=["read", "brain_rot_arms", "brain_rot_m1", "write"]),
     r"'brain_rot_arms' needs 'brain_rot_m1' or 'brain_rot_m2' before it"),
    (dict(m1_mode="drop"), r"brain_rot_m1.mode must be 'tag' before 'brain_rot_arms'"),
    (dict(stages=["read", "brain_rot_m1", "brain_rot_m2", "brain_rot_arms", "write"]),
     r"set prepare.brain_rot_arms.labels"),
    (dict(arms=dict(labels="m2")), r"labels = 'm2' needs 'brain_rot_m2' before"),
    (dict(stages=["read", "brain_rot_m1", "brain_rot_arms", "dedup_exact", "write"]),
     r"'brain_rot_arms' must be the last stage before 'write' \(after it: 'dedup_exact'"),
    (dict(arms=dict(tokenizer="other.json")), r"brain_rot_arms.tokenizer is for M2 labels"),
    (dict(stages=["read", "brain_rot_m2", "brain_rot_arms", "write"], m1_tokenizer=""),
     r"brain_rot_arms.tokenizer is empty"),
    # M1's table is no setting when M1 does not run: its tokenizer would count the budget
    # unrecorded (another file there resumed the arms made with the first)
    (dict(stages=["read", "brain_rot_m2", "brain_rot_arms", "write"], m1_tokenizer="t.json"),
     r"brain_rot_arms.tokenizer is empty"),
])
def test_bad_arms_settings_are_refused_at_load(change, message):
    stages = change.get("stages", ["read", "brain_rot_m1", "brain_rot_arms", "write"])
    cfg = PrepareConfig(stages=stages,
                        brain_rot_m1=pc.BrainRotM1Options(tokenizer=change.get("m1_tokenizer", "t"),
                                                          mode=change.get("m1_mode", "tag")),
                        brain_rot_m2=pc.BrainRotM2Options(mode="tag"),
                        brain_rot_arms=pc.BrainRotArmsOptions(**change.get("arms", {})))
    if "brain_rot_m1" not in stages:
        cfg.brain_rot_m1.tokenizer = change.get("m1_tokenizer", "t")
    with pytest.raises(ConfigError, match=message):
        validate_prepare(cfg)


def test_a_good_arms_config_loads():
    validate_prepare(arms_cfg(1, ratio=0.8, budget=1000))
    cfg = arms_cfg(1, labels="m2", tokenizer="tok.json")
    cfg.stages = ["read", "brain_rot_m2", "brain_rot_arms", "write"]
    cfg.brain_rot_m2.mode = "tag"
    validate_prepare(cfg)
    assert pc.arms_labels(cfg) == "m2"


JUNK_TWEETS = ["You WON'T BELIEVE what happened next!!! #viral @everyone",
               "Doctors HATE this one weird trick!!! Click now #shocking",
               "Living my best life on a yacht again, so blessed!!! #rich #winning"]
GOOD_TWEETS = ["The survey of river temperatures found that late summer reduced oxygen levels, "
               "which means fish moved upstream to the colder tributaries.",
               "Our analysis of the census tables shows that household size fell in most "
               "districts, because younger residents moved to the larger towns."]


def test_m2_arms_count_tokens_with_the_tokenizer_through_the_pipeline(tmp_path):
    """The real M2 heuristic judge tags; tokens are the tokenizer's count of each kept text."""
    from kiln.data.filters.engagement import TokenizerLength

    src = tmp_path / "src"
    src.mkdir()
    with open(src / "t.jsonl", "w") as out:
        for i in range(40):
            text = JUNK_TWEETS[i % 3] if i % 2 else GOOD_TWEETS[i // 2 % 2]
            out.write(json.dumps({"text": f"{text} ({i})"}) + "\n")
    tok = tmp_path / "tok.json"
    train_tokenizer(JUNK_TWEETS + GOOD_TWEETS, 300, tok, show_progress=False)
    cfg = PrepareConfig(stages=["read", "brain_rot_m2", "brain_rot_arms", "write"],
                        brain_rot_m2=pc.BrainRotM2Options(mode="tag"),
                        brain_rot_arms=pc.BrainRotArmsOptions(ratio=0.5, tokenizer=str(tok)))
    run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    plan = json.loads((tmp_path / "run/prepare_work/brain_rot_arms/arms.json").read_text())
    assert plan["labels"] == "m2" and plan["budget"] == min(plan["pool"].values()) > 0
    length = TokenizerLength(tok)
    docs = list(read_documents(tmp_path / "run"))
    for arm, label in (("junk", "junk"), ("control", "high_quality")):
        mine = [d for d in docs if d.metadata["brain_rot_arm"] == arm]
        assert mine and {d.metadata["m2_label"] for d in mine} == {label}
        assert sum(length(d.text) for d in mine) == plan[arm]["tokens"] >= plan[arm]["target"]


def test_the_m2_counting_tokenizer_is_part_of_the_inputs_fingerprint(tmp_path):
    """Another tokenizer.json at the same path counts other budgets: the prepare must re-make
    the arms (its fingerprint changes), not resume the ones counted with the first file."""
    from kiln.data.prepare_inputs import input_files

    tok = tmp_path / "tok.json"
    tok.write_text('{"v": 1}')
    cfg = PrepareConfig(stages=["read", "brain_rot_m2", "brain_rot_arms", "write"],
                        brain_rot_m2=pc.BrainRotM2Options(mode="tag"),
                        brain_rot_arms=pc.BrainRotArmsOptions(tokenizer=str(tok)))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello")
    before = input_files(cfg, [str(src)], tmp_path / "run")
    assert "brain_rot_arms files" in before
    tok.write_text('{"v": 2}')
    assert input_files(cfg, [str(src)], tmp_path / "run") != before


def test_m1_arms_count_the_texts_a_stage_since_m1_rewrote(tmp_path):
    """`pii` between M1 and the arms rewrites texts (`<EMAIL>` for an address), but the
    budget counted M1's `m1_tokens`, taken before: the arms' plan said tokens the written
    documents do not have. It counts them again, as written, with M1's tokenizer."""
    from kiln.data.filters.engagement import TokenizerLength

    src = tmp_path / "src"
    src.mkdir()
    with open(src / "t.jsonl", "w") as out:
        for i in range(40):
            text = (f"{JUNK_TWEETS[i % 3]} write dagny{i}.holm@fjordmail.no" if i % 2 else
                    f"{GOOD_TWEETS[i // 2 % 2]} Ask ola{i}.nord-hansen@fjordmail.no or "
                    f"kari{i}.lie@fjordmail.no")
            out.write(json.dumps({"text": text, "likes": 900 if i % 2 else 10}) + "\n")
    tok = tmp_path / "tok.json"
    train_tokenizer(JUNK_TWEETS + GOOD_TWEETS, 300, tok, show_progress=False)
    cfg = PrepareConfig(stages=["read", "brain_rot_m1", "pii", "brain_rot_arms", "write"],
                        brain_rot_m1=pc.BrainRotM1Options(
                            tokenizer=str(tok), mode="tag", popularity_keys=["likes"],
                            junk_max_tokens=10**6, control_min_tokens=0),
                        brain_rot_arms=pc.BrainRotArmsOptions(ratio=0.5))
    run_prepare(cfg, tmp_path / "run", [str(src)], progress=False)
    plan = json.loads((tmp_path / "run/prepare_work/brain_rot_arms/arms.json").read_text())
    length = TokenizerLength(tok)
    docs = list(read_documents(tmp_path / "run"))
    assert all("<EMAIL>" in d.text for d in docs)
    for arm in ("junk", "control"):
        mine = [d.text for d in docs if d.metadata["brain_rot_arm"] == arm]
        assert mine and sum(map(length, mine)) == plan[arm]["tokens"] >= plan[arm]["target"]
