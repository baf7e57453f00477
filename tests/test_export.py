"""Hugging Face export: LlamaForCausalLM loads the folder and reproduces Kiln's logits."""

from __future__ import annotations

import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers/huggingface_hub import

import pytest  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

import kiln.export.hf_folder as hf_folder  # noqa: E402
from kiln.config import ModelConfig  # noqa: E402
from kiln.data.tokenizer import EOS_TOKEN, load_tokenizer  # noqa: E402
from kiln.export import export_hf  # noqa: E402
from kiln.model import Transformer  # noqa: E402
from kiln.model.sampling import generate  # noqa: E402

transformers = pytest.importorskip("transformers")

TEXTS = ["def main():\n    return 42\n", "The quick brown fox jumps over the lazy dog.",
         "Hello, world! héllo wörld 你好"] * 10


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=[EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS, trainer=trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def tiny_model(vocab: int, tied: bool, head_dim: int = 0) -> Transformer:
    """Random weights far from init (norm gains too), so a misplaced tensor cannot hide."""
    torch.manual_seed(1)
    cfg = ModelConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                      max_seq_len=48, rope_theta=500.0, norm_eps=1e-6, tie_embeddings=tied,
                      head_dim=head_dim)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if p.dim() == 1 else 0.3 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("tied, head_dim", [(True, 0), (False, 0), (False, 16)],
                         ids=["tied", "untied", "head-dim-apart-from-dim"])
def test_hf_logits_match(tokenizer_path, tmp_path, tied, head_dim):
    vocab = load_tokenizer(tokenizer_path).get_vocab_size()
    model = tiny_model(vocab, tied, head_dim)
    out = export_hf(model, tokenizer_path, tmp_path / "hf")
    names = load_file(str(out / "model.safetensors")).keys()
    assert ("lm_head.weight" in names) != tied
    hf = transformers.LlamaForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert hf.config.tie_word_embeddings == tied
    assert hf.config.num_key_value_heads == 2
    assert (hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()) == tied
    tokens = torch.randint(0, vocab, (2, model.cfg.max_seq_len))
    with torch.no_grad():
        diff = (hf(tokens).logits - model(tokens)).abs().max().item()
    assert diff < 1e-4


def test_hf_greedy_generation_matches(tokenizer_path, tmp_path):
    vocab = load_tokenizer(tokenizer_path).get_vocab_size()
    model = tiny_model(vocab, tied=True)
    out = export_hf(model, tokenizer_path, tmp_path / "hf")
    hf = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    prompt = [5, 17, 40, 2]
    ours = generate(model, prompt, 10, temperature=0.0)
    theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False,
                         eos_token_id=None, min_new_tokens=10)
    assert theirs[0, len(prompt):].tolist() == ours


def test_a_doc_mask_export_says_unprompted_generation_is_not_the_trained_function(
        tokenizer_path, tmp_path):
    """transformers' generate() without a prompt starts from EOS (the export's bos_token)
    and lets every later token see it; a model trained with model.doc_mask never did, and
    `kiln generate` shows that EOS to the first token alone: the samples part from the
    second token. The note said the export was exact for one document per sequence, Kiln's
    generation included; it now says this case is not."""
    from kiln.config import Config
    from kiln.export import export_model

    vocab = load_tokenizer(tokenizer_path).get_vocab_size()
    torch.manual_seed(1)
    model = Transformer(ModelConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4,
                                    n_kv_heads=2, max_seq_len=48, doc_mask=True))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if p.dim() == 1 else 0.3 * torch.randn_like(p))
    model.eval()
    result = export_model(model, tokenizer_path, tmp_path / "hf", Config(model=model.cfg))
    eos = load_tokenizer(tokenizer_path).token_to_id(EOS_TOKEN)
    hf = transformers.AutoModelForCausalLM.from_pretrained(result.path).eval()
    assert hf.generation_config.bos_token_id == eos
    theirs = hf.generate(max_new_tokens=8, do_sample=False, min_new_tokens=8)[0, 1:].tolist()
    ours = generate(model, [eos], 8, temperature=0.0, eos_id=eos)
    assert theirs[0] == ours[0] and theirs != ours  # the first token alone agrees
    assert "generate() without a prompt starts from EOS" in result.note
    assert "unlike in training and `kiln generate`" in result.note


