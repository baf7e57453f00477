"""Math-aware BPE: exact round trip, single-token commands and digits, loadable as tokenizer.json."""

import json

import pytest

from kiln.data.math_tokenizer import (
    DIGITS,
    MATH_SEED_COMMANDS,
    OPERATORS,
    math_pre_tokenizer,
    train_math_tokenizer,
    train_tokenizer_of_kind,
)
from kiln.data.tokenizer import EOS_TOKEN, eos_id, load_tokenizer

BASE = [
    r"Let $f(x) = \frac{1}{\sqrt{2\pi\sigma^2}} e^{-(x-\mu)^2/2\sigma^2}$.",
    r"\begin{equation} \int_0^\infty e^{-x^2}\,dx = \frac{\sqrt{\pi}}{2} \end{equation}",
    r"We have $\sum_{n=1}^{\infty} \frac{1}{n^2} = \frac{\pi^2}{6}$ by Euler (1734).",
    r"\begin{align*} a &= b + c \\ &\leq \alpha\beta\gamma \end{align*}",
    r"Theorem 2.1. For all $\epsilon > 0$ there is $\delta>0$ with $|x-y|<\delta$.",
    r"\text{if } x \in \mathbb{R}^n \text{ then } \lim_{t\to 0} g(t) = 0",
    r"50\% of the 2024 samples; \{a, b\} \subset A; a\,b\;c\!d \ e",
    r"\left( \prod_{i=1}^{N} x_i \right)^{1/N} \geq \frac{N}{\sum_i 1/x_i}",
    r"\partial_\mu F^{\mu\nu} = J^\nu,\quad \nabla\cdot\mathbf{E} = \rho/\varepsilon_0",
    r"$\Gamma(z) = \int_0^\infty t^{z-1}e^{-t}\,dt$, $\Gamma(n+1)=n!$",
    "\\section{Introduction}\n\nIn this paper we study $\\mathcal{O}(n\\log n)$ algorithms.\n",
    "% a comment line\n\\label{eq:1}\\cite{knuth84} see Eq.~\\eqref{eq:1}",
    r"\[ \det(A - \lambda I) = 0 \]  \\  \hspace{1em}\vspace{-2pt}",
    r"x_{i,j}^{(k+1)} = x_{i,j}^{(k)} - \eta \nabla_{x} L(x^{(k)})",
    r"\newcommand{\R}{\mathbb{R}} \def\eps{\varepsilon} \R^{3\times 3}",
    "tabs\tand\r\nCRLF \\\\\r\n\\end{document}",
    r"\alpha\beta \alphabet \fraction \intercal \int_a^b \in\infty",
    r"\\\\ \\ \ \\\  trailing backslash \\",
    "  leading spaces and  double  spaces  \\frac  {}  ",
    r"Ω = \Omega, α = \alpha, ∑ = \sum, ∞ = \infty, → = \to",
]
NASTY = [
    "",
    " ",
    "\\",
    "\\ ",
    " \\frac",
    "emoji 😀👍🏽 and ZWJ 👨‍👩‍👧 \\alpha",
    "CJK 中文字符 日本語 한국어 $x^2$",
    "combining é vs é \\'e \\\"o",
    "literal <|endoftext|> inside \\text{<|endoftext|>}",
    "null\x00byte \\frac\x00",
    "\U0010ffff private plane \\sum",
    "Arabic-Indic digits ٠١٢٣ and full-width １２３ and ²³",
    "\u200b zero width \ufeff BOM \u2028 line sep",
    "'s 've 're 'll \\frac's",
    "\n\n\n\\begin\n\n",
]
JOINERS = ["", " ", "\n", " $ ", "\\\\\n"]
SNIPPETS = [a + j + b for i, (a, b) in enumerate(zip(BASE, BASE[1:] + BASE[:1]))
            for j in JOINERS][:100]
TRAIN = BASE * 30


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("mtok") / "tokenizer.json"
    train_math_tokenizer(TRAIN, vocab_size=600, out_path=path, show_progress=False)
    return path


@pytest.fixture(scope="module")
def tok(tok_path):
    return load_tokenizer(tok_path)


def test_hundred_snippets(tok):
    assert len(SNIPPETS) == 100 and len(set(SNIPPETS)) == 100


