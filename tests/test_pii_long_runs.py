"""PII detection stays linear on long runs without spaces (base64 blobs, hex dumps, minified
code, `a_b_c_...`, dotted numbers): every detector's regex once scanned such a run to its end
from every start inside it, so 100 KB took minutes."""

import base64
import json
import random

from linear_time import assert_linear

from kiln.data.pii import redact
from kiln.data.pii.detect import detect_pii


def _runs(size: int) -> dict[str, str]:
    rng = random.Random(0)
    return {
        "base64": base64.b64encode(rng.randbytes(size * 3 // 4)).decode(),
        "letters": "a" * size,
        "hex": rng.randbytes(size // 2).hex(),
        "snake": "a_" * (size // 2),
        "dotted_words": "a." * (size // 2),
        "dotted_numbers": ".".join(str(rng.randint(0, 999)) for _ in range(size // 4)),
    }


def test_detectors_are_linear_on_long_runs_without_spaces():
    for kind in _runs(8):
        assert_linear(detect_pii, lambda size, kind=kind: _runs(size)[kind], 12_500, kind)
    for kind, run in _runs(100_000).items():
        assert detect_pii(run) == [], kind
        # the same run inside real text: what is around it is still found
        text = f"mail dagny.holm@fjordmail.no\n{run}\npassword = 'Fjord-Kite-58'\n"
        assert {s.type for s in detect_pii(text)} == {"EMAIL", "PASSWORD"}, kind


def _found(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v}


def test_bounded_prefixes_keep_long_keys_and_schemes():
    """A key prefix or URL scheme past the bound is still matched, from a later start."""
    long_key = "MY_" + "VERY_" * 20 + "DB_PASSWORD"  # a prefix of 100+ characters
    out, counts = redact(f"{long_key}=Tr0ub4dor&3x\n")
    assert _found(counts) == {"PASSWORD": 1} and out == f"{long_key}=<PASSWORD>\n"
    _, counts = redact("see postgresql+psycopg2://dagny.holm:Fjord-Kite-58@db.fjord.no/x")
    assert _found(counts) == {"USERNAME": 1, "PASSWORD": 1}, counts
    local = "x" * 100 + "@fjordmail.no"  # an address's local part past the reach before `@`
    assert [s.type for s in detect_pii(f"to {local} today")] == ["EMAIL"]


def _log(lines: int, kind: str) -> str:
    """A log or config dump of `lines` lines, one PII value each."""
    rng = random.Random(lines)
    rows = {
        "ip": lambda i: f"GET /a from {rng.randint(11, 99)}.{rng.randint(1, 250)}.9.{i % 250 + 1} 200",
        "ip_alone": lambda i: f"{rng.randint(11, 99)}.{rng.randint(1, 250)}.9.{i % 250 + 1}",
        "email": lambda i: f"mail from dagny{i}.h@fjordmail{i % 50}.no delivered",
        "username": lambda i: f"user = 'dagny{i}'",
        "cli": lambda i: f"mysql -u dagny{i} -p Tr0ub{i}dor",
    }[kind]
    return "\n".join(rows(i) for i in range(lines))


def test_many_values_in_one_document_stay_linear():
    """Each value looked at the whole document (the lines above it split, the text before it
    copied or searched, the document searched for the same value as a key or a version):
    O(len) a value, so a few MB of log with an address a line took minutes."""
    for kind in ("ip", "ip_alone", "email", "username", "cli"):
        assert len(detect_pii(_log(50, kind))) >= 50, kind
        assert_linear(detect_pii, lambda size, kind=kind: _log(size, kind), 1_000, kind)


def _one_line(records: int, key: str) -> str:
    """Minified JSON: every record on one line."""
    values = {"mail": lambda i: f"dagny{i}.h@fjordmail{i % 50}.no",
              "ip": lambda i: f"{11 + i % 80}.{1 + i % 240}.9.{i % 250 + 1}",
              "password": lambda i: f"Tr0ub{i}dor&3x",
              "command": lambda i: f"mysql -u dagny{i} -p Tr0ub{i}dor; ls",
              "redis": lambda i: f"redis-cli -a Tr0ub{i}dor ping; sshpass -pXk{i}pq9z ls"}[key]
    return json.dumps([{"id": i, key: values(i)} for i in range(records)])


def test_many_values_on_one_line_stay_linear():
    """The example-marker and version rules read the value's whole line, once a value: a
    one-line JSON of 8000 emails took 56 s, of 8000 addresses 57 s; the command of a `-p`
    flag and mysql's inline `-pPW` read to the line's end: 8000 mysql commands took 90 s."""
    for key in ("mail", "ip", "password", "command", "redis"):
        assert len(detect_pii(_one_line(50, key))) == 50 * (1 + (key in ("command", "redis"))), key
        assert_linear(detect_pii, lambda size, key=key: _one_line(size, key), 1_000, key)


def test_many_ssh_commands_without_a_user_on_one_line_stay_linear():
    """Each `ssh` looked for its user@ to the line's end: a one-line document of 2000 `ssh host`
    commands with none took 2.8 s, 16x the time of 500."""
    assert detect_pii(json.dumps(["ssh -o BatchMode=yes -i ~/.ssh/id -p 2222 dagny77@host"] * 3)) != []
    assert_linear(detect_pii, lambda size: json.dumps([f"ssh h{i} uptime" for i in range(size)]), 1_000, "ssh")


def test_many_commands_on_one_line_without_a_separator_stay_linear():
    """Each `redis-cli` / `mysql` with no password flag looked for one to the line's end, and
    each `-p` flag read its command back to the line's start: a one-line JSON list of
    100,000 characters of such commands (no `;`, `&`, `|` between them) took 13 s of
    `redis-cli -h h ping`, 19 s of `mysql -h db`, 200 s of `x -p`; linear now (0.1-1.2 s)."""
    assert detect_pii(json.dumps(["redis-cli -h h -a Xk3pq9z ping", "psql -h h -p Xk3pq9z"])) != []
    for what, command in (("redis", "redis-cli -h h ping"), ("mysql", "mysql -h db"),
                          ("-p", "psql -h h -p 5432")):
        assert_linear(detect_pii, lambda size, c=command: json.dumps([c] * size), 500, what)


def test_many_tool_commands_on_one_line_stay_linear():
    """zip's `-P`, 7z's `-p`, openssl's `-k`, curl's `-u` and redis-cli's `-a` are looked for
    among a bounded number of their command's arguments, a quoted one (spaces inside) bounded
    too: unbounded, each command name with no such flag scanned the rest of its line."""
    commands = {"zip": "zip -r out.zip 'my dir'", "7z": "7z a -p out.7z 'my dir'",
                "openssl": "openssl enc -in 'a b' -out c", "curl": "curl -s -u dagny 'https://x.no/a b'",
                "redis": "redis-cli -h 'my host' ping", "quote": "redis-cli 'my host"}
    assert detect_pii("zip -P Xk3pq9z a.zip f; curl -u dagny77:Xk3pq9z https://x.no") != []
    for what, command in commands.items():
        assert_linear(detect_pii, lambda size, c=command: " ".join([c] * size), 500, what)


def test_a_long_curl_option_group_stays_linear():
    """curl's `-u` may end a group of short options (`-su user:PW`); with the letters before it
    read as any letters, each `u` of a long group was tried as the flag, and the rest of the
    group read to its end each time: `curl -uuu...` took O(len^2)."""
    for letters in ("u", "Uu", "su"):
        assert_linear(detect_pii, lambda size, c=letters: "curl -" + c * (size // len(c)), 2_000, letters)
    assert [s.type for s in detect_pii("curl -su dagny77:Xk3pq9z https://x.no")] == ["USERNAME", "PASSWORD"]
