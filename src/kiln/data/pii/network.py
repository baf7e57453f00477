"""Email and IP address detection, built on datatrove's PIIFormatter patterns.

PIIFormatter.format() swaps matches for fake values and reports nothing, so it cannot give typed
placeholders or counts. We reuse its email/IPv4 regexes and its public-IP validator as candidate
finders and add what it lacks: token boundaries (its IPv4 regex matches `1.2.3.4` inside
`11.1.2.3.45`), trimming of code delimiters it lets into the local part (`user='a@b.org`), IPv6,
and the realness rules of the paper (placeholder domains, version numbers are not PII).

Policy (digest of arXiv:2512.07814, step 2 "invalid IPs … private/reserved excluded"; datatrove's
default): only globally routable addresses are PII. Private, loopback, link-local, multicast and
documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32) are not.
Emails at RFC 2606/6761 reserved domains (example.com, *.test, localhost …) are placeholders.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from functools import lru_cache, partial

from datatrove.pipeline.formatters.pii import PIIFormatter, public_ip_validator

from kiln.data.pii.context import words_back
from kiln.data.pii.spans import Span

_DT = PIIFormatter()
# The letters of an address: ASCII, and those of the scripts written with spaces between
# words (Latin, Greek, Cyrillic), so `françois.dupont@orange.fr` and `kontakt@bücher.de` are
# whole. datatrove's ASCII classes after a Unicode `\b` found no start in `jürgen.müller@…`,
# `メールtanaka@…まで` (a letter on both sides: no word boundary) and cut `françois.` off.
# Not CJK, kana or Hangul: text in them runs into an address without a space.
ADDRESS_LETTERS = "A-Za-z0-9\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u0386\u0388-\u03ce\u0400-\u04ff"
_LOCAL_CHAR = f"[{ADDRESS_LETTERS}!#$%&'*+/=?^_`{{|}}~-]"
EMAIL_CANDIDATE = re.compile(_DT.emails_replacer.regex.pattern.replace(
    "A-Za-z0-9", ADDRESS_LETTERS).replace("\\b", f"(?<!{_LOCAL_CHAR})", 1))
# An address is a token of its own: not inside a word of those letters (`v1.2.3.4`), but
# CJK or kana text runs into it ("IPアドレスは52.14.3.9です"), where `\w` found no edge
_WORD = f"[{ADDRESS_LETTERS}_]"
IPV4_CANDIDATE = re.compile(f"(?<!{_WORD})(?<!\\.)(?:" + _DT.ip_replacer.regex.pattern
                            + f")(?!{_WORD}|\\.\\d)")
is_public_ip = partial(public_ip_validator, public_only=True)

IPV6_CANDIDATE = re.compile(
    f"(?<!{_WORD})(?<![:.])" r"(?:[0-9A-Fa-f]{0,4}:){2,7}(?:(?:\d{1,3}\.){3}\d{1,3}|[0-9A-Fa-f]{1,4})?"
    f"(?!{_WORD}|:" r"|\.\d+\.\d)")  # the dotted tail first: `::151.101.1.69` is one address, not
# `::151`; a `.443` after it is a port (tcpdump's `addr.port`), and the address is kept whole

_LOCAL_PART = re.compile(f"[{ADDRESS_LETTERS}][{ADDRESS_LETTERS}._%+-]*$")
RESERVED_EMAIL_DOMAINS = frozenset({
    "example.com", "example.org", "example.net", "example.edu", "localhost", "localdomain",
    "domain.com", "email.com", "yourdomain.com", "yourcompany.com", "company.com", "test.com",
    "mail.com.invalid"})
RESERVED_TLDS = frozenset({"test", "example", "invalid", "localhost", "local", "internal"})
# `icon@2x.png`, `lodash@4.17.21` style matches: a file extension or digits are not a TLD.
FILE_TLDS = frozenset(
    "png jpg jpeg gif svg webp ico bmp tif tiff js mjs cjs ts tsx jsx css scss less map json yaml yml "
    "toml xml html htm md txt py rb go rs java kt c h cpp hpp so dll exe zip gz tgz whl lock".split())
PLACEHOLDER_LOCALS = frozenset({"user", "username", "name", "email", "you", "your.name", "foo",
                                "bar", "someone", "somebody", "john.doe", "jane.doe", "firstname.lastname",
                                "first.last", "me", "test"})
# Addresses that reach a machine, not a person.
SERVICE_LOCALS = frozenset({"noreply", "no-reply", "donotreply", "do-not-reply", "mailer-daemon",
                            "postmaster", "notifications"})
# "version 1.2.3.4", "v1.0.0.2", "==1.2.3.4", "Section 3.2.1.4": dotted numbers that are not IPs.
# Numbering in papers and docs ("Theorem 4.1.2.3", "Eqs. 5.2.1.3") is not an address either,
# when the word names it directly (not "the algorithm contacts 45.33.32.156").
# Abbreviations that are also words ("sec" seconds, "app", "tab") count only with their period.
NUMBERED = ("(?:section|chapter|figure|table|step|rule|theorem|lemma|equation|proposition|"
            "corollary|definition|remark|algorithm|appendix|exercise|conjecture)s?|figs?|thms?|"
            r"eqs?|eqns?|props?|cor|defs?|(?:sec|secs|app|tab|alg)(?=\.)")
VERSION_CONTEXT = re.compile(
    rf"(?:\b(?:versions?|ver|release|build|revision|rev|{NUMBERED}|v)\.?"
    r"|__version__|§|==|>=|<=|~=|\^|~|[A-Za-z]/)[\s\"':=(]*$", re.IGNORECASE)


# `{alice.smith, bob.jones}@cs.mit.edu` (or `\{...\}` in LaTeX): several people's addresses
# written once, as papers list their authors.
GROUPED_EMAILS = re.compile(
    r"\$?\\?\{\$?\s*[A-Za-z0-9][A-Za-z0-9._%+-]*(?:\s*[,|;]\s*[A-Za-z0-9][A-Za-z0-9._%+-]*)+"
    r"\s*\$?\\?\}\$?\s*@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,})\b")


# an address written to dodge scrapers, as mailing-list archives and homepages do:
# `dagny.holm [at] fjordmail [dot] no`, `dagny(at)fjordmail(dot)no` (brackets required: a
# bare "at" and "dot" are words of prose)
_OPEN, _CLOSE = r"[ \t]*[\[({<][ \t]*", r"[ \t]*[\])}>][ \t]*"
OBFUSCATED_EMAIL = re.compile(
    rf"(?<![{ADDRESS_LETTERS}._%+-])(?P<local>[{ADDRESS_LETTERS}][{ADDRESS_LETTERS}._%+-]{{0,63}})"
    rf"{_OPEN}at{_CLOSE}(?P<domain>[{ADDRESS_LETTERS}][{ADDRESS_LETTERS}-]{{0,62}}"
    rf"(?:(?:{_OPEN}dot{_CLOSE}|\.)[{ADDRESS_LETTERS}][{ADDRESS_LETTERS}-]{{0,62}}){{1,4}})"
    rf"(?![{ADDRESS_LETTERS}])", re.IGNORECASE)


# an obfuscated address's top-level domain: a country's, or one of these ("file (at) line
# (dot) col" is prose)
GENERIC_TLDS = frozenset("com org net edu gov mil int info biz name pro io ai dev app me".split())


def _personal_domain(domain: str) -> bool:
    """Not a file name, a reserved or documentation domain."""
    tld = domain.rsplit(".", 1)[-1].lower()
    if not tld.isalpha() or tld in FILE_TLDS or tld in RESERVED_TLDS:
        return False
    dom = domain.lower()
    return not any(dom == r or dom.endswith("." + r) for r in RESERVED_EMAIL_DOMAINS)


# how far before and after an `@` an address is looked for (RFC 5321: a local part holds
# at most 64 characters, a domain 255)
EMAIL_REACH = (128, 256)


def _email_candidates(text: str) -> Iterator[re.Match]:
    """EMAIL_CANDIDATE's matches, searched near each `@` only: over all the text, every word
    start of a long run without one (base64, `a.b.c...`, dotted numbers) scanned the run to
    its end, O(len^2)."""
    pos = 0
    while (at := text.find("@", pos)) >= 0:
        m = EMAIL_CANDIDATE.search(text, max(pos, at - EMAIL_REACH[0]), at + EMAIL_REACH[1])
        pos = m.end() if m is not None and m.end() > at else at + 1
        if m is not None:
            yield m


# RFC 6531 lets a local part be any UTF-8 (`张伟@qq.com`), and one in CJK, kana or Hangul
# was missed whole: no ADDRESS_LETTERS before the `@`. Prose in these scripts runs into it
# without a space, so where it starts is unknowable: the run of them before the `@` is
# taken, at most RFC 5321's 64 octets (21 three-byte characters); "联系张伟@qq.com" loses
# its "联系" (contact) to the placeholder rather than leak the address.
CJK_LETTERS = "\u3041-\u3096\u30a1-\u30fa\u30fc\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
CJK_LOCAL_EMAIL = re.compile(
    f"[{CJK_LETTERS}]{{1,21}}@(?P<domain>(?:[{ADDRESS_LETTERS}](?:[{ADDRESS_LETTERS}-]*[{ADDRESS_LETTERS}])?\\.)+"
    f"[{ADDRESS_LETTERS}](?:[{ADDRESS_LETTERS}-]*[{ADDRESS_LETTERS}])?)")

_CJK_LETTER = re.compile(f"[{CJK_LETTERS}]")


def _cjk_local_emails(text: str) -> Iterator[re.Match]:
    """CJK_LOCAL_EMAIL's matches, searched at each `@` right after such a letter."""
    pos = taken = 0
    while (at := text.find("@", pos)) >= 0:
        pos = at + 1
        if at > 0 and _CJK_LETTER.match(text, at - 1):
            m = CJK_LOCAL_EMAIL.search(text, max(taken, at - 21), at + EMAIL_REACH[1])
            if m is not None and m.end("domain") > at:
                pos = taken = m.end()
                yield m


