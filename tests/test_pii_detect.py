"""Per-type PII detection on crafted examples, hard negatives, and overlap resolution."""

from __future__ import annotations

import json
import random

import pytest
from linear_time import assert_linear

from kiln.data.pii import Span, detect_pii, redact, resolve_overlaps
from kiln.data.pii.secrets import shannon_entropy


def found(text: str, pii_type: str) -> list[str]:
    return [s.text for s in detect_pii(text) if s.type == pii_type]


@pytest.mark.parametrize("pii_type,text,expected", [
    ("KEY", "aws_access_key_id = AKIAQ3EGRZ7XJ5KMN2PB\n", ["AKIAQ3EGRZ7XJ5KMN2PB"]),
    ("KEY", 'token: "ghp_R8mX2qLk9Vz4Tn7Wb1Yc5Hd3Jf6Gs0Pa8Ue2"', ["ghp_R8mX2qLk9Vz4Tn7Wb1Yc5Hd3Jf6Gs0Pa8Ue2"]),
    ("KEY", "const k = 'AIzaSyD7x2Kp9Qm4Vb1Rn8Tw3Lc6Hj0Fz5Ye2Ug';", ["AIzaSyD7x2Kp9Qm4Vb1Rn8Tw3Lc6Hj0Fz5Ye2Ug"]),
    ("KEY", "SLACK=xoxb-12345678901-123456789012-Ab3dE5gH7jK9mN1pQ3sT5vW7", ["xoxb-12345678901-123456789012-Ab3dE5gH7jK9mN1pQ3sT5vW7"]),
    ("KEY", 'client_secret = "Zq8vR2mN5pL1xK7wT4yH9sD3"', ["Zq8vR2mN5pL1xK7wT4yH9sD3"]),
    ("PASSWORD", "DB_PASSWORD=Tr0ub4dor&3\n", ["Tr0ub4dor&3"]),
    ("PASSWORD", "db = 'mysql://etl:Gx4mW8qT1z@db.internal/x'", ["Gx4mW8qT1z"]),
    ("PASSWORD", "<password>Qv7!nX3pR9s</password>", ["Qv7!nX3pR9s"]),
    ("USERNAME", "ssh mkaczmarek@build-07.internal", ["mkaczmarek"]),
    ("USERNAME", 'File "/home/evasquez/src/app.py", line 3', ["evasquez"]),
    ("USERNAME", "LGTM, thanks @tkrishnan!", ["tkrishnan"]),
    ("USERNAME", "username: rsingh\n", ["rsingh"]),
    ("EMAIL", "Contact jane.okafor@gmail.com today", ["jane.okafor@gmail.com"]),
    ("EMAIL", "send(to='bob.lee@corp.io')", ["bob.lee@corp.io"]),
    # authors' addresses written once, as papers do (plain and LaTeX-escaped braces)
    ("EMAIL", "{alice.smith, bob.jones}@cs.mit.edu", ["{alice.smith, bob.jones}@cs.mit.edu"]),
    ("EMAIL", r"Emails: \{asmith,bjones\}@uni-bonn.de.", [r"\{asmith,bjones\}@uni-bonn.de"]),
    ("EMAIL", r"$\{$alice, bob$\}$@cs.stanford.edu", [r"$\{$alice, bob$\}$@cs.stanford.edu"]),
    ("EMAIL", "{alice|bob}@mit.edu", ["{alice|bob}@mit.edu"]),
    ("NAME", "# Copyright (c) 2021 Jorge Villalobos\n", ["Jorge Villalobos"]),
    ("NAME", '__author__ = "Priya Raghunathan"\n', ["Priya Raghunathan"]),
    ("NAME", "Signed-off-by: Chidi Okafor <chidi@okafor.dev>", ["Chidi Okafor"]),
    ("NAME", "Thanks,\n\nBest regards,\nLena Holmqvist\n", ["Lena Holmqvist"]),
    ("NAME", "Alice Johnson and Bob Smith wrote it with Carol White.",
     ["Alice Johnson", "Bob Smith", "Carol White"]),
    ("IP_ADDRESS", "Invalid user admin from 185.220.101.47 port 40022", ["185.220.101.47"]),
    ("IP_ADDRESS", "for example the problem resolver 8.8.4.4 answered", ["8.8.4.4"]),
    # a numbering word exempts only the number right after it, not an address further on
    ("IP_ADDRESS", "The algorithm contacts 45.33.32.156", ["45.33.32.156"]),
    ("IP_ADDRESS", "Appendix lists 45.33.32.156", ["45.33.32.156"]),
    ("IP_ADDRESS", "Thm 1: from 45.33.32.156", ["45.33.32.156"]),
    ("IP_ADDRESS", "timeout after 30 sec 45.33.32.156", ["45.33.32.156"]),
    ("IP_ADDRESS", "the app 34.120.5.9 crashed", ["34.120.5.9"]),
    ("IP_ADDRESS", "open a new tab 93.184.216.34", ["93.184.216.34"]),
    ("IP_ADDRESS", "Fact: 45.33.32.156 is the server", ["45.33.32.156"]),
    # the next item of a list is what its previous item is
    ("IP_ADDRESS", "servers 10.0.0.1 and 45.33.32.156", ["45.33.32.156"]),
    ("IP_ADDRESS", "hosts 45.33.32.155, 45.33.32.156", ["45.33.32.155", "45.33.32.156"]),
    ("IP_ADDRESS", "By Lemma 2.1 and 45.33.32.156", ["45.33.32.156"]),
    # a host's /32, a reverse-DNS name of a public address, a list of addresses on lines
    ("IP_ADDRESS", "host 45.33.32.156/32 ok", ["45.33.32.156"]),
    ("IP_ADDRESS", "PTR 156.32.33.45.in-addr.arpa", ["156.32.33.45"]),
    ("IP_ADDRESS", "blocked:\n45.33.32.156\n185.220.101.47\n", ["45.33.32.156", "185.220.101.47"]),
    ("PASSWORD", "self.password = 'Xk3-pq9z'", ["Xk3-pq9z"]),
    ("USERNAME", "username: quentin_takahashi\n", ["quentin_takahashi"]),  # not `hash` code
    ("PASSWORD", "db.password=Xk3-pq9", ["Xk3-pq9"]),
    ("PASSWORD", "sshpass -p Xk3pq9z ssh host", ["Xk3pq9z"]),
    ("PASSWORD", "the login password: Tr0ub4dor&3 should be changed.", ["Tr0ub4dor&3"]),
    # exemptions for code that must not swallow real values
    ("PASSWORD", "username: alice, password: Sup3rSecret9", ["Sup3rSecret9"]),
    ("PASSWORD", "db_user: app, db_password: Tr0ub4dorXq93", ["Tr0ub4dorXq93"]),
    ("IP_ADDRESS", "ip addr add 93.184.216.34/24 dev eth0", ["93.184.216.34"]),
    ("IP_ADDRESS", "Deploying release candidate 2.3.1.4 to 93.184.216.34 now", ["93.184.216.34"]),
    ("IP_ADDRESS", "release (4.1.0.2) to 93.184.216.34 and 151.101.1.69", ["151.101.1.69"]),
    ("IP_ADDRESS", "hosts:\n93.184.216.34\n2.0.1\n", ["93.184.216.34"]),
    ("IP_ADDRESS", "elapsed\n93.184.216.34\n30s\n", ["93.184.216.34"]),
    ("IP_ADDRESS", "servers:\n93.184.216.34\n1.5ms\n", ["93.184.216.34"]),
    ("IP_ADDRESS", "ip addr add 93.184.216.34/31 dev eth0", ["93.184.216.34"]),
    ("IP_ADDRESS", "ip addr add 93.184.216.64/26 dev eth0", ["93.184.216.64"]),
    ("PASSWORD", "OK, password = Tr0ub4dor3", ["Tr0ub4dor3"]),
    ("PASSWORD", "alice, password = Tr0ub4dor3", ["Tr0ub4dor3"]),
    ("PASSWORD", "mysql -u jdoe99 -p Xk3pq9z mydb", ["Xk3pq9z"]),
    ("NAME", "Jessica Hill wrote the original patch.", ["Jessica Hill"]),
    ("NAME", "Please contact Michael Hall about the invoice.", ["Michael Hall"]),
    ("NAME", "I met Peter Reading at the conference.", ["Peter Reading"]),
    ("NAME", "Regards,\nEmre Can\n", ["Emre Can"]),
    ("PASSWORD", "mysql --host=db \\\n  -u appuser \\\n  -p Zr8vQk2mLx \\\n  shop", ["Zr8vQk2mLx"]),
    ("PASSWORD", "cypher-shell -u neo4j -p Gr4phP4ss", ["Gr4phP4ss"]),
    ("USERNAME", "python sync_users.py -u kowalski -p Xq7mR2vLp9", ["kowalski"]),
    ("IP_ADDRESS", "2024-03-01T10:00:01Z,curl/7.81.0,185.199.108.153,GET /api", ["185.199.108.153"]),
    ("IP_ADDRESS", "kube-probe/1.27.3; 52.14.88.10", ["52.14.88.10"]),
    ("IP_ADDRESS", "Old releases: 45.33.32.156 (mirror)", ["45.33.32.156"]),
    ("IP_ADDRESS", "x:\n93.184.216.34\n1.5\n", ["93.184.216.34"]),
    ("IP_ADDRESS", "y\n93.184.216.34\n1920x1080\n", ["93.184.216.34"]),
    ("IP_ADDRESS", "AAAA 2606:2800:21f:cb07:6820:80da:af6b:8b2c", ["2606:2800:21f:cb07:6820:80da:af6b:8b2c"]),
])
def test_detects_each_type(pii_type, text, expected):
    assert found(text, pii_type) == expected