def test_auto_tokenizer_matches_kiln(tokenizer_path, tmp_path):
    vocab = load_tokenizer(tokenizer_path).get_vocab_size()
    out = export_hf(tiny_model(vocab, tied=True), tokenizer_path, tmp_path / "hf")
    ours = load_tokenizer(tokenizer_path)
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    assert theirs.eos_token == EOS_TOKEN
    assert theirs.eos_token_id == ours.token_to_id(EOS_TOKEN)
    # a literal end-of-text marker in raw text is plain bytes for both, never the EOS id
    for text in [*TEXTS[:3], "unseen words: zyxwvut 123", f"a{EOS_TOKEN}b"]:
        ids = theirs(text)["input_ids"]
        assert ids == ours.encode(text).ids
        assert theirs.decode(ids) == text


# what the HF tokenizer must split and decode as Kiln does: whitespace runs (GPT-2's regex
# leaves a run's last space to the next word), code, scripts of 1-4 byte UTF-8 characters,
# combining marks, control bytes, punctuation after a space (transformers' clean-up would
# remove that space), digits (the math kind splits them), LaTeX, and the EOS string as text
VARIED = ["", " ", "   ", "\t\t", "\n\n\n", "a  b   c    d", "trailing   ", "  leading", "\r\n",
          "x = 1;\n\tif (x) {\n\t\treturn y;\n\t}\n", "def f(a, b):\n    return a ** 2  # sq\n",
          "héllo wörld", "你好，世界", "東京タワー", "🚀🎉👍🏽", "e\u0301 combining", "Ελληνικά",
          "مرحبا", "\x00\x01\x7f", "\ufeffBOM", "zero\u200bwidth", "a , b . c ! d ? e",
          "don't it's we'll", "1234567890 3.14159", "\\frac{a}{b} \\alpha_1", f"a{EOS_TOKEN}b",
          EOS_TOKEN, "<|endoftext", "unseen words: zyxwvut"]
CORPUS = ["def main():\n    return 42\n", "The quick brown fox jumps over the lazy dog.",
          "héllo wörld café naïve — 你好世界 東京 🚀🎉", "\\frac{1}{2} + \\alpha^2 = 3.14159",
          "  indented\tcode  \r\n\n\n   spaces   ", "It's, don't ; a , b . c ! ?"] * 20


@pytest.mark.parametrize("kind", ["bpe", "math"])
def test_hf_tokenizer_gives_kilns_ids_and_text_back(tmp_path, kind):
    """A tokenizer Kiln trains (`tokenizer.kind` bpe or math), exported: AutoTokenizer on the
    folder gives the ids the shards were made with (Kiln's `encode_batch`) on varied text,
    decodes them to the text itself, and knows EOS as Kiln's id, printed or skipped."""
    from kiln.data.math_tokenizer import min_math_vocab, train_tokenizer_of_kind

    path = tmp_path / "tokenizer.json"
    train_tokenizer_of_kind(kind, CORPUS, max(400, min_math_vocab()), path, show_progress=False)
    ours = load_tokenizer(path)
    out = export_hf(tiny_model(ours.get_vocab_size(), tied=True), path, tmp_path / "hf")
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    assert theirs.get_vocab() == ours.get_vocab(with_added_tokens=True)
    eos = ours.token_to_id(EOS_TOKEN)
    assert theirs.eos_token_id == theirs.bos_token_id == theirs.pad_token_id == eos
    expected = [e.ids for e in ours.encode_batch(VARIED, add_special_tokens=False)]
    assert theirs(VARIED)["input_ids"] == expected  # no BOS or EOS added
    for text, ids in zip(VARIED, expected):
        assert theirs.encode(text) == ids, text
        assert theirs.decode(ids) == text
        assert theirs.decode([*ids, eos]) == text + EOS_TOKEN
        assert theirs.decode([*ids, eos], skip_special_tokens=True) == text
    assert eos not in expected[VARIED.index(EOS_TOKEN)]  # the EOS string in text: bytes


