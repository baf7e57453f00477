"""The version of each stage's rules (which documents it keeps, drops or rewrites, and how),
recorded in a prepare's signature for the stages the prepare runs: documents made under other
rules are made again rather than resumed, and a trained run's are refused
(`kiln.data.prepare_signature`, `kiln.commands.early_refusals`).

A stage declares its version beside its rules, as a constant that its `StageSpec` names
(`rules="module:CONSTANT"`, `kiln.data.prepare_config.STAGES`); bump it with any change that
makes other documents from the same input. Only the stages a config runs are recorded, so a
version bumped for a stage a run does not use changes nothing for it.

A record without a stage's version (written before versions were recorded per stage; such a
Kiln recorded only the pii stage's, as `pii_rules`) reads as made under an *earlier* version
of that stage's rules: the stages' rules did change then (quality's line endings, the
Gutenberg markers...), and the record cannot tell which a prepare ran under. So an unfinished
prepare is made again, not resumed into a mix, and a trained run's data is kept by `kiln
train` while `prepare` / `run` refuse it, saying how to go on."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from kiln.data.prepare_config import STAGES

STAGE_RULES_KEY = "stage_rules"  # {stage: version} in the prepare signature
# versions recorded before STAGE_RULES_KEY, each under its own key: read as that stage's
LEGACY_KEYS = {"pii_rules": "pii"}
RULES_KEYS = (STAGE_RULES_KEY, *LEGACY_KEYS)  # the signature keys that record versions


def rules_version(stage: str) -> str | None:
    """The version of `stage`'s rules, from the constant its StageSpec names; None for a
    stage that declares none (`read`, `write`) or is not registered."""
    spec = STAGES.get(stage)
    if spec is None or not spec.rules:
        return None
    module_name, _, attr = spec.rules.partition(":")
    try:
        version = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        from kiln.data.stage_registry import StageUnavailableError

        raise StageUnavailableError(
            f"prepare stage '{stage}': its rules version {spec.rules} cannot be read ({e}); "
            f"remove '{stage}' from prepare.stages or install what it needs") from e
    return str(version)


def rules_versions(stages: Iterable[str]) -> dict[str, str]:
    """{stage: version} for the stages of `stages` that declare one: what a signature records."""
    versions = {stage: rules_version(stage) for stage in stages}
    return {stage: v for stage, v in versions.items() if v is not None}


def recorded_versions(signature: dict) -> dict[str, str]:
    """{stage: version} a recorded signature holds, the legacy keys (`pii_rules`) read too."""
    out = {stage: signature[key] for key, stage in LEGACY_KEYS.items() if key in signature}
    recorded = signature.get(STAGE_RULES_KEY)
    if isinstance(recorded, dict):
        out.update(recorded)
    return out


def stages_made_otherwise(before: dict, now: dict) -> list[str]:
    """For each stage whose version `now` (this Kiln's signature) records and the recorded
    signature `before` does not hold (another one, or none: an earlier Kiln), what changed,
    worded to follow "documents whose"."""
    was, out = recorded_versions(before), []
    for stage, version in recorded_versions(now).items():
        if stage not in was:
            out.append(f"{stage} stage ran under rules from before Kiln recorded their version "
                       f"(this Kiln's: {version})")
        elif was[stage] != version:
            out.append(f"{stage} stage ran under earlier rules ({was[stage]}; this Kiln's: "
                       f"{version})")
    return out