def test_private_key_block_is_one_key_span():
    body = "\n".join(["MIIEpAIBAAKCAQEA7bq9" + "Xk3" * 20] * 5)
    block = f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----"
    spans = detect_pii(f"key = '''{block}'''")
    assert [(s.type, s.text) for s in spans] == [("KEY", block)]


@pytest.mark.parametrize("text", [
    'version = "1.2.3.4"', '[assembly: AssemblyVersion("2.0.1.0")]', "pkgver=1.4.2.3",
    "OIDs: 1.3.6.1.4.1.311.21.7 and 2.5.4.3", "listen 127.0.0.1:8080; gateway 192.168.1.1",
    "ping 2001:db8::1 and fe80::1", "ether 02:42:ac:11:00:02 at 12:30:45", "999.1.1.1",
    'request_id = "9b2d3f6e-1c4a-4e8b-9f0d-7a6c5b4e3d21"',
    '"integrity": "sha512-v2kDEe57lecTulaDIuNTPy3Ry4gLGJ6Z1O3vE1krgXZNrsQ+LFTGHVxVjcXPs17LhbZVGedAJv8XZ1tvj5FvSg=="',
    "contact: support@example.com", "git remote add origin git@github.com:acme/widgets.git",
    'background: url("icon@2x.png"); npm i lodash@4.17.21', "aws_access_key_id = AKIAIOSFODNN7EXAMPLE",
    "The user input is validated; the user name is required.", "password: string;",
    'password = os.environ["DB_PASSWORD"]', "DB_PASSWORD=${DB_PASSWORD}", 'password = "changeme"',
    "@property\ndef size(self):\n    return 1\n", 'import { render } from "@testing-library/react";',
    "# Copyright 2020 The Kubernetes Authors.", "Copyright (c) 2015-2023 Microsoft Corporation",
    "- name: Build and test\n  run: make test", 'tokenizer_name = "bert-base-multilingual-cased"',
    "max_tokens = 4096", '<img src="data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk">',
    "user = User.objects.get(pk=request.user.pk)", "cd /home/runner/work/app", "Hello World!",
    # numbered parts of papers (LaTeX-derived text), not addresses; documentation addresses
    "By Theorem 4.1.2.3 we get", "see Lemma 2.1.3.5", "Equation 5.2.1.3 shows", "Eq. (5.2.1.3)",
    "as Proposition 3.1.4.1 and Corollary 3.1.4.2 state", "{alice,bob}@example.com",
    "Lemmas 5.1.2.3", "Eqs. 5.2.1.3", "Prop. 4.1.2.3", "Def. 4.1.2.3",
    "see Sec. 3.2.1.4", "App. 2.1.1.3", "Figs. 3.1.2.4",
    # code and docs from the stdlib the quickstart trains on
    "        self.username, self.password = credentials\n",
    "    self.password = credentials\n",
    "            user_pass = '%s:%s' % (unquote(user), unquote(password))\n",
    "Combine with\nthe -n and -p options to control the host\n",
    "    _multicast_network = IPv4Network('224.0.0.0/4')\n", "route 45.33.32.0/24 via gw\n",
    "join group 239.1.2.3 now\n", "'1.0.0.127.in-addr.arpa'\n",
    "          '   @f1(arg)\\n'\n          '   @f2\\n'\n          '   class Foo: pass\\n'\n",
    "invalid version numbers:\n\n    1\n    2.7.2.2\n    1.3.a4\n    3.2.pl0\n    3.1.1.6\n    2g6\n",
    "Theorems 4.1.2.3 and 4.1.2.4 show", "Eqs. (5.2.1.3) and (5.2.1.4)",
    "Russell Square", "Wayne County", "Kelly Criterion", "Tony Awards", "Terry Cloth",
    "Bob Signs the message", "Mike Check", "### Bob Verifies the Signature",
    "Gary Indiana steel mills", "Wayne Enterprises", "- user: db-user  the database user\n",
    "Versions 1.2.3.4, 1.2.3.5 and 1.2.3.6 are affected.", "Python 3.11.4.1, 3.11.4.2 and 3.11.4.3 crash.",
    "Supported:\n2.7.18\n2.7.2.2\n3.4.1\n", "    username, password = creds\n",
    "cp -p notes.txt backup/", "git add -p patch", "sort -u names.txt", "git push -u origin main",
    "mkdir -p build/out",
    "versions 1.2.3.4, 1.2.3.5, 1.2.3.6", "Sections 3.1.4.1-3.1.4.5",
])
def test_hard_negatives_not_detected(text):
    assert detect_pii(text) == []