def test_export_is_atomic(tokenizer_path, tmp_path, monkeypatch):
    vocab = load_tokenizer(tokenizer_path).get_vocab_size()
    model = tiny_model(vocab, tied=False)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "old.txt").write_text("previous export")

    def crash(*args, **kwargs):
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr(hf_folder, "save_tensors", crash)
        with pytest.raises(OSError, match="disk full"):
            export_hf(model, tokenizer_path, out)
    assert sorted(p.name for p in out.iterdir()) == ["old.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no temporary folder left behind

    export_hf(model, tokenizer_path, out)
    assert not (out / "old.txt").exists()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


def test_cli_export_of_trained_run(tiny_run):
    """`kiln export` on a trained run: real tokenizer, weights from the latest checkpoint."""
    from conftest import tiny_config

    from kiln.cli import cmd_export, cmd_train
    from kiln.train.trained_run import load_trained_model

    cfg = tiny_config(tiny_run)
    cmd_train(cfg)
    cmd_export(cfg)
    out = tiny_run / "export"
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    # the exported tokenizer against the run's own (the one its shards were made with)
    from kiln.data.documents import read_documents

    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    kiln_tok = load_tokenizer(tiny_run / "tokenizer" / "tokenizer.json")
    docs = [d.text for _, d in zip(range(5), read_documents(tiny_run))] + VARIED
    assert hf_tok(docs)["input_ids"] == [
        e.ids for e in kiln_tok.encode_batch(docs, add_special_tokens=False)]
    text = f"def hello():\n    return 1{EOS_TOKEN}"
    ids = hf_tok(text, return_tensors="pt").input_ids
    assert ids[0].tolist() == kiln_tok.encode(text).ids
    model, _ = load_trained_model(cfg)
    with torch.no_grad():
        assert (hf(ids).logits - model(ids)).abs().max().item() < 1e-4


def test_exported_and_checkpointed_weights_follow_the_umask(tiny_run):
    """safetensors wrote model.safetensors 0600 whatever the umask: a teammate on a shared
    filesystem could read an export's config and tokenizer but not its weights."""
    from conftest import tiny_config

    from kiln.cli import cmd_export, cmd_train

    cfg = tiny_config(tiny_run, "train.steps=6")
    old = os.umask(0o022)
    try:
        cmd_train(cfg)
        cmd_export(cfg)
    finally:
        os.umask(old)
    for weights in (tiny_run / "export/model.safetensors",
                    tiny_run / "checkpoints/step_00000006/model.safetensors"):
        assert oct(weights.stat().st_mode & 0o777) == oct(0o644), weights


def test_an_export_folder_with_other_files_moves_to_the_archive(tiny_run, capsys):
    """A model card added to export/ before an upload (or a file named `export`) was deleted
    without a word when the run was exported again: the new export replaces the folder whole."""
    from conftest import tiny_config

    from kiln.cli import cmd_train, main

    cmd_train(tiny_config(tiny_run, "train.steps=6"))
    export = tiny_run / "export"
    assert main(["export", str(tiny_run)]) == 0
    assert main(["export", str(tiny_run)]) == 0  # its own files only: replaced, nothing moved
    assert not (tiny_run / "archive").exists()
    (export / "README.md").write_text("my model card")
    capsys.readouterr()
    assert main(["export", str(tiny_run)]) == 0
    [kept] = (tiny_run / "archive").glob("before-export-*/export")
    assert (kept / "README.md").read_text() == "my model card"
    assert (kept / "model.safetensors").is_file() and not (export / "README.md").exists()
    assert f"note: {export} held what an export does not write (README.md): it moved to " \
        f"{kept}" in capsys.readouterr().err
    shutil.rmtree(export)
    export.write_text("notes")
    assert main(["export", str(tiny_run)]) == 0
    assert sorted(p.read_text() for p in (tiny_run / "archive").glob("*/export")
                  if p.is_file()) == ["notes"]
    assert (export / "model.safetensors").is_file()


def test_a_failed_export_puts_the_set_aside_folder_back(tiny_run, monkeypatch, capsys):
    """An export that fails leaves the previous one in place (atomic_dir): a folder moved to
    the archive for the model card it held went back, not left missing from export/."""
    from conftest import tiny_config

    from kiln.cli import cmd_train, main

    cmd_train(tiny_config(tiny_run, "train.steps=6"))
    export = tiny_run / "export"
    assert main(["export", str(tiny_run)]) == 0
    (export / "README.md").write_text("my model card")
    before = sorted(p.name for p in export.iterdir())

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(hf_folder, "save_tensors", crash)
    capsys.readouterr()
    assert main(["export", str(tiny_run)]) == 1  # `kiln: cannot write ... (OSError: disk full)`
    assert sorted(p.name for p in export.iterdir()) == before
    assert (export / "README.md").read_text() == "my model card"
    err = capsys.readouterr().err
    assert not list(tiny_run.glob("archive/*")) and "moved to" not in err
    assert "(OSError: disk full)" in err and "the previous export is intact" in err


def test_a_full_disk_while_writing_the_weights_is_one_line(tiny_run, monkeypatch, capsys):
    """safetensors' writer on a full disk raised its own SafetensorError through `kiln
    export` as a traceback, and the set-aside folder's emptied archive/ stayed behind."""
    from conftest import tiny_config
    from safetensors import SafetensorError

    from kiln.cli import cmd_train, main

    cmd_train(tiny_config(tiny_run, "train.steps=6"))
    export = tiny_run / "export"
    assert main(["export", str(tiny_run)]) == 0
    (export / "README.md").write_text("my model card")
    before = {p.name: p.read_bytes() for p in export.iterdir()}

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device "
                              "(os error 28)")

    monkeypatch.setattr(hf_folder, "save_tensors", full)
    capsys.readouterr()
    assert main(["export", str(tiny_run)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kiln: cannot write {export} (SafetensorError: ") and "\n" not in err
    assert "No space left on device" in err and "the previous export is intact" in err
    assert {p.name: p.read_bytes() for p in export.iterdir()} == before
    assert not (tiny_run / "archive").exists()
    assert sorted(p.name for p in tiny_run.iterdir() if p.name.startswith(".export")) == []


def test_a_checkpoint_pruned_while_export_reads_it_is_one_line_saying_so(tiny_run, monkeypatch,
                                                                         capsys):
    """A `kiln train` of the same run prunes its older checkpoints as it saves: one that goes
    between `kiln export` finding it and reading it was called unreadable, with advice to
    move it aside and go back to the one before it. It was not damaged: it was removed."""
    from conftest import tiny_config

    import kiln.train.trained_run as trained_run
    from kiln.cli import cmd_train, main

    cmd_train(tiny_config(tiny_run, "train.steps=6"))
    root = tiny_run / "checkpoints"
    real = trained_run.latest_checkpoint
    calls = []

    def pruned_by_a_training_run(ckpt_root):
        found = real(ckpt_root)
        if not calls:  # the training saves a newer step and prunes this one, as _prune does
            shutil.copytree(found, root / "step_00000007")
            os.replace(found, root / f".{found.name}.trash-1")
        calls.append(found)
        return found

    monkeypatch.setattr(trained_run, "latest_checkpoint", pruned_by_a_training_run)
    capsys.readouterr()
    assert main(["export", str(tiny_run)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"kiln: checkpoint {root / 'step_00000006'} was removed while it was being "
                   "read (a `kiln train` of this run prunes older checkpoints as it saves); the "
                   "newest now is step_00000007: run the command again (or once the training "
                   "has finished)")
    assert not (tiny_run / "export").exists()
    monkeypatch.setattr(trained_run, "latest_checkpoint", real)
    assert main(["export", str(tiny_run)]) == 0  # again: the newest one
    assert "step_00000007 ->" in capsys.readouterr().out


def test_an_empty_before_export_folder_a_killed_export_left_is_cleared(tmp_path):
    """An export killed between making archive/before-export-<time>/ and moving the folder
    into it left the empty folder for good; the next export clears it (a full one stays)."""
    from kiln.atomic import new_archive_folder
    from kiln.export.earlier import other_files_set_aside

    empty, full = (new_archive_folder(tmp_path, "before-export") for _ in range(2))
    (full / "export").mkdir()
    with other_files_set_aside(tmp_path / "export", tmp_path) as moved:
        assert moved is None
    assert not empty.exists() and (full / "export").is_dir()


def test_a_folder_set_aside_while_another_export_clears_empty_ones_still_moves(tmp_path,
                                                                              monkeypatch):
    """Two exports of one run: the second, starting, cleared the first's before-export
    folder (made, still empty, as a killed export leaves it) before the first moved the
    user's folder into it: that export ended in FileNotFoundError."""
    import kiln.export.earlier as earlier
    from kiln.atomic import clear_empty_archive_folders

    real = earlier.new_archive_folder

    def made_then_cleared(run_dir, label):
        folder = real(run_dir, label)
        clear_empty_archive_folders(run_dir, label)  # the other export, starting
        return folder

    monkeypatch.setattr(earlier, "new_archive_folder", made_then_cleared)
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "README.md").write_text("mine")
    with earlier.other_files_set_aside(tmp_path / "export", tmp_path) as moved:
        assert "it moved to" in moved
    (folder,) = (tmp_path / "archive").iterdir()
    assert (folder / "export" / "README.md").read_text() == "mine"
    assert not (tmp_path / "export").exists()