def _in_url_authority(text: str, start: int) -> bool:
    """`://` then no space, `/` or `@` up to `start` (read back from `start`: searching the
    text before it was O(len) an address)."""
    j = start
    while j > 0 and not (text[j - 1].isspace() or text[j - 1] in "/@"):
        j -= 1
    return text[max(0, j - 3):j] == "://"


def find_emails(text: str) -> Iterator[Span]:
    for m in GROUPED_EMAILS.finditer(text):
        if _personal_domain(m.group(1)):
            yield Span("EMAIL", m.start(), m.end(), m.group(0))
    for m in _email_candidates(text):
        local, _, domain = m.group(0).rpartition("@")
        trimmed = _LOCAL_PART.search(local)
        if trimmed is None or domain.startswith("["):
            continue
        local = trimmed.group(0)
        start = m.end() - len(domain) - 1 - len(local)
        if start > 0 and text[start - 1] in "@/":  # npm `@scope/pkg@1.0`, url paths
            continue
        if _in_url_authority(text, start):
            continue  # userinfo of a URL (`https://user:token@host`), handled as credentials
        end = m.end()
        if end < len(text) and text[end] == ":" and local in {"git", "hg", "svn"}:
            continue  # SSH remote `git@github.com:org/repo`, not an email
        if not _personal_domain(domain):
            continue
        dom = domain.lower()
        if local.lower() in SERVICE_LOCALS:
            continue
        if local.lower() in PLACEHOLDER_LOCALS and dom.split(".")[0] in {"domain", "email", "mail"}:
            continue
        yield Span("EMAIL", start, end, text[start:end])
    for m in OBFUSCATED_EMAIL.finditer(text):
        domain = re.sub(rf"{_OPEN}dot{_CLOSE}", ".", m.group("domain"), flags=re.IGNORECASE)
        tld = domain.rsplit(".", 1)[-1].lower()
        if (len(tld) == 2 or tld in GENERIC_TLDS) and _personal_domain(domain) \
                and m.group("local").lower() not in SERVICE_LOCALS:
            yield Span("EMAIL", m.start(), m.end(), m.group(0))
    for m in _cjk_local_emails(text):
        if _personal_domain(m.group("domain")):
            yield Span("EMAIL", m.start(), m.end(), m.group(0))


