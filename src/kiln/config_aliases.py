"""The names other trainers give Kiln's settings, for the unknown-key error.

Users arrive with Hugging Face (`num_hidden_layers`, `per_device_train_batch_size`),
nanoGPT (`n_embd`, `block_size`, `max_iters`), torchtitan or litgpt habits; spelling
similarity alone maps `n_embd` to `model.n_heads` and `hidden_size` to an unrelated
table. A name found here is answered with the Kiln key(s) it means, and where a setting
has no Kiln twin (dropout, biases) or works differently (gradient accumulation), with a
few words of why.
"""

from __future__ import annotations

# foreign name (lower case, '_' for '-') -> the Kiln keys it means, most likely first
ALIASES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("batch_size", "train_batch_size", "global_batch_size", "total_batch_size"),
                    ("train.global_batch", "train.micro_batch")),
    **dict.fromkeys(("micro_batch_size", "per_device_train_batch_size", "local_batch_size",
                     "microbatch_size"), ("train.micro_batch", "train.global_batch")),
    **dict.fromkeys(("gradient_accumulation_steps", "grad_accum", "grad_accum_steps",
                     "accumulate_grad_batches", "gradient_accumulation"),
                    ("train.global_batch", "train.micro_batch")),
    **dict.fromkeys(("max_steps", "max_iters", "num_steps", "total_steps", "train_steps",
                     "training_steps", "num_train_steps", "iterations", "max_iterations"),
                    ("train.steps",)),
    **dict.fromkeys(("learning_rate", "max_lr", "peak_lr", "base_lr"), ("optim.lr",)),
    **dict.fromkeys(("min_lr", "final_lr", "lr_min"), ("schedule.min_lr_ratio",)),
    **dict.fromkeys(("warmup", "warmup_iters", "num_warmup_steps", "lr_warmup_steps"),
                    ("schedule.warmup_steps",)),
    **dict.fromkeys(("lr_scheduler_type", "lr_scheduler", "lr_schedule", "scheduler",
                     "decay_lr"), ("schedule.name",)),
    **dict.fromkeys(("optimizer", "optim", "optimizer_name"), ("optim.name",)),
    **dict.fromkeys(("adam_beta1",), ("optim.beta1",)),
    **dict.fromkeys(("adam_beta2",), ("optim.beta2",)),
    **dict.fromkeys(("betas", "adam_betas"), ("optim.beta1", "optim.beta2")),
    **dict.fromkeys(("adam_epsilon", "adam_eps", "epsilon"), ("optim.eps",)),
    **dict.fromkeys(("max_grad_norm", "clip_grad_norm", "grad_clip_norm", "gradient_clipping",
                     "clip_grad", "max_norm"), ("optim.grad_clip",)),
    **dict.fromkeys(("n_embd", "n_embed", "hidden_size", "d_model", "embed_dim", "emb_dim",
                     "model_dim", "embedding_size", "width"), ("model.dim",)),
    **dict.fromkeys(("n_layer", "num_hidden_layers", "num_layers", "depth"),
                    ("model.n_layers",)),
    **dict.fromkeys(("n_head", "num_attention_heads", "num_heads", "n_attention_heads"),
                    ("model.n_heads",)),
    **dict.fromkeys(("n_kv_head", "num_key_value_heads", "num_kv_heads", "n_query_groups",
                     "kv_heads"), ("model.n_kv_heads",)),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "d_ff", "ffn_hidden_size", "mlp_hidden",
                     "hidden_dim", "ffn_size", "mlp_dim", "intermediate_dim"),
                    ("model.ffn_hidden",)),
    **dict.fromkeys(("block_size", "context_length", "context_len", "max_position_embeddings",
                     "seq_length", "max_seq_length", "n_ctx", "n_positions", "sequence_length",
                     "max_length"), ("model.max_seq_len", "train.seq_len")),
    **dict.fromkeys(("tie_word_embeddings", "tie_weights", "weight_tying", "tied_embeddings"),
                    ("model.tie_embeddings",)),
    **dict.fromkeys(("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rms_eps"),
                    ("model.norm_eps",)),
    **dict.fromkeys(("rope_base", "rotary_base", "rotary_emb_base", "rope_freq_base"),
                    ("model.rope_theta",)),
    **dict.fromkeys(("initializer_range", "init_scale"), ("model.init_std",)),
    **dict.fromkeys(("num_experts", "n_routed_experts", "num_local_experts", "n_expert",
                     "moe_num_experts"), ("model.n_experts",)),
    **dict.fromkeys(("num_experts_per_tok", "moe_top_k", "experts_per_token", "n_activated_experts"),
                    ("model.top_k",)),
    **dict.fromkeys(("n_shared_experts", "num_shared_experts"), ("model.n_shared",)),
    **dict.fromkeys(("moe_intermediate_size", "expert_dim", "moe_ffn_hidden"),
                    ("model.expert_hidden",)),
    **dict.fromkeys(("first_k_dense_replace", "num_dense_layers", "n_dense"),
                    ("model.n_dense_layers",)),
    **dict.fromkeys(("window_size", "attention_window", "sliding_window_size"),
                    ("model.sliding_window",)),
    **dict.fromkeys(("dtype", "torch_dtype", "mixed_precision", "amp", "bf16", "fp16",
                     "param_dtype", "autocast"), ("train.precision",)),
    **dict.fromkeys(("torch_compile", "use_compile"), ("train.compile",)),
    **dict.fromkeys(("out_dir", "output_dir", "save_dir", "checkpoint_dir", "ckpt_dir",
                     "log_dir", "dump_folder", "work_dir"), ("run.dir",)),
    **dict.fromkeys(("random_seed", "data_seed"), ("run.seed",)),
    **dict.fromkeys(("eval_interval", "eval_steps", "eval_freq", "val_every", "eval_every_steps"),
                    ("train.eval_every",)),
    **dict.fromkeys(("eval_iters", "val_batches", "eval_batches_count"), ("train.eval_batches",)),
    **dict.fromkeys(("save_steps", "save_interval", "save_every", "checkpoint_interval",
                     "ckpt_interval", "ckpt_every"), ("train.checkpoint_every",)),
    **dict.fromkeys(("save_total_limit", "keep_last_n_checkpoints", "max_checkpoints"),
                    ("train.keep_checkpoints",)),
    **dict.fromkeys(("log_interval", "logging_steps", "log_freq"), ("train.log_every",)),
    **dict.fromkeys(("data_dir", "dataset", "data_path", "train_data", "dataset_path",
                     "data_files", "train_files", "path", "paths", "files", "corpus"),
                    ("data.sources",)),
    **dict.fromkeys(("distributed", "strategy", "fsdp", "ddp", "data_parallel"),
                    ("train.parallel",)),
    **dict.fromkeys(("text_column", "text_key", "text_col", "dataset_text_field", "content_field",
                     "text_column_name", "column", "field"), ("data.text_field",)),
    **dict.fromkeys(("epochs", "num_epochs", "num_train_epochs", "max_epochs", "n_epochs",
                     "epoch"), ("train.steps",)),
}

