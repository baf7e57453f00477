"""Where a command-line tool takes a password on a flag of its own: redis-server's
`--requirepass` (and redis.conf's line), zip's `-P PW`, 7z's `-pPW`, openssl's `-pass pass:PW`
and `-k PW`, curl's `-u user:PW`; and the pieces of a command's arguments the credential
rules share.

A tool's own flag is looked for among that tool's arguments only (a bounded number of words
after its name, none ending the command or a string): `-k` is openssl's password but curl's
"insecure", `-u 1000:1000` is docker's uid:gid. Flags that prompt (`zip -e`, `7z -p` alone,
`curl -u user`) and openssl's other password sources (`env:`, `file:`, `fd:`, `stdin`) name no
secret. The values are candidates: `credentials` drops references and placeholders.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# A keyword's start: not after an ASCII letter, digit or `_`. Not `\b`: CJK text runs into
# the word ("运行mysql -pPW", "主页/home/dagny"), and its letters are `\w`, so `\b` found no edge
ASCII_START = r"(?<![A-Za-z0-9_])"
# an unquoted value ends at `;` (the shell ends the command there) and at a quote: in a JSON
# string (`["mysql -pPW"]`) the `"]` after it was taken into the password and redacted with it
FLAG_VALUE = r"(?:(?P<q>[\"'])(?P<qv>[^\"'\n]+)(?P=q)|(?P<v>[^\s\"';-][^\s\"';]*))"
# one argument of a command: a word that ends neither the command (`;`, `&`, `|`, `#`) nor a
# string (`"`, `,`: `["redis-cli ping", "ls -a build"]`), or a quoted one, spaces and all
# (`-h "my host"`: read without spaces, it ended the scan). A quoted one is bounded, as the
# argument count is: unbounded, each command name scanned the rest of its line, O(len^2)
COMMAND_ARG = r"(?:[^\s\"'`,;&|#]+|\"[^\"\n]{0,256}\"|'[^'\n]{0,256}')"
MAX_ARGS = 16


def tool_flag(names: str, flag: str) -> re.Pattern[str]:
    """`flag` among the first MAX_ARGS arguments of a command named by `names`."""
    return re.compile(rf"{ASCII_START}(?:{names})(?![A-Za-z0-9_-])(?:[ \t]+{COMMAND_ARG}){{0,{MAX_ARGS}}}?"
                      rf"[ \t]+{flag}")


# `--requirepass PW` (`"--requirepass", "PW"` in a compose or manifest list) and
# `CONFIG SET requirepass PW`; masterauth is the password a replica gives its master
REDIS_AUTH = re.compile(
    rf"(?:{ASCII_START}(?i:config)[ \t]+(?i:set)[ \t]+|(?<![\w-])--)"
    rf"(?:requirepass|masterauth)(?:[ \t]+|=|[\"'][ \t]*,[ \t]*){FLAG_VALUE}")
# a redis.conf line (commented out too: the stock file's `# requirepass foobared` is a
# placeholder); the value ends the line (redis.conf has no trailing comments): a comment's
# sentence "# masterauth should match ..." had its second word taken for the password
REDIS_CONF = re.compile(rf"^[ \t]*(?:#[ \t]*)?(?:requirepass|masterauth)[ \t]+{FLAG_VALUE}[ \t\r]*$", re.MULTILINE)
# zip's and unzip's `-P PW` (alone or last of a group: `-rP PW`); `-e` prompts
ZIP_PASSWORD = tool_flag("zip|unzip", rf"-[A-Za-z]*P[ \t]+{FLAG_VALUE}")
# 7z's password is written onto its `-p`; `-p` alone prompts
SEVEN_ZIP_PASSWORD = tool_flag(r"7z[ar]?", rf"-p{FLAG_VALUE}")
# openssl's password argument `pass:PW` (`env:`, `file:`, `fd:`, `stdin` name where it is read)
OPENSSL_PASS = re.compile(r"(?<![\w-])-pass(?:in|out|word)?[ \t]+"
                          r"(?:(?P<q>[\"'])pass:(?P<qv>[^\"'\n]+)(?P=q)|pass:(?P<v>[^\s\"';]+))")
# `openssl enc -k PW` (elsewhere `-k` is curl's "insecure", ssh's no-delegation ...)
OPENSSL_K = tool_flag("openssl", rf"-k[ \t]+{FLAG_VALUE}")
# curl's `-u user:PW` / `--user user:PW` (`-U` / `--proxy-user` the proxy's); curl splits at
# the first `:`, and without one it prompts for the password. In a group (`-su user:PW`) the
# first `u`/`U` takes the rest: letters before it any letters, each `u` of `curl -uuu...` was
# tried as the flag and the rest read to its end each time, O(len^2)
CURL_USER = tool_flag("curl", r"(?:-[A-TV-Za-tv-z]*[uU][ \t]*|--(?:proxy-)?user(?:[ \t]+|=))"
                          r"(?:(?P<q>[\"'])(?P<qu>[^\"'\n:]*):(?P<qv>[^\"'\n]+)(?P=q)"
                          r"|(?P<u>[^\s\"';:-][^\s\"';:]*)?:(?P<v>[^\s\"';]+))")
TOOL_PASSWORDS = (REDIS_AUTH, REDIS_CONF, ZIP_PASSWORD, SEVEN_ZIP_PASSWORD, OPENSSL_PASS, OPENSSL_K, CURL_USER)


def curl_users(text: str) -> Iterator[tuple[str, int]]:
    """(the user of each curl `-u user:PW`, where it starts); its password is a TOOL_PASSWORDS
    match's."""
    for m in CURL_USER.finditer(text):
        group = "qu" if m.group("q") else "u"
        if m.group(group):
            yield m.group(group), m.start(group)