# Software whose name right before a dotted quad makes it a version ("Python 3.11.4.1").
VERSIONED = frozenset(
    "python java jdk jre node nodejs npm ruby perl php go golang rust rustc gcc clang llvm cuda "
    "ubuntu debian fedora centos rhel windows macos ios android chrome chromium firefox safari "
    "edge openssl kernel linux torch pytorch numpy tensorflow django flask postgres postgresql "
    "mysql redis nginx apache docker kubernetes".split())
VERSION_WORDS = frozenset({"version", "ver", "vers", "build", "release", "rev", "revision", "oid",
                           "oids", "section", "chapter", "figure", "table", "step", "rule", "pkgver"})


# "Theorems 4.1.2.3 and 4.1.2.4", "versions 1.2.3.4, 1.2.3.5": the next item of a list.
# ("to" is not a list: "release 2.3.1.4 to 93.184.216.34"; a dash joins a range only unspaced)
# (a comma or semicolon needs a space after it: `curl/7.81.0,185.199.108.153` is a CSV row)
# (items may be quoted: `sections "8.2.4.44" and "8.2.4.45"`)
LIST_ITEM = re.compile(
    r"(\d+(?:\.\d+)+)[\"'”’]?(?:\)?(?:\s*[,;]\s+|\s*&\s*|\s+(?:and|or)\s+)\(?[\"'“‘]?|[-\u2013])$",
    re.I)