# why a name has no Kiln twin, or how the twin differs
NOTES: dict[str, str] = {
    **dict.fromkeys(("gradient_accumulation_steps", "grad_accum", "grad_accum_steps",
                     "accumulate_grad_batches", "gradient_accumulation"),
                    "Kiln accumulates global_batch / (micro_batch x ranks) micro-batches a step"),
    **dict.fromkeys(("min_lr", "final_lr", "lr_min"), "a fraction of optim.lr, not a rate"),
    **dict.fromkeys(("world_size", "num_gpus", "n_gpus", "gpus", "nproc_per_node",
                     "num_processes", "devices"),
                    "the number of processes is torchrun's: torchrun --nproc_per_node=N "
                    "-m kiln train RUN"),
    "fp16": "Kiln trains in bf16 or fp32",
    **dict.fromkeys(("epochs", "num_epochs", "num_train_epochs", "max_epochs", "n_epochs",
                     "epoch"),
                    "Kiln counts optimizer steps of train.global_batch windows, not passes "
                    "over the data; the start says how many passes train.steps makes, past one"),
    **dict.fromkeys(("dropout", "attention_dropout", "hidden_dropout", "attn_dropout",
                     "resid_dropout", "embd_pdrop", "resid_pdrop", "attn_pdrop",
                     "dropout_rate"), "Kiln's decoder has no dropout"),
    **dict.fromkeys(("bias", "attention_bias", "mlp_bias", "use_bias", "qkv_bias"),
                    "Kiln's linear layers have no biases"),
}


def alias_hint(name: str, section: str, valid: set[str]) -> str | None:
    """The hint for a foreign setting `name` typed under `section` (without the brackets
    and leading space), or None when the name is not a known foreign one."""
    key = name.lower().replace("-", "_")
    targets = [t for t in ALIASES.get(key, ()) if t in valid]
    note = NOTES.get(key)
    if not targets and not note:
        return None
    # a target in the section the user typed comes first: `train.seq_length` -> train.seq_len
    targets.sort(key=lambda t: not (section and t.startswith(section + ".")))
    asked = f"did you mean {' or '.join(repr(t) for t in targets)}?" if targets else ""
    return " ".join(part for part in (asked, note) if part)
