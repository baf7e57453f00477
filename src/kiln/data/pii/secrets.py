"""Key / secret detection: known credential formats plus high-entropy values bound to secret names.

Known formats are the regex families the paper (arXiv:2512.07814, step 1) and bigcode's pipeline
search with (AWS `AKIA…`, Google `AIza…`, Slack `xox?-…`, GitHub tokens, private key blocks, JWTs).
The generic rule is detect-secrets style: a quoted or config value assigned to a name whose parts
include key/token/secret/…, long enough and with Shannon entropy over a charset-dependent
threshold (hex 3.0 bits/char, other 3.5), and containing a digit (random strings of ≥16 chars
almost always do; English identifiers rarely). Placeholders (`EXAMPLE`, `your-api-key`, `xxxx`)
are not real keys — the paper's "realness" criterion.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections import Counter
from collections.abc import Iterator

from kiln.data.pii.spans import Span

_B = r"(?<![A-Za-z0-9_\-/+])"  # left boundary: not inside a longer token
_E = r"(?![A-Za-z0-9_\-])"
KNOWN_KEY_FORMATS: dict[str, re.Pattern[str]] = {
    "aws_access_key": re.compile(_B + r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}" + _E),
    "github_token": re.compile(_B + r"gh[pousr]_[A-Za-z0-9]{36,255}" + _E),
    "github_pat": re.compile(_B + r"github_pat_[A-Za-z0-9_]{60,255}" + _E),
    "slack_token": re.compile(_B + r"xox[abposr]-[A-Za-z0-9-]{10,250}" + _E),
    "slack_webhook": re.compile(
        r"(?<=hooks\.slack\.com/services/)T[A-Z0-9]{6,12}/B[A-Z0-9]{6,12}/[A-Za-z0-9]{20,40}"),
    "google_api_key": re.compile(_B + r"AIza[0-9A-Za-z_\-]{35}" + _E),
    "stripe_key": re.compile(_B + r"(?:sk|rk)_live_[0-9A-Za-z]{20,99}" + _E),
    "jwt": re.compile(_B + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{16,}" + _E),
    "private_key_block": re.compile(
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
        r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"),
}

# Name parts that make a string a secret: `api_key`, `clientSecret`, `AUTH_TOKEN`, `aws-secret`.
SECRET_NAME_PARTS = frozenset(
    "key apikey secret secrets token accesstoken authtoken credential credentials private "
    "privatekey signing salt bearer auth webhook dsn hmac".split())
NON_SECRET_NAME_PARTS = frozenset(
    "public pub id name names path file dir url uri type types count size len length field "
    "header prefix format kind algorithm algo version max min limit cache sort primary foreign "
    "index tokens tokenizer lookup hash checksum sha digest integrity etag nonce".split())
# an unquoted value ends a line, an item or a query / form field (`?api_key=V&format=json`,
# `"https://x?token=V"`: these were kept)
_ASSIGN = re.compile(
    # one try per run of name characters: a name always extends to the run's end, so every
    # start inside a run matches or fails alike (trying each start was O(len^2)); the
    # groups used (name, qv, v) are the same as with a start at every position
    r"(?<![A-Za-z0-9_.\-])[0-9.\-]*(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)[\"']?\s*(?::=|=>|=|:)\s*"
    r"(?:(?P<q>[\"'`])(?P<qv>[^\"'`\s]{12,})(?P=q)|(?P<v>[A-Za-z0-9+/=_\-.~]{16,})(?=\s*(?:$|[,;#}\]])|&|[\"'`]))",
    re.MULTILINE)
PLACEHOLDER_WORDS = re.compile(
    r"example|your|here|xxxx|dummy|sample|placeholder|insert|changeme|redacted|<|>|\*\*\*|\$\{|"
    r"\{\{|%\(|replace|todo|fixme|secret_?key_?base|0{8}",
    re.IGNORECASE)
KNOWN_EXAMPLE_SECRETS = frozenset({
    "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0"
    "IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
    "QWxhZGRpbjpvcGVuIHNlc2FtZQ==",  # RFC 7617's Aladdin:open sesame
})
# ASCII edges, not `\b`: CJK text runs into the word ("请使用Bearer kR8m…认证"), and a
# Unicode `\b` found no edge between two letters there, so the token was kept
BEARER = re.compile(r"(?<![A-Za-z0-9_])Bearer(?![A-Za-z0-9_])[\s\"'`+]*(?P<v>[A-Za-z0-9+/=_\-.~]{16,})")
# HTTP Basic credentials (RFC 7617): base64 of `user:password`, decoded by anyone who reads
# them. Too short for the entropy rule and no assignment, so they were kept whole.
BASIC_AUTH = re.compile(r"(?<![A-Za-z0-9_])Basic[ \t]+(?P<v>[A-Za-z0-9+/]{8,}={0,2})(?![A-Za-z0-9+/=])")
_HEX = re.compile(r"[0-9a-fA-F]+")
_UUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")


def shannon_entropy(s: str) -> float:
    """Bits per character of the empirical character distribution of `s`."""
    if not s:
        return 0.0
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def name_parts(name: str) -> list[str]:
    """`awsSecretAccessKey` -> [aws, secret, access, key]; `API-KEY` -> [api, key]."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name.rsplit(".", 1)[-1])
    return [p for p in re.split(r"[\s_\-]+", spaced.lower()) if p]


