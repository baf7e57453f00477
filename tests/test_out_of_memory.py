"""An allocation the machine refuses mid-verb: one line naming the setting to lower."""

from __future__ import annotations

import torch

from kiln.out_of_memory import out_of_memory, out_of_memory_line


def test_training_that_runs_out_of_memory_is_one_line_naming_micro_batch(
        tiny_run, monkeypatch, capsys):
    """The check before training counts weights, gradients and optimizer state; the
    activations of a micro-batch too large failed in the first forward with the CPU
    allocator's traceback. A real refusal: 512 TiB asked of the allocator."""
    from kiln import cli
    from kiln.model.transformer import Transformer

    def huge_activations(self, *args, **kwargs):
        return torch.empty(2**47, dtype=torch.uint8)

    monkeypatch.setattr(Transformer, "forward", huge_activations)
    code = cli.main(["train", str(tiny_run)])
    err = capsys.readouterr().err  # its progress bar, then the line
    assert code == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1:] == [
        "kiln: train: out of memory (DefaultCPUAllocator: can't allocate memory: you tried to "
        "allocate 140737488355328 bytes): lower train.micro_batch (train.global_batch stays: "
        "each step accumulates more micro-batches) or train.seq_len, or make the model "
        "smaller; what it had finished writing is kept (outputs are written atomically)"]


def test_cuda_out_of_memory_is_recognised_by_its_type_and_said_in_its_first_sentences():
    class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError, whatever its module
        pass

    e = OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total "
                         "capacity of 79.19 GiB of which 3.20 GiB is free. Of the allocated "
                         "memory 70.1 GiB is allocated by PyTorch\nSee documentation")
    assert out_of_memory(e) and out_of_memory(torch.OutOfMemoryError("x"))
    assert not out_of_memory(RuntimeError("shape mismatch"))
    assert out_of_memory_line("eval", e) == (
        "kiln: eval: out of memory (CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has "
        "a total capacity of 79.19 GiB of which 3.20 GiB is free): lower eval.batch_size")


def test_a_prepare_out_of_memory_names_its_own_settings():
    line = out_of_memory_line("prepare", RuntimeError(
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes."))
    assert line.endswith("lower prepare.workers (each holds its own task's documents), or "
                         "prepare.perplexity.batch_size where a perplexity stage scores them")
