"""Settings a user gave that another setting leaves unused: Muon's with AdamW, the experts'
in a dense model, SMEBU's under another balancing rule, a post-norm gain without sandwich
norms, a decay's under a schedule without it. They load (a recipe ablated with
`--set optim.name=adamw` or `--set model.n_experts=0` keeps its Muon or MoE keys, and an
override cannot delete them), with a warning, since the user more likely meant the
optimizer or the experts they tuned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiln.config import Config

# [model] keys that only MoE layers read (model.transformer.Block builds MoE from them)
MOE_KEYS = ("n_dense_layers", "top_k", "n_shared", "expert_hidden", "route_scale", "balance",
            "balance_rate", "smebu_beta", "smebu_kappa", "seq_aux_coef", "z_loss_coef",
            "router_init_std")
# [model] keys each balancing rule reads (kiln.model.balancing)
BALANCE_KEYS = {"smebu": ("balance_rate", "smebu_beta", "smebu_kappa"),
                "sign": ("balance_rate",), "none": ()}
# [schedule] keys each schedule reads after its warmup (kiln.train.schedule.lr_multiplier)
SCHEDULE_KEYS = {"cosine": ("min_lr_ratio",), "wsd": ("min_lr_ratio", "decay_fraction"),
                 "constant": ()}


def inert_settings(cfg: Config, given: set[str]) -> list[str]:
    """One line per group of `given` dotted keys (set in the recipe or by `--set`) that
    `cfg` leaves unused, naming each with its value and the setting that switches it on."""
    lines = []
    if cfg.optim.name != "muon":
        muon = [k for k in vars(cfg.optim) if k.startswith("muon_") and f"optim.{k}" in given]
        if muon:
            lines.append(f"{_named('optim', cfg.optim, muon)} with optim.name = "
                         f"'{cfg.optim.name}' (only Muon reads optim.muon_*): set optim.name = "
                         "\"muon\" to train the hidden matrices with Muon, or drop "
                         f"{_them(muon)}")
    if not cfg.model.n_experts:
        moe = [k for k in MOE_KEYS if f"model.{k}" in given]
        if moe:
            lines.append(f"{_named('model', cfg.model, moe)} with model.n_experts = 0 (a "
                         "dense model: every layer has a SwiGLU, no experts): set "
                         "model.n_experts to the number of routed experts for a mixture of "
                         f"experts, or drop {_them(moe)}")
    else:
        rule = cfg.model.balance
        unread = [k for k in BALANCE_KEYS["smebu"]
                  if k not in BALANCE_KEYS.get(rule, ()) and f"model.{k}" in given]
        if unread:
            why = ("no bias is balanced" if rule == "none"
                   else "only SMEBU reads smebu_beta and smebu_kappa")
            use = ('"smebu"' if any(k.startswith("smebu_") for k in unread)
                   else '"smebu" or "sign"')
            lines.append(f"{_named('model', cfg.model, unread)} with model.balance = "
                         f"{rule!r} ({why}): set model.balance = {use}, or drop "
                         f"{_them(unread)}")
    if not cfg.model.sandwich_norm and "model.post_norm_gain" in given:
        lines.append(f"{_named('model', cfg.model, ['post_norm_gain'])} with "
                     "model.sandwich_norm = false (only the sandwich post-norms start at that "
                     "gain): set model.sandwich_norm = true, or drop it")
    lines += _schedule_lines(cfg, given)
    return lines


def _schedule_lines(cfg: Config, given: set[str]) -> list[str]:
    """`schedule.decay_fraction` outside wsd and `schedule.min_lr_ratio` under constant: a
    `--set schedule.decay_fraction=0.3` on the default cosine schedule otherwise trained with
    the lr curve it had before, without a word."""
    name = cfg.schedule.name
    unread = [k for k in SCHEDULE_KEYS["wsd"]
              if k not in SCHEDULE_KEYS.get(name, ()) and f"schedule.{k}" in given]
    if not unread:
        return []
    readers = {"decay_fraction": 'only "wsd" reads schedule.decay_fraction',
               "min_lr_ratio": "the lr stays at optim.lr after the warmup"}
    why = "; ".join(readers[k] for k in unread)
    use = '"wsd"' if "decay_fraction" in unread else '"cosine" or "wsd"'
    return [f"{_named('schedule', cfg.schedule, unread)} with schedule.name = {name!r} "
            f"({why}): set schedule.name = {use}, or drop {_them(unread)}"]


def _named(section: str, values: object, keys: list[str]) -> str:
    named = [f"{section}.{k} = {getattr(values, k)!r}" for k in keys]
    listed = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
    return f"{listed} {'has' if len(named) == 1 else 'have'} no effect"


def _them(keys: list[str]) -> str:
    return "it" if len(keys) == 1 else "them"


def data_settings_unread(cfg: Config, verb: str) -> list[str]:
    """`kiln eval RUN --set data.val_fraction=0.2` measured the split on disk, made with the
    recorded 0.05, without a word: the data settings make data only in the data verbs (and
    `kiln run`); a verb that reads a trained run's data says which of them it leaves unused."""
    from kiln.config import data_changes, recorded_config

    old = recorded_config(cfg.run_dir)
    changed = [] if old is None else data_changes(old, cfg)
    if not changed:
        return []
    return [f"{', '.join(changed)}: `kiln {verb}` reads the data already made in "
            f"{cfg.run_dir} (with the recorded settings); these settings make data only in "
            "`kiln prepare`, `kiln tokenizer`, `kiln tokenize` and `kiln run`"]
