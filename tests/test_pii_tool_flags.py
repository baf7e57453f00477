"""Passwords given to a tool on its own flag or config line (redis-server, zip, 7z, openssl,
curl), quoted arguments with spaces inside a redis-cli command, and mysql's `-p` before a
database name (it prompts: the word after it is no password)."""

from __future__ import annotations

import pytest

from kiln.data.pii import redact
from kiln.data.pii.detect import detect_pii


@pytest.mark.parametrize("text, redacted", [
    ("redis-server --requirepass Xk3pq9z", "redis-server --requirepass <PASSWORD>"),
    ("redis-server --port 6380 --requirepass 'Xk3 pq9z' --appendonly yes",
     "redis-server --port 6380 --requirepass '<PASSWORD>' --appendonly yes"),
    ('command: ["redis-server", "--requirepass", "Xk3pq9z"]',
     'command: ["redis-server", "--requirepass", "<PASSWORD>"]'),
    ("bind 127.0.0.1\nrequirepass Xk3pq9z\nport 6379", "bind 127.0.0.1\nrequirepass <PASSWORD>\nport 6379"),
    ("masterauth Fjord-Kite-58", "masterauth <PASSWORD>"),
    ("masterauth Fjord-Kite-58  \r\nport 6379", "masterauth <PASSWORD>  \r\nport 6379"),
    ('requirepass "Fjord Kite 58"', 'requirepass "<PASSWORD>"'),
    ("# requirepass Xk3pq9z", "# requirepass <PASSWORD>"),  # commented out, still written down
    ("redis-cli CONFIG SET requirepass Xk3pq9z", "redis-cli CONFIG SET requirepass <PASSWORD>"),
    ("zip -P Xk3pq9z secret.zip notes.txt", "zip -P <PASSWORD> secret.zip notes.txt"),
    ("zip -r -P Fjord-Kite-58 out.zip dir/", "zip -r -P <PASSWORD> out.zip dir/"),
    ("zip -rP Xk3pq9z out.zip dir", "zip -rP <PASSWORD> out.zip dir"),
    ("unzip -P Xk3pq9z secret.zip", "unzip -P <PASSWORD> secret.zip"),
    ("7z a -pXk3pq9z -mhe=on out.7z dir", "7z a -p<PASSWORD> -mhe=on out.7z dir"),
    ("7z x -pXk3pq9z out.7z", "7z x -p<PASSWORD> out.7z"),
    ('7z -p"Xk3 pq9z" x out.7z', '7z -p"<PASSWORD>" x out.7z'),
    ("7za a -pFjord-Kite-58 b.7z f", "7za a -p<PASSWORD> b.7z f"),
    ("openssl enc -aes-256-cbc -in a -out b -pass pass:Xk3pq9z",
     "openssl enc -aes-256-cbc -in a -out b -pass pass:<PASSWORD>"),
    ("openssl rsa -in k.pem -passin pass:Xk3pq9z -passout 'pass:Fjord Kite 58'",
     "openssl rsa -in k.pem -passin pass:<PASSWORD> -passout 'pass:<PASSWORD>'"),
    ("openssl pkcs12 -export -in c.pem -out c.p12 -password pass:Xk3pq9z",
     "openssl pkcs12 -export -in c.pem -out c.p12 -password pass:<PASSWORD>"),
    ("openssl enc -aes-256-cbc -salt -in a.txt -out a.enc -k Xk3pq9z",
     "openssl enc -aes-256-cbc -salt -in a.txt -out a.enc -k <PASSWORD>"),
    ("curl -u dagny77:Xk3pq9z https://api.fjord.no", "curl -u <USERNAME>:<PASSWORD> https://api.fjord.no"),
    ("curl --user dagny77:Fjord-Kite-58 https://x.no", "curl --user <USERNAME>:<PASSWORD> https://x.no"),
    ("curl -s -X POST -u 'dagny77:Xk3 pq9z' https://x.no", "curl -s -X POST -u '<USERNAME>:<PASSWORD>' https://x.no"),
    ("curl -udagny77:Xk3pq9z https://x.no", "curl -u<USERNAME>:<PASSWORD> https://x.no"),
    # the first `u` of a group takes the rest (the last one did: `-ubruno77` kept `bru`)
    ("curl -ubruno77:Xk3pq9z https://x.no", "curl -u<USERNAME>:<PASSWORD> https://x.no"),
    ("curl -sSfuruth.dunn:Xk3pq9z https://x.no", "curl -sSfu<USERNAME>:<PASSWORD> https://x.no"),
    ("curl -u admin:Xk3pq9z https://x.no", "curl -u admin:<PASSWORD> https://x.no"),  # a service account
    ('["curl -u dagny77:Xk3pq9z https://x.no"]', '["curl -u <USERNAME>:<PASSWORD> https://x.no"]'),
])
def test_passwords_on_a_tools_own_flag_are_found(text, redacted):
    """redis-server's `--requirepass` (and redis.conf's line), zip's `-P`, 7z's `-pPW`,
    openssl's `-pass pass:PW` / `-k PW` and curl's `-u user:PW` were all kept."""
    assert redact(text)[0] == redacted