def test_public_vs_private_ip_policy():
    assert found("8.8.8.8", "IP_ADDRESS") == ["8.8.8.8"]
    assert found("192.168.0.1", "IP_ADDRESS") == []
    assert found("11.1.2.3.45", "IP_ADDRESS") == []  # datatrove's bare regex would match inside


@pytest.mark.parametrize("local", ["noreply", "no-reply", "DoNotReply", "mailer-daemon",
                                   "postmaster", "notifications"])
def test_service_addresses_at_real_domains_are_not_emails(local):
    """A service mailbox reaches a machine, not a person: not PII even at a real domain,
    where the same domain with a person's mailbox is."""
    text = f"From: {local}@github.com\nCc: jane.okafor@github.com\n"
    assert found(text, "EMAIL") == ["jane.okafor@github.com"]


def test_dotted_quad_written_elsewhere_as_a_version_is_not_an_ip():
    """Once a document calls 185.220.101.47 a version, every other mention of it is that
    version too, even where the words around it say nothing of versions; the same mention in
    a document without the version is a public IP."""
    mention = "The mirror now serves 185.220.101.47 to everyone.\n"
    assert found(mention, "IP_ADDRESS") == ["185.220.101.47"]
    assert found("Upgraded to version 185.220.101.47 yesterday.\n" + mention, "IP_ADDRESS") == []
    assert found(mention + "Rolled back from release 185.220.101.47.\n", "IP_ADDRESS") == []
    # repeated without any version marker: both mentions stay addresses
    assert found(mention + "Ping 185.220.101.47 again.\n", "IP_ADDRESS") == ["185.220.101.47"] * 2


def test_shannon_entropy_reference_values():
    assert shannon_entropy("aaaa") == 0.0
    assert shannon_entropy("abcd") == pytest.approx(2.0)
    assert shannon_entropy("aabb") == pytest.approx(1.0)


def test_overlap_resolution_is_deterministic_and_prefers_longest_then_priority():
    text = "x" * 40
    spans = [Span("NAME", 0, 10, text[0:10]), Span("EMAIL", 5, 20, text[5:20]),
             Span("USERNAME", 18, 30, text[18:30]), Span("KEY", 18, 30, text[18:30]),
             Span("IP_ADDRESS", 32, 36, text[32:36])]
    expected = [Span("EMAIL", 5, 20, text[5:20]), Span("IP_ADDRESS", 32, 36, text[32:36])]
    rng = random.Random(0)
    for _ in range(20):
        rng.shuffle(spans)
        assert resolve_overlaps(spans) == expected
    tie = [Span("USERNAME", 0, 12, text[:12]), Span("KEY", 0, 12, text[:12])]
    assert resolve_overlaps(tie) == [Span("KEY", 0, 12, text[:12])]


def _greedy_reference(spans: list[Span]) -> list[Span]:
    """The rule spelled out: rank, then keep each span that overlaps no span kept before."""
    kept: list[Span] = []
    for s in sorted(set(spans), key=lambda s: (s.start - s.end, PRIORITY.index(s.type), s.start)):
        if all(s.end <= k.start or k.end <= s.start for k in kept):
            kept.append(s)
    return sorted(kept, key=lambda s: s.start)


PRIORITY = ("KEY", "PASSWORD", "EMAIL", "IP_ADDRESS", "USERNAME", "NAME")