# a version on a line of its own, with letters no decimal or unit has: `1.3.a4`, `3.2.pl0`,
# `3.4j`, `2g6`, `1.0b2` (not `12.5`, `30s`, `1.5ms`, `4.2x`)
LINE_VERSION = re.compile(
    r"\d+(?:\.\d+)*\.?(?![xh]\d)[a-z]{1,3}\d+|\d+(?:\.\d+)+\.?(?![sxmhgk])[a-z]")
DOTTED = re.compile(r"\d+(?:\.\d+){2,5}")  # `2.7.18`: a version only among others like it
DOTTED_QUAD = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")


def _next_line(text: str, at: int, step: int) -> str:
    """The nearest non-blank line before (`step` -1) or after (+1) position `at`, read from
    `at` (copying the text before or after it was O(len) a candidate)."""
    while 0 < at if step < 0 else at < len(text):
        if not text[at - 1 if step < 0 else at].isspace():
            break
        at += step
    if step < 0:
        return text[text.rfind("\n", 0, at) + 1:at]
    end = text.find("\n", at)
    return text[at:len(text) if end < 0 else end]


LINE_PAD = " \t\r\"',"  # around a number alone on its line


def _among_versions_on_lines(text: str, start: int, dotted: str) -> bool:
    """A dotted quad alone on its line, in a list of lines whose neighbour (the line above or
    below) is a version that cannot be an address: a docstring's list of version numbers."""
    line_start, line_end = start, start + len(dotted)  # read outwards, not the whole line
    while line_start > 0 and text[line_start - 1] in LINE_PAD:
        line_start -= 1
    while line_end < len(text) and text[line_end] in LINE_PAD:
        line_end += 1
    if line_start > 0 and text[line_start - 1] != "\n" or text[line_end:line_end + 1] not in "\n":
        return False
    above, below = (_next_line(text, at, step).strip(" \t\r\"',")
                    for at, step in ((line_start, -1), (line_end, 1)))
    if any(LINE_VERSION.fullmatch(n) for n in (above, below)):
        return True
    return all(DOTTED.fullmatch(n) and not DOTTED_QUAD.fullmatch(n) for n in (above, below))


LIST_TARGET = re.compile(r"\s*([A-Za-z_][\w.]*)\s*[:=]\s*[\[({][^\])};\n]*$")


def _version_like(text: str, start: int, dotted: str, marked: bool = False) -> bool:
    """A dotted quad right after a version marker, or with one among the 3 words before it,
    or the next item of a list whose previous item is one (`marked`: by a marker of its own,
    not the 3-words rule: "release (4.1.0.2) to 93.184.216.34 and 151.101.1.69" lists two
    addresses), or written elsewhere in the same document as a version."""
    if VERSION_CONTEXT.search(text[max(0, start - 24):start]):
        return True
    if _among_versions_on_lines(text, start, dotted):
        return True
    window = max(0, start - 40)
    item = LIST_ITEM.search(text[window:start])
    if item and item.group(1).count(".") == 3 and _version_like(  # as its list's previous quad
            text, window + item.start(1), item.group(1), marked=True):
        return True
    line_start = text.rfind("\n", 0, start) + 1
    # a list's first item needs its marker word right before it ("Python 3.11.4.1, ..."), not
    # among the 3 words before ("release (4.1.0.2) to 93.184.216.34 and ..." lists addresses)
    last = 1 if marked else 3
    before = text[words_back(text, line_start, start, last):start].split()[-last:]
    words = re.findall(r"[A-Za-z§]+", " ".join(before))
    if any(w.lower() in VERSION_WORDS or "version" in w.lower() or w.lower() in VERSIONED
           for w in words):
        return True
    if re.search(r"(?:parse|version|ver)\(\s*[\"']?$", text[max(0, start - 24):start], re.I):
        return True  # `parse("1.2.3.4")`, `LooseVersion('2.7.2.2')`
    target = LIST_TARGET.match(text, line_start, start)
    if target and "version" in target.group(1).lower():
        return True  # `versions = ["1.2.3.4", "1.2.3.5"]`: every item of the list
    # the same number marked elsewhere, or a sibling of a marked number nearby (`sections
    # "8.2.4.44 Bogus comment state" and "8.2.4.45 Markup declaration open"`: one item on)
    parent = dotted.rpartition(".")[0]
    sibling = re.compile(rf"(?<![\d.]){re.escape(parent)}\.\d+(?![\d.])")
    if any(p != start for p in _marked_numbers(text).get(dotted, ())):
        return True
    return any(VERSION_CONTEXT.search(text[max(0, m.start() - 24):m.start()])
               for m in sibling.finditer(text, max(0, start - 300), start))