@pytest.mark.parametrize("text", [
    "Use zip -P to set a password on the archive", "the zip -P option is insecure", "zip -e out.zip f",
    "gzip -P x", "7z a -p out.7z dir", "7z -p", "use 7z with -p to encrypt", "7z a -p -mhe=on out.7z dir",
    "openssl enc -aes-256-cbc -pass env:ARCHIVE_PASS -in a", "openssl rsa -passin file:/run/keypass -in k",
    "openssl rsa -passin fd:3 -in k", "openssl rsa -passin stdin -in k", "openssl enc -kfile pw.txt -in a",
    "openssl enc -pass pass:$PASS -in a", "curl -k https://x.no", "curl -u dagny77 https://x.no -k x",
    "curl -u : --negotiate https://x.no", "curl -u \"$USER:$PASS\" https://x.no", "curl -u user:pass https://x.no",
    "docker run -u 1000:1000 img", "docker exec --user root:root c sh",
    "requirepass foobared", "# requirepass foobared", "# masterauth <master-password>",
    "set requirepass in redis.conf", "requirepass is deprecated since Redis 6",
    # a comment's sentence that starts with the directive (its word after it was the password)
    "requirepass must be set when protected mode is off", "# masterauth should match the master's password",
    "# requirepass enables AUTH for every client\r\n",
    "redis-server --requirepass $REDIS_PASSWORD", "ssh -k host", "grep -k x", "zip -P $1 a.zip",
    "redis-cli -a $1 ping",  # a script's argument (was taken for a password)
    # `-p` of these takes no password: unzip's pipes, curl's tunnels (they were taken for one)
    "unzip -p backup2024.zip notes.txt", "curl -p https://x.no",
])
def test_near_misses_of_tool_passwords_are_none(text):
    """Prose about a flag, a flag that prompts (`zip -e`, `7z -p` alone, `curl -u user`), an
    openssl password source that is no password (`env:`, `file:`, `fd:`, `stdin`), other
    commands' `-k` / `-u user:group`, references, redis.conf's stock `foobared`, and a comment's
    sentence starting with the directive (a config line ends after its value). `7z a -p
    out.7z`, `unzip -p a.zip` and `curl -p URL` had the word after `-p` taken for a password."""
    assert [s for s in detect_pii(text) if s.type == "PASSWORD"] == [], text
    if not text.startswith("curl -u dagny77 "):  # `-u user` alone: a user, asked for a password
        assert detect_pii(text) == [], text


@pytest.mark.parametrize("text, redacted", [
    ('redis-cli -h "my host" -a Xk3pq9z ping', 'redis-cli -h "my host" -a <PASSWORD> ping'),
    ("redis-cli -h 'cache one' -p 6379 -a Xk3pq9z", "redis-cli -h 'cache one' -p 6379 -a <PASSWORD>"),
])
def test_a_quoted_argument_with_a_space_does_not_end_a_redis_cli_command(text, redacted):
    """A quoted argument was read only without spaces inside, so `"my host"` ended the scan
    for `-a` and the password after it was kept."""
    assert redact(text)[0] == redacted


@pytest.mark.parametrize("text, redacted", [
    ("mysql -u dagny -p mydb", "mysql -u <USERNAME> -p mydb"),
    ("mysql -u dagny -p shop_prod < dump.sql", "mysql -u <USERNAME> -p shop_prod < dump.sql"),
    ("mysqldump -u dagny -p wordpress > wp.sql", "mysqldump -u <USERNAME> -p wordpress > wp.sql"),
    ("mysql -h db -u dagny -p AdventureWorks", "mysql -h db -u <USERNAME> -p AdventureWorks"),
    ("mysqladmin -u dagny -p status", "mysqladmin -u <USERNAME> -p status"),
    # a word no database is named like: the password, written where mysql reads none
    ("mysql -u dagny -p Xk3pq9z mydb", "mysql -u <USERNAME> -p <PASSWORD> mydb"),
    ("mysql -u dagny -p Fjord-Kite-58", "mysql -u <USERNAME> -p <PASSWORD>"),
    ("mysql -u dagny -pmydb", "mysql -u <USERNAME> -p<PASSWORD>"),  # attached: mysql's password
    ("sshpass -p mydbpw77 ssh host", "sshpass -p <PASSWORD> ssh host"),  # not mysql's `-p`
])
def test_mysqls_spaced_p_prompts_and_the_next_word_is_its_database(text, redacted):
    """With a space after `-p`, mysql prompts for the password and reads the next word as the
    database: `mysql -u x -p mydb` had `mydb` redacted as a password."""
    assert redact(text)[0] == redacted


@pytest.mark.parametrize("text, redacted", [
    ("mysql -u dagny -p s3cr3t99 shop < dump.sql", "mysql -u <USERNAME> -p <PASSWORD> shop < dump.sql"),
    ("mysql -u dagny -p fjordkite shop", "mysql -u <USERNAME> -p <PASSWORD> shop"),
    ("mysql -u dagny -p fjordkite shop -e 'select 1'", "mysql -u <USERNAME> -p <PASSWORD> shop -e 'select 1'"),
    # one word after `-p`, or a database then redirections or more prose: the database
    ("mysql -u dagny -p shop 2>&1", "mysql -u <USERNAME> -p shop 2>&1"),
    ("run mysql -u dagny -p shop and enter the password", "run mysql -u <USERNAME> -p shop and enter the password"),
    ("mysqldump -u dagny -p shop orders > o.sql", "mysqldump -u <USERNAME> -p shop orders > o.sql"),
    ("mysqladmin -u dagny -p create shop", "mysqladmin -u <USERNAME> -p create shop"),
])
def test_a_database_name_like_word_before_mysqls_database_is_its_password(text, redacted):
    """mysql reads one database: in `mysql -p WORD db` the writer meant WORD for the password,
    and a lowercase one (`s3cr3t99`) was kept for looking like a database name. mysqldump's
    tables and mysqladmin's commands follow their `-p` word, and a sentence goes on past it."""
    assert redact(text)[0] == redacted