def test_overlap_resolution_agrees_with_the_greedy_rule_and_stays_linear():
    """Many spans (a log with an address on each line) were resolved against every kept
    span, O(k^2): 8000 lines took seconds, a few MB of log minutes."""
    rng = random.Random(1)
    text = "x" * 300
    for _ in range(300):
        spans = []
        for _ in range(rng.randint(0, 25)):
            a = rng.randrange(299)
            b = rng.randint(a + 1, min(300, a + 30))
            spans.append(Span(rng.choice(PRIORITY), a, b, text[a:b]))
        assert resolve_overlaps(spans) == _greedy_reference(spans)

    def many(k: int) -> list[Span]:
        return [Span("IP_ADDRESS", 10 * i, 10 * i + 7, "x" * 7) for i in range(k)]

    assert_linear(resolve_overlaps, many, 2_000, "disjoint spans")


def test_url_credentials_do_not_become_an_email():
    text = "git clone https://rfarouk:ghp_5Tq8Vw2Xz9Yb1Nc4Md7Lf0Kg3Hj6Pa2Rs8Ue1@github.com/r/p.git"
    assert [(s.type, s.text) for s in detect_pii(text)] == [
        ("USERNAME", "rfarouk"), ("KEY", "ghp_5Tq8Vw2Xz9Yb1Nc4Md7Lf0Kg3Hj6Pa2Rs8Ue1")]


def test_an_email_on_the_line_after_a_url_is_found():
    """The URL-userinfo check read `://host` then end of text with `$`, which also matches
    before a final newline: an address opening the line after a URL was skipped as userinfo."""
    for text in ("docs at https://fjord.no\ndagny.holm@fjordmail.no wrote",
                 "docs at https://fjord.no\r\ndagny.holm@fjordmail.no wrote"):
        assert [(s.type, s.text) for s in detect_pii(text)] == [("EMAIL", "dagny.holm@fjordmail.no")]


