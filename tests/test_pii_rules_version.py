"""The PII rules' version (recorded in a prepare's signature, so a resume never mixes the
redactions of two rule sets) is pinned to what the rules redact: a change to the rules that
changes a redaction of the labelled corpus fails here until PII_RULES is bumped."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kiln.data.pii import redact
from kiln.data.pii.rules_version import PII_RULES

LABELLED = Path(__file__).parent / "fixtures" / "pii" / "labelled.jsonl"
# texts the rules of PII_RULES changed, beside the corpus
CHANGED = ['{"sample":1,"users":["dagny.holm@fjordmail.no","ola.nord@fjordmail.no"]}',
           "请使用Bearer kR8mX2qLk9Vz4Tn7Wb1Yc5Hd3认证", "邮箱：张伟@fjordmail.cn 谢谢",
           "sshpass -p Xk3pq9z; ssh host", "Authorization: Basic ZGFnbnk6RmpvcmQtS2l0ZS01OA==",
           "Please send the sample to dagny.holm@fjordmail.no today", "关注@dagny_holm获取更多",
           "运行mysql -u dagny -pFjord-Kite-58 即可", "主页/home/dagny77/x",
           'curl -d "username=dagny77&password=Fjord-Kite-58" https://x.no',
           'url = "https://x.no/?token=A1b9XkQ2mZ7pLr4TnW8v&page=2"',
           "machine api.fjord.no login dagny77 password Fjord-Kite-58",
           'machine api.fjord.no login "dagny h" password "Fjord Kite 58"',
           '<add key="DbPassword" value="Fjord-Kite-58" />', "pw: ${DB_PASSWORD:-Fjord-Kite-58}",
           "mail dagny.holm [at] fjordmail [dot] no today",
           "Example usage:\r\n\r\nauth(user='klem', passwd='geheim$parole')\r\n",
           'sshpass -p"Xk3pq9z" ssh host', "redis-cli -a Xk3pq9z ping", "SSHPASS=Xk3pq9z sshpass -e ssh host",
           "pytest -p no:cacheprovider tests", "docker run -p 8080:80/tcp nginx",
           '["mysql -u dagny -pXk3pq9z"]', '["redis-cli ping", "ls -a build"]',
           "sshpass -P assword: -pXk3pq9z ssh host",
           "redis-server --requirepass Xk3pq9z", "requirepass Xk3pq9z", "zip -P Xk3pq9z a.zip f",
           "7z a -pXk3pq9z a.7z f", "openssl rsa -passin pass:Xk3pq9z -in k", "openssl enc -k Xk3pq9z -in a",
           "curl -u dagny77:Xk3pq9z https://x.no", 'redis-cli -h "my host" -a Xk3pq9z ping',
           "mysql -u dagny -p mydb", "7z a -p a.7z f", "unzip -p a.zip f", "redis-cli -a $1 ping",
           "curl -ubruno77:Xk3pq9z https://x.no", "mysql -u dagny -p s3cr3t99 shop < dump.sql",
           "# masterauth should match the master's password"]
PINNED = ("2026-12-08.4", "54ad5f2596222298")  # the version and its redactions' digest


def _redactions_digest() -> str:
    texts = [json.loads(line)["text"] for line in LABELLED.read_text(encoding="utf-8").splitlines()
             if line.strip()]
    out = [redact(t)[0] for t in [*texts, *CHANGED]]
    return hashlib.sha256(json.dumps(out, ensure_ascii=False).encode()).hexdigest()[:16]


def test_the_rules_version_names_what_the_rules_redact():
    """Fails on a rule change that redacts otherwise: bump PII_RULES (a prepare made under
    the old rules is then made again, not resumed) and pin it with the new digest."""
    digest = _redactions_digest()
    assert (PII_RULES, digest) == PINNED, (
        f"the PII rules redact otherwise than under {PII_RULES}: bump PII_RULES in "
        f"kiln/data/pii/rules_version.py and pin it here with {digest}")
