"""An allocation the machine refused (CPU allocator or CUDA), said as one line with the
setting that sizes it, instead of a traceback. torch-free to import.

The memory check before training (`kiln.train.memory_fit`) counts weights, gradients and
optimizer state only; activations grow with micro_batch x seq_len and fail here."""

from __future__ import annotations

# what each verb's memory grows with, and so what to lower
_ADVICE = {
    "train": "lower train.micro_batch (train.global_batch stays: each step accumulates more "
             "micro-batches) or train.seq_len, or make the model smaller",
    "eval": "lower eval.batch_size",
    "generate": "lower generate.max_new_tokens or shorten generate.prompts",
    "prepare": "lower prepare.workers (each holds its own task's documents), or "
               "prepare.perplexity.batch_size where a perplexity stage scores them",
}
_ADVICE["run"] = f"{_ADVICE['train']}; if its eval stage ran out, lower eval.batch_size"
_OTHER = "use a smaller batch or model, or a machine with more free memory"
_CPU = "DefaultCPUAllocator: can't allocate memory"


def out_of_memory(e: BaseException) -> bool:
    """torch's `OutOfMemoryError` (CUDA, MPS) or the CPU allocator's refusal, a bare
    RuntimeError whose message alone says so."""
    return type(e).__name__ == "OutOfMemoryError" or _CPU in str(e)


def refused_allocation(e: BaseException) -> str:
    """What was refused: torch's first sentences about it."""
    said = str(e)
    said = said[said.index(_CPU):] if _CPU in said else said
    said = said.split(". Error code")[0].split("\n")[0].split(" Of the allocated")[0]
    return said.rstrip(". ")


def out_of_memory_line(verb: str, e: BaseException) -> str:
    """The one line: what was refused (torch's first sentence about it) and what to lower."""
    return f"kiln: {verb}: out of memory ({refused_allocation(e)}): {_ADVICE.get(verb, _OTHER)}"