def test_bad_input_is_rejected_clearly():
    with pytest.raises(TypeError, match="expects str"):
        detect_pii(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown PII types"):
        detect_pii("x", types=["PHONE"])
    with pytest.raises(ValueError, match=r"unknown PII types \['PHONE'\]"):
        detect_pii("x", types="PHONE")  # the name, not its letters
    text = "mail dagny.holm@fjordmail.no from 52.14.3.9"
    assert [s.type for s in detect_pii(text, types="EMAIL")] == ["EMAIL"]
    assert redact(text, "EMAIL")[1]["IP_ADDRESS"] == 0
    with pytest.raises(ValueError, match="unknown PII type"):
        Span("PHONE", 0, 1, "x")


def test_first_letter_grouping_matches_the_flat_alternation():
    import re

    from kiln.data.pii.names import FIELD_WORDS, _by_first_letter

    flat = re.compile(rf"(?i:(?:{'|'.join(FIELD_WORDS)}))")
    grouped = re.compile(rf"(?i:(?:{_by_first_letter(FIELD_WORDS)}))")
    samples = ["Contact_Name: Ana", "contact: x", "co-authored-by", "reported  by", "Reported-By",
               "authors", "display_name", "firstname", "surnames", "owner_id", "nothing here"]
    for text in samples:
        assert [m.span() for m in flat.finditer(text)] == [m.span() for m in grouped.finditer(text)]
    assert grouped.fullmatch("contact_name") and grouped.match("contact_name").group() == "contact"


@pytest.mark.parametrize("code", [
    "odds = xs[1::2]\nevens = xs[::2]\n",  # slices are not IPv6
    "ns = cc::dd\nx = a::b\ny = xs[100::200]\n",  # nor scopes or wide slices
    "    @functools.cached_property  # computed once\n    def f(self): ...\n",
    "@my_decorator # x\ndef g(): ...\n",
    ">>> @total_ordering\n... class A: ...\n",
    "We use @wraps and @contextmanager here, and @overload-decorated functions.\n",
    "@NotNull\n@Getter private String x;\n",
    "RegOpenKeyEx = win32api.RegOpenKeyEx\n",
    "# First pass: determine the order\n",
    "userid = passwd = acct = ''\n",
    "if self.username == other.username:\n",
    "tarinfo.uid = statres.st_uid\nif uid is not None:\n    tarinfo.uid = uid\n",
    "if not uid: continue\n",
    "   - user:         The user name to authenticate with.\n",
    "def name_by_id(user_id: UserId) -> str:\n",
    "ls -l sys.path and -l list\n",
    "# @keyparam name: the key\nx = doc.find('[@attribute=\"v\"]')\n",
    'versions = ["1.2.3.4", "1.2.3.5"]\ndist = parse("1.2.3.4")\n',
    "Tested on Python 3.11.4.1 today\n",
    "_BASE = IPv6Network('ff00::/8'); MASK = 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0'\n",
    # the twelfth review, on the quickstart's written documents
    "class DisplayName(Phrase):\n    pass\n", "    display_name = DisplayName()\n",
    "Months = ' Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec'.split(' ')\n",
    "label = Label(frame, text='Max Context Lines :')\nw = 'Format Paragraph Max Width'\n",
    "    'posix_user': {\n        'base': '{userbase}',\n    },\n    'user': 'posix_user',\n",
    '# HTML5 specs sections "8.2.4.44 Bogus\n# comment state" and "8.2.4.45 Markup declaration open\n',
    "inet_aton() -- convert IP addr string (123.45.67.89) to 32-bit packed format\n",
    "# See @XMLRPC3 for more information.\n",
    "# Copyright 2004-2005 Elemental Security, Inc. All Rights Reserved.\n",
    "# Copyright 2000, Mojam Media, Inc., all rights reserved.\n",
])
def test_code_and_prose_about_code_are_left_alone(code):
    """Found on the stdlib the quickstart trains on: each of these used to be redacted
    (`xs[<IP_ADDRESS>]`, `@<USERNAME>`), corrupting the training text."""
    assert detect_pii(code) == []


@pytest.mark.parametrize(("text", "found"), [
    ("When Maria Garcia arrived, Professor David Miller was waiting.",
     [("NAME", "Maria Garcia"), ("NAME", "David Miller")]),  # a capitalised word first
    ("client at [2400:e2f6:b6a1::4e9d]:443 and http://[2606:4700::1111]:80/",
     [("IP_ADDRESS", "2400:e2f6:b6a1::4e9d"), ("IP_ADDRESS", "2606:4700::1111")]),
    ('if password == "Fjord-Kite-58":\n', [("PASSWORD", "Fjord-Kite-58")]),
    ("@dagnyholm can you look?\n", [("USERNAME", "dagnyholm")]),
    ("host=db user=dagnyh password=Fjord58x dbname=sales\n",  # pairs are not prose
     [("USERNAME", "dagnyh"), ("PASSWORD", "Fjord58x")]),
    # whole names, not a code word before or a possessive after, and the ones in source escapes
    ("# based on IMAP_SSL. Hector Urtubia <urtubia@mrbook.org> Aug 2003\n",
     [("NAME", "Hector Urtubia"), ("EMAIL", "urtubia@mrbook.org")]),
    ("Written by Martin v. Löwis.\n", [("NAME", "Martin v. Löwis")]),
    ('__author__ = "Lars Gust\\u00e4bel (lars@gustaebel.de)"\n',
     [("NAME", "Lars Gust\\u00e4bel"), ("EMAIL", "lars@gustaebel.de")]),
    ("# Written by Sam Rushing's friend\n", [("NAME", "Sam Rushing")]),
    ("# SPDX-FileCopyrightText: 2021 Taneli Hukkinen\n", [("NAME", "Taneli Hukkinen")]),
    (":copyright: Copyright 2008 by Armin Ronacher.\n", [("NAME", "Armin Ronacher")]),
    ("servers 93.184.216.34 and 93.184.216.35 are up; version 93.184.216.1\n",
     [("IP_ADDRESS", "93.184.216.34"), ("IP_ADDRESS", "93.184.216.35")]),
])
def test_what_the_code_rules_must_not_lose(text, found):
    assert [(s.type, s.text) for s in detect_pii(text)] == found


@pytest.mark.parametrize("text", [
    "Return a Tuple[str, int] e.g., ['7.1.4.34', 1806]\n",
    "# but reject IPv6 address (ex: 'fe80::5054:ff:fe9' or '123:2:3:4:5:6:7:8').\n",
    '   >>> s.sendmail("me@my.org", ["one@one.org", "two@two.org"], msg)\n',
    "Example usage:\n\nimport urllib.request\n\nauth.add_password(realm='PDQ',\n"
    "                  user='klem',\n                  passwd='geheim$parole')\n",
    "entries (both in clear text). Eg:\n\n    [pypi]\n    username: fred\n    password: sekrit\n",
    "x" * 500 + " Example usage:  \n\nauth(user='klem', passwd='geheim$parole')\n",  # a long heading line
    "Example usage:\r\n\r\nauth(user='klem', passwd='geheim$parole')\r\n",  # CRLF: a Windows file
])
def test_values_the_text_shows_as_examples_are_not_pii(text):
    """The digest's realness-by-context rule: an address, login, password or email the text
    introduces as an example is a placeholder."""
    assert detect_pii(text) == []


@pytest.mark.parametrize(("text", "found"), [
    ("for example the problem resolver 8.8.4.4 answered", [("IP_ADDRESS", "8.8.4.4")]),
    # "sample" the thing handled, not a value's label
    ("Please send the sample to dagny.holm@fjordmail.no today",
     [("EMAIL", "dagny.holm@fjordmail.no")]),
    ("the sample from 52.14.3.9 was bad", [("IP_ADDRESS", "52.14.3.9")]),
    ("# example config\n" + "x = 1\n" * 16 + "password = 'Fjord-Kite-58'\n",
     [("PASSWORD", "Fjord-Kite-58")]),  # the heading is too far above
    ("e.g. ask Dagny Holm <dagny.holm@fjordmail.no>\n",
     [("NAME", "Dagny Holm"), ("EMAIL", "dagny.holm@fjordmail.no")]),
    ("e.g. api_key = 'AKIAZ7Q4TX2LM8RN5KWP'\n", [("KEY", "AKIAZ7Q4TX2LM8RN5KWP")]),
])
def test_the_example_rule_stops_where_the_example_does(text, found):
    """Only the value right after the marker, or under an example heading close above; and
    never a key or a person's name (an example may cite a real one)."""
    assert [(s.type, s.text) for s in detect_pii(text)] == found


def test_the_example_rule_reads_minified_json_as_spaced_json():
    """A value is an example only within two words of the marker. Minified JSON has no space:
    read as one word, its line put every value after a `sample` in reach, so none of the
    users' addresses on it was redacted."""
    record = {"sample": 1, "users": ["dagny.holm@fjordmail.no", "ola.nord@fjordmail.no",
                                     "kari.lie@fjordmail.no"]}
    compact, spaced = json.dumps(record, separators=(",", ":")), json.dumps(record)
    kept = ["ola.nord@fjordmail.no", "kari.lie@fjordmail.no"]  # the first is the marker's
    assert [s.text for s in detect_pii(compact)] == [s.text for s in detect_pii(spaced)] == kept


def test_the_example_rule_reads_a_bounded_stretch_before_a_value():
    """A line without spaces (CJK prose, a blob) was one word: each value read back to the
    line's start for the words before it, O(len^2) (4,000 addresses in a CJK line: 9 s),
    and a marker any distance back on it was "right before" every value."""
    from kiln.data.pii.context import MAX_LOOKBACK

    blob = "x" * (MAX_LOOKBACK + 100)
    assert found(f"e.g. {blob} 52.14.3.9", "IP_ADDRESS") == ["52.14.3.9"]
    assert found(f"{blob} e.g. 52.14.3.9", "IP_ADDRESS") == []
    ips = [f"{11 + i % 80}.{1 + i % 240}.9.{i % 250 + 1}" for i in range(300)]
    line = "，".join(f"服务器{ip}" for ip in ips)  # its own punctuation separates its words
    assert found(line, "IP_ADDRESS") == ips
    assert found("例如 e.g. " + line, "IP_ADDRESS") == ips[2:]  # two words from the marker


@pytest.mark.parametrize("text, address", [
    ("请联系zhang.wei@qq.com获取详情", "zhang.wei@qq.com"),  # CJK runs into the address
    ("メールtanaka@fjordmail.jpまで", "tanaka@fjordmail.jp"),
    ("Kontakt: jürgen.müller@web.de", "jürgen.müller@web.de"),
    ("écrire à françois.dupont@orange.fr", "françois.dupont@orange.fr"),
    ("kontakt@bücher.de", "kontakt@bücher.de"),  # an internationalised domain
    ("Почта: иван.петров@fjord.ru", "иван.петров@fjord.ru"),
    ("邮箱：张伟@fjordmail.cn 谢谢", "张伟@fjordmail.cn"),  # RFC 6531: a local part in CJK
    ("メール 田中@fjordmail.jp", "田中@fjordmail.jp"),
    ("김철수@naver.com로 보내세요", "김철수@naver.com"),
])
def test_an_address_next_to_or_made_of_non_ascii_letters_is_found_whole(text, address):
    """datatrove's pattern, ASCII classes after a Unicode `\\b`, found no start inside a
    word of other letters (missed the first three whole) and cut an accented local part short
    (`françois.<EMAIL>` kept the given name); a local part all in CJK, kana or Hangul (RFC
    6531 allows any UTF-8) was missed whole."""
    out, counts = redact(text)
    assert [s.text for s in detect_pii(text)] == [address]
    assert out == text.replace(address, "<EMAIL>") and counts["EMAIL"] == 1


@pytest.mark.parametrize("text, address", [
    ("服务器52.14.3.9端口8080", "52.14.3.9"),
    ("IPアドレスは52.14.3.9です", "52.14.3.9"),
    ("サーバー2a00:1450:4001:81b::200eに接続", "2a00:1450:4001:81b::200e"),
])
def test_an_ip_address_run_into_cjk_text_is_found(text, address):
    """The address edges were `\\w`, which CJK and kana letters are: an address written into
    such text without spaces (as it usually is) was never a candidate."""
    assert [(s.type, s.text) for s in detect_pii(text)] == [("IP_ADDRESS", address)]


def test_a_cjk_local_part_run_into_prose_is_taken_whole_with_it():
    """Where prose in CJK runs into the address its start is unknowable: the run before the
    `@` goes, rather than the address staying; a reserved domain stays a placeholder."""
    assert redact("请联系张伟@qq.com获取详情")[0] == "<EMAIL>获取详情"
    assert detect_pii("请联系张伟@example.com") == []


def test_http_basic_credentials_are_a_key_unless_a_placeholder():
    """`Authorization: Basic <base64 of user:password>` hands the password to whoever decodes
    it; no rule saw it (no assignment, too short for the entropy rule)."""
    import base64

    real = base64.b64encode(b"dagny:Fjord-Kite-58").decode()
    assert [(s.type, s.text) for s in detect_pii(f"Authorization: Basic {real}\n")] == [("KEY", real)]
    for text in ("Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==",  # RFC 7617's example
                 f"Basic {base64.b64encode(b'user:password').decode()}",
                 "Basic authentication is simple", "Basic 12345678"):
        assert detect_pii(text) == [], text


def test_a_bearer_token_run_into_cjk_text_is_found():
    """`\bBearer\b` found no edge between a CJK letter and the `B`: the token was kept."""
    token = "kR8mX2qLk9Vz4Tn7Wb1Yc5Hd3"
    for text in (f"请使用Bearer {token}认证", f"认证头Bearer {token}"):
        assert [(s.type, s.text) for s in detect_pii(text)] == [("KEY", token)], text


@pytest.mark.parametrize("text", ["关注@dagny_holm获取更多", "联系：@dagny_holm 谢谢", "@dagny_holm的推文"])
def test_a_handle_run_into_cjk_text_is_found(text):
    """The handle's edges were a space before and no `\\w` after: CJK text, which runs into
    it without a space and whose letters are `\\w`, hid it."""
    assert [(s.type, s.text) for s in detect_pii(text)] == [("USERNAME", "dagny_holm")]


@pytest.mark.parametrize("text, found", [
    ("运行mysql -u dagny -pFjord-Kite-58 即可", [("USERNAME", "dagny"), ("PASSWORD", "Fjord-Kite-58")]),
    ("密码password is Fjord-Kite-58", [("PASSWORD", "Fjord-Kite-58")]),
    ("用户login is dagny.holm", [("USERNAME", "dagny.holm")]),
    ("主页/home/dagny77/x", [("USERNAME", "dagny77")]),
])
def test_a_keyword_run_into_cjk_text_still_starts_its_rule(text, found):
    """`\\b` before `mysql`, `password is`, `login is` and `(?<!\\w)` before `/home/` found
    no edge after a CJK letter (a `\\w` too): the password or login after them was kept."""
    assert [(s.type, s.text) for s in detect_pii(text)] == found


@pytest.mark.parametrize("text, redacted", [
    ('curl -d "username=dagny77&password=Fjord-Kite-58" https://x.no',
     'curl -d "username=<USERNAME>&password=<PASSWORD>" https://x.no'),
    ("https://x.no/login?password=Fjord-Kite-58&user=dagny77&next=/home",
     "https://x.no/login?password=<PASSWORD>&user=<USERNAME>&next=/home"),
    ("DB_PASSWORD=Tr0ub4dor&3x", "DB_PASSWORD=<PASSWORD>"),  # no field after: the password's
])
def test_a_query_or_form_value_ends_at_the_next_field(text, redacted):
    """`user=dagny77&password=PW` read as one value: `dagny77&password=PW` is no username
    (the login was kept), and a password ate the rest of its URL."""
    assert redact(text)[0] == redacted


@pytest.mark.parametrize("text", [
    "https://api.x.no/v1?api_key=A1b9XkQ2mZ7pLr4TnW8v&format=json",
    "client_secret=A1b9XkQ2mZ7pLr4TnW8v&grant_type=client_credentials",
    'url = "https://x.no/?token=A1b9XkQ2mZ7pLr4TnW8v"',
    "u = 'https://x.no/?f=json&api_key=A1b9XkQ2mZ7pLr4TnW8v&page=2'",
])
def test_a_key_in_a_query_string_is_found(text):
    """An unquoted key had to end its line or item (`,;#}]`), so one followed by the query's
    next field (`&`) or by the quote closing its URL was kept; a quoted URL was one value of
    its own name, which hid the query's `token=` inside it."""
    assert [(s.type, s.text) for s in detect_pii(text)] == [("KEY", "A1b9XkQ2mZ7pLr4TnW8v")]


@pytest.mark.parametrize("text", [
    "machine api.fjord.no login dagny77 password Fjord-Kite-58\n",
    "machine api.fjord.no\n    login dagny77\n    password Fjord-Kite-58\n",
    "default login dagny77 password Fjord-Kite-58",
])
def test_a_netrc_entry_is_a_login_and_password(text):
    """A .netrc file (curl's, git's, ftp's credentials) names login and password by words, with
    no `=` or `:`: no rule read it."""
    assert [(s.type, s.text) for s in detect_pii(text)] == [
        ("USERNAME", "dagny77"), ("PASSWORD", "Fjord-Kite-58")]
    assert detect_pii("machine learning login screen password protected") == []


@pytest.mark.parametrize("text, redacted", [
    ('machine api.fjord.no login dagny77 password "Fjord Kite 58" account x\n',
     'machine api.fjord.no login <USERNAME> password "<PASSWORD>" account x\n'),
    ('machine api.fjord.no login "dagny h" password Fjord-Kite-58\n',
     'machine api.fjord.no login "dagny h" password <PASSWORD>\n'),
    ('default login dagny77 password "a login \\"b9"\n',
     'default login <USERNAME> password "<PASSWORD>"\n'),
])
def test_a_netrc_value_may_be_quoted(text, redacted):
    """.netrc values may be quoted, with spaces and escapes (Python's netrc, curl). Read to the
    next space, a quoted password kept its words after the first, and a quoted login with a
    space ended the entry there, so the password after it was kept whole."""
    assert redact(text)[0] == redacted


def test_a_keyed_setting_names_its_value_in_another_attribute():
    """.NET appSettings (`<add key="DbPassword" value="PW" />`): the key names the value in
    another attribute, which no assignment rule read, so the password was kept."""
    text = '<add key="DbUser" value="dagny77" />\n<add key="DbPassword" value="Fjord-Kite-58" />\n'
    assert [(s.type, s.text) for s in detect_pii(text)] == [
        ("USERNAME", "dagny77"), ("PASSWORD", "Fjord-Kite-58")]
    for other in ('<add key="PasswordLength" value="12"/>', '<add key="Password" value="changeme"/>'):
        assert detect_pii(other) == [], other


@pytest.mark.parametrize("text, redacted", [
    ('PASSWORD="${DB_PASS:-Fjord-Kite-58}"', 'PASSWORD="${DB_PASS:-<PASSWORD>}"'),
    ("pw: ${DB_PASSWORD:-Fjord-Kite-58}", "pw: ${DB_PASSWORD:-<PASSWORD>}"),
    ("user: ${DB_USER:-dagny77}", "user: ${DB_USER:-<USERNAME>}"),
    ("password: ${DB_PASSWORD}", "password: ${DB_PASSWORD}"),  # a reference, no default
])
def test_a_shell_default_is_the_value_and_keeps_its_operator(text, redacted):
    """`${NAME:-default}`: the default is the password wherever NAME is unset. Read as
    `NAME: -default` the `-` went with it (`${DB_PASSWORD:<PASSWORD>}`, another operator), or
    with `${` taken for a reference the value was kept."""
    assert redact(text)[0] == redacted


@pytest.mark.parametrize("text, address", [
    ("mail dagny.holm [at] fjordmail [dot] no today", "dagny.holm [at] fjordmail [dot] no"),
    ("dagny.holm(at)fjordmail(dot)no", "dagny.holm(at)fjordmail(dot)no"),
    ("write to ola <at> uni-fjord <dot> edu", "ola <at> uni-fjord <dot> edu"),
    ("Send to dagny [AT] fjordmail.no", "dagny [AT] fjordmail.no"),
])
def test_an_address_written_to_dodge_scrapers_is_found(text, address):
    """Mailing-list archives and homepages write `name [at] host [dot] tld`: no `@`, so no
    rule saw a real address."""
    assert [(s.type, s.text) for s in detect_pii(text)] == [("EMAIL", address)]


@pytest.mark.parametrize("text", ["john [at] example [dot] com", "file (at) line (dot) col",
                                  "dagny AT fjordmail DOT no", "arr[at] = val[dot]"])
def test_brackets_and_words_that_only_look_like_an_address_are_not_one(text):
    assert detect_pii(text) == []


@pytest.mark.parametrize("text", ["über52.14.3.9", "адрес52.14.3.9", "a52.14.3.9", "x_52.14.3.9"])
def test_a_dotted_quad_inside_a_word_of_spaced_scripts_is_still_not_an_address(text):
    assert detect_pii(text) == []


@pytest.mark.parametrize("text", [
    "mkdir -p /srv && mysql -u dagny -p Fjord-Kite-58",
    "git pull && mysql -h db -u dagny -p Fjord-Kite-58",
    "cp a b; mysql -u dagny -p Fjord-Kite-58",
])
def test_a_flag_belongs_to_its_own_command_not_one_earlier_on_the_line(text):
    """`-p` / `-u` of mkdir, git or cp (preserve, parents, patch...) earlier on the line, in
    another command, made mysql's password and user flags theirs: both were kept."""
    assert [(s.type, s.text) for s in detect_pii(text)] == [
        ("USERNAME", "dagny"), ("PASSWORD", "Fjord-Kite-58")]
    for other in ("cp -p a b", "mkdir -p build/x", "git add -p src", "(cd x; python3 -u run.py)"):
        assert detect_pii(f"{text} && {other}") == detect_pii(text), other


@pytest.mark.parametrize("text, redacted", [
    ("sshpass -p Xk3pq9z; ssh host", "sshpass -p <PASSWORD>; ssh host"),
    ("mysql -u dagny -p Fjord-Kite-58;ls", "mysql -u <USERNAME> -p <PASSWORD>;ls"),
    ("mysql -u dagny -pFjord-Kite-58; ls", "mysql -u <USERNAME> -p<PASSWORD>; ls"),
    ("sshpass -p 'Xk3;pq9z'; ssh host", "sshpass -p '<PASSWORD>'; ssh host"),  # quoted: its own
])
def test_an_unquoted_flag_value_ends_where_the_shell_command_does(text, redacted):
    """The shell ends a command at an unquoted `;`: taken into the password, it was redacted
    with it and the script lost its separator."""
    assert redact(text)[0] == redacted


@pytest.mark.parametrize("text, redacted", [
    ('sshpass -p"Xk3pq9z" ssh dagny@host', 'sshpass -p"<PASSWORD>" ssh <USERNAME>@host'),
    ("sshpass -p'Xk3pq9z' ssh host", "sshpass -p'<PASSWORD>' ssh host"),
    ("sshpass -v -pXk3pq9z ssh host", "sshpass -v -p<PASSWORD> ssh host"),
    ("redis-cli -a Xk3pq9z ping", "redis-cli -a <PASSWORD> ping"),
    ('redis-cli -h cache -p 6379 -a "Xk3pq9z" --no-auth-warning', 'redis-cli -h cache -p 6379 -a "<PASSWORD>" --no-auth-warning'),
    ("SSHPASS=Xk3pq9z sshpass -e ssh host", "SSHPASS=<PASSWORD> sshpass -e ssh host"),
    ("REDISCLI_AUTH=Xk3pq9z redis-cli ping", "REDISCLI_AUTH=<PASSWORD> redis-cli ping"),
    # already found before: kept so
    ("sshpass -p Xk3pq9z ssh host", "sshpass -p <PASSWORD> ssh host"),
    ("mysql -pXk3pq9z shop", "mysql -p<PASSWORD> shop"),
    ("mysql --password=Xk3pq9z shop", "mysql --password=<PASSWORD> shop"),
    ("PGPASSWORD=Xk3pq9z psql -h db", "PGPASSWORD=<PASSWORD> psql -h db"),
    ("docker compose exec db mysql -u dagny -p Xk3pq9z", "docker compose exec db mysql -u <USERNAME> -p <PASSWORD>"),
    ("docker login -u dagny -p Xk3pq9z", "docker login -u <USERNAME> -p <PASSWORD>"),
])
def test_command_line_passwords_of_sshpass_and_redis_cli_are_found(text, redacted):
    """sshpass's password written onto its flag (`-p"PW"`, `-pPW`), redis-cli's `-a PW` and the
    variables the two read it from (SSHPASS, REDISCLI_AUTH) were kept."""
    assert redact(text)[0] == redacted


@pytest.mark.parametrize("text", [
    "ssh -p 22 host", "ssh -p2222 host", "docker run -p 8080:80 nginx", "docker run -p 8080:80/tcp nginx",
    "podman run -p 8443:443/udp img", "mkdir -p build/out", "nmap -p 1-1000 host", "pytest -p no:cacheprovider tests",
    "python -m pytest -q -p no:randomly", "npx -p typescript tsc", "docker compose -f a.yml -p staging up -d",
    "docker-compose -p myproject up", "sshpass -f pwfile ssh -p2222 host", "ls -a build", "tar -p -a x",
    "redis-cli -p 6379 ping", "redis-cli -a $REDIS_PASSWORD ping", "the redis-cli -a flag", "sshpass -p $PASS ssh host",
    "sshpass: a noninteractive ssh password provider",
])
def test_flags_that_are_ports_plugins_or_projects_are_no_passwords(text):
    """A `-p` port with its protocol (`8080:80/tcp`), a port range, pytest's plugin, npx's
    package and compose's project were taken for passwords; other commands' `-a` and `-p`
    are not sshpass's or redis-cli's."""
    assert detect_pii(text) == []


@pytest.mark.parametrize("text, redacted", [
    ('["mysql -u dagny -pXk3pq9z"]', '["mysql -u <USERNAME> -p<PASSWORD>"]'),
    ('{"cmd": "redis-cli -a Xk3pq9z"}', '{"cmd": "redis-cli -a <PASSWORD>"}'),
    ('["sshpass -pXk3pq9z"]', '["sshpass -p<PASSWORD>"]'),
    ('["redis-cli ping", "ls -a build"]', '["redis-cli ping", "ls -a build"]'),
    ("Start redis-cli, then run docker ps -a containers", "Start redis-cli, then run docker ps -a containers"),
    ("redis-cli -h cache ping  # ls -a backups", "redis-cli -h cache ping  # ls -a backups"),
    ("redis-cli -h cache -p 6379 -n 2 --no-auth-warning -a Xk3pq9z", "redis-cli -h cache -p 6379 -n 2 --no-auth-warning -a <PASSWORD>"),
    ("sshpass -P assword: -pXk3pq9z ssh host", "sshpass -P assword: -p<PASSWORD> ssh host"),
    ("sshpass -d 3 -pXk3pq9z ssh host", "sshpass -d 3 -p<PASSWORD> ssh host"),
])
def test_an_inline_flag_password_stays_within_its_command_and_string(text, redacted):
    """An unquoted inline password ran to the next space: in a JSON string the closing `"]`
    went with it (the document's JSON broken). redis-cli's `-a` was looked for to the line's
    end, so another command's (`ls -a build` in the next string, after a comma, in a comment)
    was taken for its password. sshpass's `-P prompt` / `-d fd` took their word for the
    command it runs, so a `-pPW` after them was missed."""
    assert redact(text)[0] == redacted