NUMBER_START = re.compile(r"(?<!\d)\d")  # a digit after a digit never follows a marker


@lru_cache(maxsize=1)
def _marked_numbers(text: str) -> dict[str, list[int]]:
    """{the 7 to 15 characters from a number's start: its starts} for the numbers right after
    a version marker, found once a document: searching the whole text for each candidate
    address was O(len) an address (a log of 8000 lines of them took seconds)."""
    marked: dict[str, list[int]] = {}
    for m in NUMBER_START.finditer(text):
        p = m.start()
        if VERSION_CONTEXT.search(text[max(0, p - 24):p]):
            for length in range(7, 16):  # `1.2.3.4` to `123.123.123.123`
                marked.setdefault(text[p:p + length], []).append(p)
    return marked


def _host_ipv4(text: str, m: re.Match) -> bool:
    """A globally routable host's address: not multicast (which `is_global` lets through),
    not a network block (`224.0.0.0/4`); a reverse-DNS name (`4.3.2.1.in-addr.arpa`) is
    judged by the address it spells backwards."""
    dotted, after = m.group(0), text[m.end():m.end() + 16]
    block = re.match(r"/([0-9]|[12][0-9]|30)(?!\d)", after)  # /31, /32: hosts (RFC 3021)
    if block and not re.search(r"\b(?:addr(?:ess)?\s+add|inet|address)\s*$",
                               text[max(0, m.start() - 16):m.start()], re.I):  # `ip addr add`
        try:  # the block's own address (host bits zero), not a host written with its prefix
            ipaddress.IPv4Network(f"{dotted}/{block.group(1)}", strict=True)
            return False
        except ValueError:
            pass
    if after.lower().startswith(".in-addr.arpa"):
        dotted = ".".join(reversed(dotted.split(".")))
    return is_public_ip(dotted) and not ipaddress.IPv4Address(dotted).is_multicast


# Stock addresses of documentation, in the public range but nobody's ("IP addr string
# (123.45.67.89)"): the paper's realness rule, like the reserved example domains for emails.
PLACEHOLDER_IPS = frozenset({"123.45.67.89", "12.34.56.78", "1.2.3.4", "11.22.33.44",
                             "98.76.54.32", "123.123.123.123", "111.111.111.111"})


def find_ips(text: str) -> Iterator[Span]:
    for m in IPV4_CANDIDATE.finditer(text):
        if m.group(0) in PLACEHOLDER_IPS:
            continue
        if _host_ipv4(text, m) and not _version_like(text, m.start(), m.group(0)):
            yield Span("IP_ADDRESS", m.start(), m.end(), m.group(0))
    for m in IPV6_CANDIDATE.finditer(text):
        cand = m.group(0)
        if cand.count(":") < 2 or "::" not in cand and cand.count(":") != 7:
            continue
        groups = [g for g in cand.split(":") if g]
        if not any(len(group) >= 3 for group in groups):
            continue  # `xs[1::2]`, `a::b`, `cc::dd`: slices and scopes, not addresses
        if cand.endswith("::") and len(groups) == 1 or groups[0].lower() == "ffff":
            continue  # a network prefix (`ff00::`, `2000::`) or a mask (`ffff:ffff:…`)
        if re.search(r"[\w)\]]\[$", text[max(0, m.start() - 2):m.start()]):
            continue  # a subscript `xs[100::200]` (an address's bracket follows `//` or a space)
        try:
            ip = ipaddress.IPv6Address(cand)
        except ValueError:
            continue
        if ip.is_global and ip.ipv4_mapped is None:
            yield Span("IP_ADDRESS", m.start(), m.end(), cand)