def is_secret_name(name: str) -> bool:
    parts = name_parts(name)
    if not parts or any(p in NON_SECRET_NAME_PARTS for p in parts[-2:]):
        return False
    joined = "".join(parts)
    return (any(p in SECRET_NAME_PARTS for p in parts)
            or any(w in joined for w in ("apikey", "secret", "accesskey", "authtoken")))


def is_placeholder_secret(value: str) -> bool:
    return value in KNOWN_EXAMPLE_SECRETS or PLACEHOLDER_WORDS.search(value) is not None


def looks_random(value: str) -> bool:
    """detect-secrets style entropy test, with a digit required to reject identifiers."""
    if len(value) < 16 or not any(c.isdigit() for c in value) or not any(c.isalpha() for c in value):
        return False
    if re.fullmatch(r"[\d.\-:/]+[A-Za-z]{0,3}", value) or value.count(".") >= 3 and "/" not in value:
        return False  # dates, versions, hostnames
    threshold = 3.0 if _HEX.fullmatch(value) else 3.5
    return shannon_entropy(value) >= threshold


_DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,30}(?:\.[A-Za-z_][A-Za-z0-9_]{0,30}){1,4}")


def _code_name(value: str, name: str) -> bool:
    """An unquoted dotted name that is code: `module.attr` (a lower-case first part) or one
    ending in the assigned name. A JWT's parts start with `eyJ` and run long."""
    if not _DOTTED_NAME.fullmatch(value):
        return False
    parts = value.split(".")
    return parts[-1] == name.rsplit(".", 1)[-1] or re.fullmatch(r"[a-z_][a-z0-9_]*", parts[0]) is not None


def _assignments(text: str) -> Iterator[re.Match]:
    """_ASSIGN's matches, and those inside a quoted value of another name: the URL of
    `url = "https://x.no/?token=V"` is one value, which hid the query's `token=V`."""
    for m in _ASSIGN.finditer(text):
        yield m
        if m.group("qv") and not is_secret_name(m.group("name")):
            yield from _ASSIGN.finditer(text, m.start("qv"), m.end("qv"))


def find_keys(text: str) -> Iterator[Span]:
    for pattern in KNOWN_KEY_FORMATS.values():
        for m in pattern.finditer(text):
            value = m.group(0)
            if is_placeholder_secret(value):
                continue
            if value.startswith("-----BEGIN") and len(re.sub(r"[^A-Za-z0-9+/]", "", value)) < 120:
                continue  # truncated `…` block in docs, not a key
            yield Span("KEY", m.start(), m.end(), value)
    for m in _assignments(text):
        group = "qv" if m.group("qv") else "v"
        value = m.group(group)
        if not is_secret_name(m.group("name")) or is_placeholder_secret(value):
            continue
        if group == "v" and _code_name(value, m.group("name")):
            continue  # `RegOpenKeyEx = win32api.RegOpenKeyEx`: an alias, not a key
        if _UUID.fullmatch(value) or looks_random(value):
            yield Span("KEY", m.start(group), m.end(group), value)
    for m in BASIC_AUTH.finditer(text):
        if _basic_credentials(m.group("v")):
            yield Span("KEY", m.start("v"), m.end("v"), m.group("v"))
    for m in BEARER.finditer(text):
        value = m.group("v")
        if not is_placeholder_secret(value) and looks_random(value):
            yield Span("KEY", m.start("v"), m.end("v"), value)


def _basic_credentials(value: str) -> bool:
    """`value` decodes to a `user:password` of printable text whose password is a real one
    (not `password`, `changeme`, nor RFC 7617's own example)."""
    from kiln.data.pii.credentials import PLACEHOLDER_PASSWORDS

    if value in KNOWN_EXAMPLE_SECRETS:
        return False
    try:
        decoded = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return False
    user, colon, password = decoded.partition(":")
    return (bool(colon) and bool(user) and len(password) >= 3 and decoded.isprintable()
            and password.lower() not in PLACEHOLDER_PASSWORDS
            and not is_placeholder_secret(password))
