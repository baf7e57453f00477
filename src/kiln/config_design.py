"""Model designs that load and run but train something other than they say (refused for
a new model) or perhaps other than meant (noted once). Not load-time errors: a run trained
so before Kiln checked keeps resuming, evaluating and exporting."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiln.config import ModelConfig


def design_problems(m: ModelConfig) -> list[str]:
    """Model designs that load and run but train something other than they say. A new model
    is refused them (`kiln train` / `kiln run` with no checkpoint, or `--fresh`); a run
    trained so before Kiln checked keeps working (its checkpoints still resume, evaluate,
    generate and export), with a note."""
    problems = []
    if m.sliding_window and not m.local_per_global:
        problems.append(f"model.sliding_window = {m.sliding_window} has no effect with "
                        "model.local_per_global = 0 (every layer global): set local_per_global "
                        "to the number of local layers before each global one")
    if m.local_per_global and m.local_per_global >= m.n_layers:
        problems.append(f"model.local_per_global = {m.local_per_global} with model.n_layers = "
                        f"{m.n_layers} leaves no global layer (the pattern is "
                        f"{m.local_per_global} sliding-window layers, then one global): use a "
                        "smaller local_per_global or more layers")
    if m.local_per_global and m.sliding_window >= m.max_seq_len:
        # a query at position i sees keys i - W + 1 .. i; with W >= max_seq_len that is every
        # earlier key of any sequence the model takes, so the "local" layers are global ones
        # (with RoPE) and the ablation would compare global against global
        problems.append(f"model.sliding_window = {m.sliding_window} is not below model.max_seq_len "
                        f"= {m.max_seq_len}: every position is inside the window, so the local "
                        "layers attend to the whole sequence; use a window below max_seq_len "
                        "(Trinity: max_seq_len / 2), or local_per_global = 0 for all-global layers")
    if m.n_experts and m.n_dense_layers >= m.n_layers:
        # is_moe_layer: layer i is MoE when i >= n_dense_layers, so none is
        problems.append(f"model.n_dense_layers = {m.n_dense_layers} with model.n_layers = "
                        f"{m.n_layers} leaves no MoE layer (the first n_dense_layers layers "
                        f"are dense, the rest MoE): model.n_experts = {m.n_experts} does "
                        "nothing and the model is dense; use n_dense_layers below n_layers "
                        "(Trinity Nano: 2 of 56), or n_experts = 0 for a dense model")
    if m.n_experts and m.top_k == 1:
        problems.append("model.top_k = 1: the gates of a token's chosen experts are normalised "
                        "to sum to model.route_scale, so a lone expert's gate is constant and the "
                        "router learns nothing from the loss; use top_k >= 2 (and "
                        "model.n_experts >= 2)")
    return problems


def design_notes(m: ModelConfig, seq_len: int = 0) -> list[str]:
    """Designs that train what they say but perhaps not what was meant: said once, when a
    new model starts (a published model may choose them: Gemma 3 1B's 26 layers at 5 local
    : 1 global end on two local layers). `seq_len`: train.seq_len (0: not known)."""
    notes = _cut_pattern_note(m)
    if m.local_per_global and 0 < seq_len <= m.sliding_window < m.max_seq_len:
        # query i sees keys i - W + 1 .. i: with W >= the training window's length that is
        # every key, so training never meets the window (W >= max_seq_len is a problem)
        notes.append(f"model.sliding_window = {m.sliding_window} is not below train.seq_len = "
                     f"{seq_len}: every training window fits inside it, so the local layers "
                     "train as global ones (with RoPE) and meet their window only when "
                     f"generating past {seq_len} tokens; use a window below train.seq_len "
                     "(Trinity: seq_len / 2)")
    if not m.global_rope and not m.local_per_global:
        # the Trinity recipes' global_rope = false kept through an all-global ablation
        notes.append("model.global_rope = false with model.local_per_global = 0: every layer "
                     "is global, so none has positional encoding (NoPE throughout; Trinity's "
                     "global layers go without RoPE because its local layers carry position); "
                     "set model.global_rope = true for all-global layers with RoPE")
    if m.n_experts >= 2 and m.top_k == m.n_experts and m.n_dense_layers < m.n_layers:
        # every expert is chosen, so the selection bias (smebu / sign) changes nothing, and the
        # sequence-wise aux loss is constant: its load fractions are all 1 / n_experts
        balancing = [f"model.balance = {m.balance!r}"] if m.balance != "none" else []
        balancing += ["model.seq_aux_coef"] if m.seq_aux_coef else []
        inert = (f" and load balancing ({', '.join(balancing)}) has nothing to balance"
                 if balancing else "")
        notes.append(f"model.top_k = model.n_experts = {m.n_experts}: every token goes to every "
                     f"expert, so each MoE layer costs all its experts per token{inert}; for a "
                     "sparse MoE use top_k below n_experts (Trinity: 8 of 128)")
    return notes


def _cut_pattern_note(m: ModelConfig) -> list[str]:
    """The note for a local/global attention pattern that n_layers cuts short."""
    period = m.local_per_global + 1
    if not m.local_per_global or m.local_per_global >= m.n_layers or m.n_layers % period == 0:
        return []  # all global, no global layer (a design problem), or whole repetitions
    tail, full = m.n_layers % period, m.n_layers - m.n_layers % period
    # model.transformer.is_local_layer: layer i is global when (i + 1) % period == 0
    glob = list(range(period - 1, m.n_layers, period))
    listed = (f"layer {glob[0]} is" if len(glob) == 1 else
              f"layers {glob[0]} and {glob[1]} are" if len(glob) == 2 else
              f"layers {glob[0]}, {glob[1]}, ..., {glob[-1]} are")
    last = f"layer {m.n_layers - 1} is" if tail == 1 else f"layers {full}-{m.n_layers - 1} are"
    return [f"model.n_layers = {m.n_layers} is not a multiple of model.local_per_global + 1 = "
            f"{period}: the pattern ({m.local_per_global} sliding-window "
            f"layer{'s' if m.local_per_global > 1 else ''}, then one "
            f"global) is cut short, so {listed} global and the last {last} local; for a "
            f"global last layer use n_layers = {full} or {full + period}"]