@pytest.mark.parametrize("text", SNIPPETS + NASTY)
def test_round_trip_exact(tok, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_round_trip_batch(tok):
    encs = tok.encode_batch(SNIPPETS + NASTY, add_special_tokens=False)
    decoded = tok.decode_batch([e.ids for e in encs], skip_special_tokens=False)
    assert decoded == SNIPPETS + NASTY


@pytest.mark.parametrize("command", MATH_SEED_COMMANDS)
def test_seeded_commands_single_token(tok, command):
    for context in (command, f"x {command} y", f"{command}{{a}}", f"1{command}_2"):
        tokens = tok.encode(context, add_special_tokens=False).tokens
        assert command in tokens, (context, tokens)


def test_frac_alpha_and_digits(tok):
    assert tok.encode(r"\frac").tokens == [r"\frac"]
    assert tok.encode(r"\alpha").tokens == [r"\alpha"]
    enc = tok.encode("2024")
    assert enc.tokens == ["2", "0", "2", "4"]
    assert len(tok.encode("in 2024, 31415 times").tokens) >= 9  # 4 + 5 digit tokens at least


def test_digits_and_operators_are_single_tokens(tok):
    for ch in DIGITS + OPERATORS:
        assert len(tok.encode(ch).ids) == 1, ch
    # digits never merge with anything, even after training on many numbers
    ids = tok.encode("x_{10} = 1234567890").tokens
    assert [t for t in ids if any(c.isdigit() for c in t) and len(t) > 1] == []


def test_commands_are_whole_and_not_glued_to_spaces(tok):
    pieces = [p for p, _ in math_pre_tokenizer().pre_tokenize_str(r"a \alpha\beta{x}, \alphabet")]
    assert r"\alpha" in pieces and r"\beta" in pieces and r"\alphabet" in pieces
    # no token crosses a command's edges: the space before and the brace after stay apart
    for text in SNIPPETS:
        for t in tok.encode(text).tokens:
            # a backslash only ever starts a token (or is the control symbol `\\`)
            assert "\\" not in t[1:] or t == "\\\\", (text, t)


def test_eos_and_vocab_size(tok, tok_path):
    assert eos_id(tok) == 0 and tok.id_to_token(0) == EOS_TOKEN
    assert tok.get_vocab_size() == 600
    # ids are contiguous: the seeded tokens re-used the ids freed by trimming
    vocab = json.loads(tok_path.read_text())["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(600))
    # the literal EOS string in text is ordinary bytes once loaded
    assert 0 not in tok.encode("a<|endoftext|>b").ids


def test_learned_merges_compress(tok):
    text = BASE[1]
    assert len(tok.encode(text).ids) < len(text.encode()) / 2


def test_kind_dispatch_and_errors(tmp_path):
    t = train_tokenizer_of_kind("bpe", TRAIN, 300, tmp_path / "b.json", show_progress=False)
    assert t.get_vocab_size() == 300
    assert t.get_vocab_size() == load_tokenizer(tmp_path / "b.json").get_vocab_size()
    with pytest.raises(ValueError, match="tokenizer.kind"):
        train_tokenizer_of_kind("wordpiece", TRAIN, 300, tmp_path / "w.json")
    with pytest.raises(ValueError, match="too small"):
        train_math_tokenizer(TRAIN, vocab_size=300, out_path=tmp_path / "m.json",
                             show_progress=False)
    assert not (tmp_path / "m.json").exists()
    with pytest.raises(ValueError, match="257"):
        train_math_tokenizer(TRAIN, vocab_size=100, out_path=tmp_path / "m.json")


def test_math_vocab_too_small_for_the_seeds_fails_at_config_load(tmp_path):
    """The smallest vocabulary the math kind accepts holds bytes, EOS and every seed token;
    below it the config is refused at load, not after prepare."""
    from kiln.config import ConfigError, load_config
    from kiln.data.math_tokenizer import MATH_SEED_COMMANDS, min_math_vocab, train_math_tokenizer

    smallest = min_math_vocab()
    with pytest.raises(ConfigError, match=f"tokenizer.vocab_size .* {smallest} in all"):
        load_config(None, ["tokenizer.kind=math", f"tokenizer.vocab_size={smallest - 1}"])
    load_config(None, ["tokenizer.kind=math", f"tokenizer.vocab_size={smallest}"])
    tok = train_math_tokenizer([r"\alpha + \beta = 12"] * 5, smallest, tmp_path / "t.json",
                               show_progress=False)
    assert tok.get_vocab_size() == smallest
    assert all(len(tok.encode(s).ids) == 1 for s in MATH_SEED_COMMANDS)
    with pytest.raises(ValueError, match="too small"):
        train_math_tokenizer(["x"], smallest - 1, tmp_path / "u.json", show_progress=False)
