"""Password and username detection from context: assignments in code/config, CLI flags, URLs with
`user:pass@`, SSH targets, home directories and @handles.

A value is only PII when it is a literal a person chose. References (`${DB_PASS}`,
`os.environ[...]`, `request.form["password"]`), type annotations (`password: string`), empty or
masked values (`****`) and the obvious placeholders the paper's realness check removes
(`password123`, `changeme`, `<password>`) are not. Generic system/service accounts (root, admin,
postgres, git, ubuntu …) identify no one, so they are not usernames.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from functools import lru_cache

from kiln.data.pii.network import CJK_LETTERS
from kiln.data.pii.spans import Span
from kiln.data.pii.tool_flags import ASCII_START, FLAG_VALUE, TOOL_PASSWORDS, curl_users, tool_flag

NON_VALUES = frozenset(
    "none null nil true false undefined string str int bool number any object optional text "
    "varchar char required optional self this new return yes no on off default empty blank "
    "unknown secret password passwd pwd pass username user login name value input field "
    # Python keywords: `if not uid: continue`
    "continue break raise yield else elif try except finally await async lambda del global "
    "nonlocal assert import from with while for if not and or is in".split())
PLACEHOLDER_PASSWORDS = frozenset(
    "password password1 password123 passw0rd p@ssw0rd p@ssword changeme changeit secret "
    "123456 12345678 123456789 1234 qwerty letmein test test123 testing example dummy foo bar "
    "foobar hunter2 admin admin123 root toor mypassword yourpassword pass123 xxx xxxx xxxxxx "
    "xxxxxxxx pass abc123 s3cret foobared".split())  # foobared: redis.conf's stock requirepass
SERVICE_ACCOUNTS = frozenset(
    "root admin administrator user username users guest test tester demo anonymous nobody daemon "
    "postgres postgresql mysql redis mongo mongodb git hg svn ubuntu debian centos ec2-user "
    "fedora www-data www apache nginx httpd jenkins runner vagrant docker deploy ci build "
    "shared public default sa system me you foo bar example sample app service api bot "
    "operator dev developer ftp mail sync oracle elastic kibana grafana hadoop spark "
    "yarn node npm pi home current ${user} $user".split())
# Words that follow "user" in prose but are not usernames ("the user name is", "User model").
_VALUE_CHARS = r"[^\s\"'`,;<>(){}\[\]]"
# (`$1`: a script's argument, `redis-cli -a "$1"`)
_REF = re.compile(r"^(?:\$\{|\$\(|\$[A-Z_][A-Z0-9_]*$|\$\d$|%\(|%[sd]$|\?$|\{|<|\[|:[a-z_]+$|@[a-z_]+$|"
                  r"os\.|env\b|process\.|getenv|settings\.|config\.|self\.|this\.|args\.|opts\.|"
                  r"options\.)")
# `request.user`, `cfg.db.password`: a dotted unquoted value starting with one of these is code.
CODE_OBJECTS = frozenset(
    "request req self this user users args opts options config cfg conf settings ctx context "
    "session os sys env process params data form kwargs current_user g app auth profile account "
    "props state credentials creds secrets db model obj item row record result response".split())
WEEKDAYS_MONTHS = frozenset(
    "mon tue wed thu fri sat sun jan feb mar apr may jun jul aug sep sept oct nov dec".split())
PLACEHOLDER_WORD = re.compile(r"your|example|sample|dummy|placeholder|changeme|fake|xxx|<|>",
                              re.IGNORECASE)
WEAK_PASSWORD = re.compile(
    r"(?:.*pass(?:word|wd)?.*|secret\d*|test\w*|admin\d*|qwerty\d*|letmein\d*|1234\d*|"
    r"abc\d*|root\d*|toor|guest\d*)", re.IGNORECASE)
PLACEHOLDER_USERS = frozenset(
    "alice bob carol charlie dave eve mallory john jane jdoe johndoe janedoe john.doe jane.doe "
    "john_doe jane_doe foo bar baz foobar".split())

# A key's prefix (`db_`, `POSTGRES_`) and a URL's scheme are bounded: unbounded, every start
# inside a long run of letters and `_` (a base64 blob, `a_b_c_...`) scanned the run to its end,
# O(len^2): 100 KB of such text took minutes. A longer prefix still matches, from a later start.
MAX_KEY_PREFIX = 64
# `SSHPASS=PW sshpass -e`, `REDISCLI_AUTH=PW redis-cli`: the variables those tools read the password from
PASSWORD_KEY = (rf"(?:[A-Za-z_]{{0,{MAX_KEY_PREFIX}}}[_.-])?(?:password|passwd|passphrase|pwd|pass|db_?pass|pgpassword|"
                r"sshpass|rediscli_auth)")
USER_KEY = (rf"(?:[A-Za-z_]{{0,{MAX_KEY_PREFIX}}}[_.-])?(?:user|username|user_?name|login|userid|user[_ ]?id|"
            r"account_?name|db_?user|pguser|uid)")


def _assignments(key: str) -> re.Pattern[str]:
    """`key = "v"`, `key: v`, `key => 'v'`, `"key": "v"`, `--key=v`, `KEY=v`, `<key>v</key>`."""
    return re.compile(
        rf"(?<![A-Za-z0-9])(?P<key>{key})(?![A-Za-z0-9])[\"']?[ \t]*(?P<op>:=|=>|==|=|:)[ \t]*"
        rf"(?:(?P<q>[\"'`])(?P<qv>[^\"'`\n]*?)(?P=q)|(?P<v>{_VALUE_CHARS}+))", re.IGNORECASE)


PASSWORD_ASSIGN = _assignments(PASSWORD_KEY)
USER_ASSIGN = _assignments(USER_KEY)
XML_VALUE = re.compile(rf"<(?P<tag>{PASSWORD_KEY}|{USER_KEY})>(?P<v>[^<\s]+)</(?P=tag)>",
                       re.IGNORECASE)
# a .netrc entry (`machine api.x.no login dagny password PW`, on one line or several): a
# line's first word `machine` or `default`, so prose ("machine learning login ...") is not.
# A value may be quoted, with spaces and backslash escapes (Python's netrc, curl): read as
# `\S+`, `password "Tr0ub 4dor"` kept ` 4dor"`, and a quoted login hid the fields after it
_NETRC_QUOTED = r'(?:[^"\\\n]|\\.)*'  # between the quotes
NETRC_ENTRY = re.compile(r"^[ \t]*(?:machine[ \t]+(?P<host>\S+)|default)(?P<body>(?:\s+(?:login|password|account|port)"
                         rf'[ \t]+(?:"{_NETRC_QUOTED}"|\S+)){{1,4}})', re.MULTILINE)
NETRC_FIELD = re.compile(r"\s+(?P<field>login|password|account|port)[ \t]+"
                         rf'(?:"(?P<qv>{_NETRC_QUOTED})"|(?P<v>\S+))')
# .NET appSettings and the like: `<add key="DbPassword" value="PW" />` (the key names the
# value, in another attribute)
KEYED_SETTING = re.compile(r"<add\s+key\s*=\s*([\"'])(?P<key>[\w.:-]{1,80})\1\s+value\s*=\s*"
                           r"([\"'])(?P<v>[^\"'<>\n]+)\3", re.IGNORECASE)
PASSWORD_NAME_END = re.compile(r"(?:password|passwd|pwd|passphrase)$", re.IGNORECASE)
USER_NAME_END = re.compile(r"(?:user|username|userid|user_?id|login)$", re.IGNORECASE)
# a shell or compose default: `${DB_PASSWORD:-PW}` is PW wherever the variable is unset (the
# assignment rules take `${` for a reference and read no further)
SHELL_DEFAULT = re.compile(r"\$\{(?P<key>[A-Za-z_][A-Za-z0-9_]{0,80}):?[-=](?P<v>[^}\s\"'$]+)\}")
SSH_CONFIG_USER = re.compile(r"^[ \t]*User[ \t]+(?P<user>\S+)[ \t]*$", re.MULTILINE)
# Prose: "your login is dagny.holm", "the temporary password is Fjord-Kite-58".
PROSE_USER = re.compile(rf"{ASCII_START}(?i:login|username|user name|user id)[ \t]+is[ \t]+"
                        r"(?P<user>[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])")
PROSE_PASSWORD = re.compile(rf"{ASCII_START}(?i:password|passphrase|passcode)[ \t]+is[ \t]+[\"'`]?"
                            r"(?P<pw>[^\s\"'`]*[^\s\"'`.,;)])")
# an unquoted value ends at `;`: the shell ends the command there (`-p Tr0ub4dor; ls`), and
# taken into the value the `;` was redacted with it
CLI_FLAG = re.compile(
    r"(?<=\s)(?P<flag>--?(?:password|passwd|pass|p|user|username|u|login))(?:[ =])"
    r"(?:(?P<q>[\"'])(?P<qv>[^\"'\n]+)(?P=q)|(?P<v>[^\s\"';-][^\s\"';]*))")
# how far a command's options reach from its name: read to the line's end, each command with
# no password flag scanned the rest of its line, O(len^2) on a one-line document of them
MAX_COMMAND = 256
# within the one command (up to `;`, `&`, `|`)
MYSQL_INLINE_PASSWORD = re.compile(
    rf"{ASCII_START}mysql(?:dump|admin)?(?![A-Za-z0-9_])[^\n;&|]{{0,{MAX_COMMAND}}}?\s-p{FLAG_VALUE}")
# sshpass's `-pPW` / `-p"PW"` (its `-p PW` is CLI_FLAG's), among its own options only: the
# command it runs has its own `-p` (`sshpass -f pw ssh -p2222 host`: a port)
# (`-P prompt`, `-d fd`, `-f file` take a word: `sshpass -P assword: -pPW` was missed)
SSHPASS_INLINE_PASSWORD = re.compile(
    rf"{ASCII_START}sshpass(?:[ \t]+-(?:[Pdf](?:[ \t]+[^\s-]\S*)?|[a-oq-zA-Z])\S*)*[ \t]+-p{FLAG_VALUE}")
# redis-cli's `-a PW` (auth); elsewhere `-a` is "all" (`ls -a`) and no password flag
# among its own arguments (`COMMAND_ARG`: "start redis-cli, then ps -a x", `# ls -a x`: not its)
REDIS_PASSWORD = tool_flag("redis-cli", rf"-a[ \t]+{FLAG_VALUE}")
# a `-p` value that is a port, a port range or a published port (`-p 8080:80/tcp`, `nmap -p 1-1000`)
PORT_VALUE = re.compile(r"[\d:.-]+(?:/(?:tcp|udp|sctp))?")
URL_CREDENTIALS = re.compile(
    r"[A-Za-z][A-Za-z0-9+.-]{0,31}://(?P<user>[A-Za-z0-9._~%!$&*+-]+)(?::(?P<pw>[^\s@/:]+))?@"
    r"(?=[A-Za-z0-9\[])")
# the user@ within 256 characters of the command: read to the line's end, each `ssh` with no
# user scanned the rest of its line, O(len^2) on a one-line document of them
SSH_TARGET = re.compile(
    rf"{ASCII_START}(?:ssh|scp|rsync|sftp|mosh)(?![A-Za-z0-9_])[^\n@]{{0,256}}?(?<![\w.-])(?P<user>[a-z_][a-z0-9_.-]{{1,31}})@"
    r"(?=[A-Za-z0-9\[])")
HOME_DIR = re.compile(
    r"(?:(?<![A-Za-z0-9_.])/home/|(?<![A-Za-z0-9_.])/Users/|[A-Za-z]:\\{1,2}Users\\{1,2}|(?<![A-Za-z0-9_.])/u/)"
    r"(?P<user>[A-Za-z0-9_][A-Za-z0-9._-]{0,31})(?=[/\\\s\"':]|$)", re.MULTILINE)
# CJK text runs into a handle without a space ("关注@dagny_holm获取更多"): its letters and
# punctuation are edges too, where `\w` (which CJK letters are) found none
_CJK_EDGE = f"{CJK_LETTERS}\u3000-\u303f\uff01-\uff65"
HANDLE = re.compile(f"(?:(?<=[\\s(\\[,{_CJK_EDGE}])|^)"
                    r"@(?P<user>[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,38}[A-Za-z0-9])?)"
                    f"(?![^\\W{_CJK_EDGE}]|[@/(-]|\\.\\w)",
                    re.MULTILINE)
# `@`-words that are decorators, doc tags, CSS at-rules or bots rather than people.
AT_KEYWORDS = frozenset(
    "param params return returns throws throw author see since deprecated override type typedef "
    "example link media import keyframes font-face charset supports include mixin extend "
    "interface end implementation property synthesize protocol selector staticmethod "
    "classmethod dataclass abstractmethod pytest fixture test before after beforeeach "
    "aftereach component injectable input output module app route get post put delete "
    "patch inject autowired bean service controller entity table column id value "
    "transactional nullable nonnull suppresswarnings functionalinterface safevarargs "
    "todo fixme note brief file class struct enum var const let function callback "
    "description summary version license copyright namespace package private public "
    "protected static inheritdoc internal ignore api apiparam apisuccess tag tags "
    "dependabot renovate github-actions codecov mergify stale-bot everyone here channel "
    "all team types vue angular babel nestjs storybook testing-library emotion mui material "
    "latest next beta alpha canary rc main master euro".split())


# A decorator or annotation: first on its line (after a doctest prompt), then its arguments
# and a comment at most.
# also a decorator line quoted inside a string literal (`'   @f2\\n'` in generated docs)
DECORATOR_LEAD = re.compile(r"[ \t]*(?:[rbuRBU]?[\"'][ \t]*)?(?:(?:>>>|\.\.\.)[ \t]+)?")
DECORATOR_TAIL = re.compile(
    r"(?:\([^\n]*\))?[ \t]*(?:(?:#|//)[^\n]*|(?:\\n)?[\"'][ \t]*,?[ \t]*)?(?:\n|$)")
DOC_TAG_LEAD = re.compile(r"[ \t]*(?:#+|\*+|//+|/\*\*?|\"{3}|'{3})[ \t]*")
PY_DECORATORS = frozenset(
    "wraps contextmanager asynccontextmanager cached_property lru_cache cache total_ordering "
    "singledispatch singledispatchmethod overload final abstractproperty unique runtime_checkable "
    "no_type_check coroutine setter getter deleter".split())
JAVA_ANNOTATIONS = frozenset(
    "NotNull Nullable NonNull Getter Setter Data Builder Value Slf4j Log4j2 ToString "
    "EqualsAndHashCode NoArgsConstructor AllArgsConstructor RequiredArgsConstructor Transient "
    "Deprecated Override SuppressWarnings FunctionalInterface SafeVarargs Test Before After "
    "BeforeEach AfterEach BeforeAll AfterAll Mock InjectMocks Spy Captor Autowired Component "
    "Service Repository Controller RestController RequestMapping GetMapping PostMapping "
    "PutMapping DeleteMapping PathVariable RequestParam RequestBody ResponseBody Bean "
    "Configuration Entity Table Column Id GeneratedValue OneToMany ManyToOne ManyToMany OneToOne "
    "JoinColumn Valid Size Min Max Pattern Email JsonProperty JsonIgnore Inject Named Singleton "
    "Provides Module Documented Retention Target Inherited".split())


# the next field of a query or form string: `password=PW&user=dagny` ends the value at `&`
# (taken whole, `dagny77&password=PW` was no username and kept; a password ate the URL's rest)
NEXT_FIELD = re.compile(r"&(?=[A-Za-z_][\w.-]*=)")


def _value(m: re.Match[str], group_q: str = "qv", group_v: str = "v") -> tuple[str, int, int] | None:
    for g in (group_q, group_v):
        if m.group(g):
            value = m.group(g)
            if g == group_v and (field := NEXT_FIELD.search(value)):
                value = value[:field.start()]
            return (value, m.start(g), m.start(g) + len(value)) if value else None
    return None


def _is_reference(value: str, quoted: bool) -> bool:
    low = value.lower()
    if (_REF.search(value) or low in NON_VALUES or low in WEEKDAYS_MONTHS
            or set(value) <= set("*•x.-_#?")):
        return True
    if not quoted and (re.search(r"[(\[]", value) or value.split(".")[0].lower() in CODE_OBJECTS
                       and "." in value):
        return True  # an expression, not a literal
    return False


# a format string's fields and the punctuation between them: `'%s:%s'`, `'{}:{}'`
FORMAT_ONLY = re.compile(r"(?:%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[sdrfxi]|\{[^{}]*\}|[^\w%{}])*")
# "the -n and -p options": prose about a flag, not a flag given a value
FLAG_PROSE = frozenset("option options flag flags switch switches argument arguments parameter "
                       "parameters and or to is for with the of".split())


def _placeholder_password(value: str) -> bool:
    low = value.lower()
    if FORMAT_ONLY.fullmatch(value) and re.search(r"%|\{", value):
        return True
    return (low in PLACEHOLDER_PASSWORDS or low in SERVICE_ACCOUNTS
            or PLACEHOLDER_WORD.search(value) is not None or WEAK_PASSWORD.fullmatch(value) is not None)


def _looks_like_code_reference(value: str, key: str, quoted: bool) -> bool:
    """`password = hashed_password` / `user = current_user` in unquoted code."""
    if quoted:
        return False
    words = ("pass", "pwd", "user", "login", "name", "request", "form", "input", "param", "arg",
             "get", "hash")
    parts = value.lower().split("_")  # whole parts: `hashed_password`, not `quentin_takahashi`
    return "_" in value and any(p.startswith(w) or p.endswith(w) for p in parts for w in words)


def _code_not_literal(m: re.Match[str], text: str, value: str, end: int, quoted: bool) -> bool:
    """Assignment matches that are code or prose, not a chosen value: `a == b` with an
    unquoted right side (a comparison of names), `passwd = acct = ''` (a chained assignment
    names a variable), and `pass:` before an unquoted word ("first pass: determine")."""
    if quoted:
        return False
    after = text[end:end + 40]
    if m.group("op") == "==" or re.match(r"[ \t]*=(?!=)", after):
        return True
    if re.match(r"[ \t]+[a-z]+\b(?![^\s=]*=)", after) and re.fullmatch(
            r"[A-Za-z]+(?:[-_][A-Za-z]+)*", value):  # words (`db-user`), not `Tr0ub4dor&3`
        return True  # a sentence goes on ("- user:  The user name"), not `k=v k2=v2` pairs
    if m.group("op") == ":" and re.match(r"[ \t]*(?:[),]|=[^=])", after):
        return True  # a parameter's annotation: `user_id: UserId) ->`
    if "." in value and "_" in value and re.fullmatch(r"[A-Za-z_][\w.]*", value):
        return True  # `tarinfo.uid = statres.st_uid`: attribute access
    line = text[text.rfind("\n", 0, m.start()) + 1:m.start()]
    if re.fullmatch(r"[A-Za-z_]\w*", value) and m.group("op") == "=" and (
            re.match(r"(?:self|this|cls)\.", m.group("key"), re.I)
            or re.fullmatch(rf"[ \t]*(?:(?:[A-Za-z_]\w*\.[\w.]+|{USER_KEY})[ \t]*,[ \t]*)+", line,
                            re.IGNORECASE)):
        return True  # `self.password = credentials`, `self.user, self.password = creds`
    if value.lower() == re.split(r"[_.-]", m.group("key"))[-1].lower():
        return True  # `tarinfo.uid = uid`
    return m.group("key").lower() == "pass" and m.group("op") == ":"


# commands whose `-p` / `-u` mean something else (preserve, parents, patch, unique,
# upstream, unbuffered, UTC); elsewhere they take a password / user (numeric ports are not
# passwords anyway)
# (also pytest's plugin, npx's package, nmap's ports, and compose's project among its own options:
# `docker compose exec db mysql -p PW` is mysql's; `docker run -p 8080:80` is a port, `PORT_VALUE`)
# (7z's password is written onto its `-p`, a spaced one prompts; unzip's `-p` pipes, curl's tunnels)
OTHER_P = re.compile(r"(?:^|[\s;&|(])(?:cp|mkdir|git|install|rsync|scp|tar|mv|ln|read|patch|pytest|npx|nmap|7z[ar]?|unzip|curl)\s"
                     r"|(?:^|[\s;&|(])(?:docker-compose|(?:docker|podman)\s+compose)(?:\s+-\S+(?:\s+[^\s-]\S*)?)*\s+$")
OTHER_U = re.compile(r"(?:^|[\s;&|(])(?:sort|uniq|git|date|diff|pip\d*|pytest)\s"
                     r"|(?:^|[\s;&|(])python\d*(?:\.\d+)?\s+$")  # `python -u`, not its script's


def _command_line(text: str, flag_at: int) -> str:
    """The command the flag belongs to, up to the flag: its line and the lines it continues
    (a shell command split with `\\`), from the last `;`, `&`, `|` or `(` on them. The
    whole line made `mkdir -p /srv && mysql -u dagny -p PW` one `mkdir` command, so the
    password was taken for mkdir's `-p` and kept. At most MAX_COMMAND characters back."""
    lo = max(0, flag_at - MAX_COMMAND)  # read to the line's start: O(len) a flag, O(len^2) a line
    start = max(lo, text.rfind("\n", lo, flag_at) + 1)
    while start > lo + 1 and _ends_with_backslash(text, start - 1):
        start = max(lo, text.rfind("\n", lo, start - 1) + 1)
    seps = _separators(text)
    last = bisect.bisect_left(seps, flag_at) - 1  # the last one before the flag
    return text[max(start, seps[last] + 1 if last >= 0 else 0):flag_at]


@lru_cache(maxsize=1)
def _separators(text: str) -> list[int]:
    """Where the document's `;`, `&`, `|` and `(` are, found once (searching back from each
    flag for them read to the line's start where there was none)."""
    return [m.start() for m in re.finditer(r"[;&|(]", text)]


def _ends_with_backslash(text: str, end: int) -> bool:
    """`text[:end]`, spaces and tabs after it dropped, ends with `\\` (read backwards from
    `end`, not by copying the text before it: O(len) a flag)."""
    while end > 0 and text[end - 1] in " \t":
        end -= 1
    return end > 0 and text[end - 1] == "\\"


# mysql's `-p` with a space after it prompts, and the word after it is the database; a word
# no database is named like (mixed case with digits, symbols: `Xk3pq9z`, `Fjord-Kite-58`) is
# still the password its writer meant, and leaks as one
MYSQL_COMMAND = re.compile(rf"{ASCII_START}mysql(?:dump|admin)?(?![A-Za-z0-9_-])")
DATABASE_NAME = re.compile(r"[a-z_$][a-z0-9_$-]*|[A-Z_$][A-Z0-9_$-]*|(?:[A-Z][a-z]+)+")
# mysql reads one database, so `mysql -p WORD db` (db then the command's end or an option)
# had WORD written as the password; mysqldump's tables and mysqladmin's commands follow
# theirs, a sentence goes on past it, and `2>&1` is no database
MYSQL_CLIENT = re.compile(rf"{ASCII_START}mysql(?![A-Za-z0-9_-])")
DATABASE_AFTER = re.compile(r"[ \t]+(?!\d*[<>])[A-Za-z0-9_$][\w$-]*[ \t]*(?:$|[<>;|&`\"')]|-)", re.MULTILINE)


def _is_database(text: str, command: str, value: str, value_end: int) -> bool:
    """The word after mysql's spaced `-p` is its database, not a password."""
    if DATABASE_NAME.fullmatch(value) is None or MYSQL_COMMAND.search(command) is None:
        return False
    return not (MYSQL_CLIENT.search(command) and DATABASE_AFTER.match(text, value_end))


def _other_meaning(text: str, flag_at: int, flag: str, value: str = "", value_end: int = 0) -> bool:
    """The flag means something other than a password / user in its command: `cp -p`,
    `sort -u`, and mysql's spaced `-p` before a database name."""
    pattern = {"-p": OTHER_P, "-u": OTHER_U}.get(flag)
    if pattern is None:
        return False
    command = _command_line(text, flag_at)
    return pattern.search(command) is not None or (flag == "-p" and _is_database(text, command, value, value_end))


def _in_shell_default(text: str, m: re.Match[str]) -> bool:
    """An assignment match that is the variable of `${NAME:-default}` (SHELL_DEFAULT's: read
    as `NAME: -default`, the value took the `-` of the operator with it)."""
    return text[max(0, m.start() - 2):m.start()] == "${"


def _netrc_fields(text: str) -> Iterator[tuple[str, str, int]]:
    """(login or password, its value, where the value starts) of each .netrc entry whose
    host has a dot or whose password a digit or symbol: "machine learning login screen
    password protected" is prose."""
    for entry in NETRC_ENTRY.finditer(text):
        fields = []
        for m in NETRC_FIELD.finditer(text, entry.start("body"), entry.end("body")):
            value = "qv" if m.group("qv") is not None else "v"
            if m.group("field") in ("login", "password"):
                fields.append((m.group("field"), m.group(value), m.start(value)))
        if "." in (entry.group("host") or "") or any(
                field == "password" and re.search(r"[\d\W]", value) for field, value, _ in fields):
            yield from fields


def find_passwords(text: str) -> Iterator[Span]:
    for pattern in (PASSWORD_ASSIGN, XML_VALUE):
        for m in pattern.finditer(text):
            got = _value(m) if pattern is PASSWORD_ASSIGN else (m.group("v"), m.start("v"), m.end("v"))
            if pattern is XML_VALUE and not re.search(PASSWORD_KEY + "$", m.group("tag"), re.I):
                continue
            if got is None:
                continue
            value, s, e = got
            quoted = pattern is PASSWORD_ASSIGN and bool(m.group("qv"))
            if not quoted and text[e:e + 1] in ("(", "[", "."):
                continue  # `bcrypt.hashpw(...)`: a call, not a literal
            if pattern is PASSWORD_ASSIGN and (_code_not_literal(m, text, value, e, quoted)
                                               or _in_shell_default(text, m)):
                continue
            if (len(value) < 3 or _is_reference(value, quoted) or _placeholder_password(value)
                    or _looks_like_code_reference(value, m.group(0), quoted)):
                continue
            yield Span("PASSWORD", s, e, value)
    for m in CLI_FLAG.finditer(text):
        if m.group("flag").lstrip("-") in {"password", "passwd", "pass", "p"}:
            got = _value(m)
            if _other_meaning(text, m.start(), m.group("flag"), *(got[::2] if got else ("", 0))):
                continue  # `cp -p`, `git add -p`, `mkdir -p`, `mysql -p mydb`: no password there
            if got and not _is_reference(got[0], True) and not _placeholder_password(got[0]) \
                    and len(got[0]) >= 3 and not PORT_VALUE.fullmatch(got[0]) \
                    and got[0].lower() not in FLAG_PROSE:
                yield Span("PASSWORD", got[1], got[2], got[0])
    for m in SHELL_DEFAULT.finditer(text):
        value = m.group("v")
        if re.fullmatch(PASSWORD_KEY, m.group("key"), re.IGNORECASE) and len(value) >= 3 \
                and not _placeholder_password(value):
            yield Span("PASSWORD", m.start("v"), m.end("v"), value)
    for m in KEYED_SETTING.finditer(text):
        value = m.group("v")
        if PASSWORD_NAME_END.search(m.group("key")) and len(value) >= 3 \
                and not _is_reference(value, True) and not _placeholder_password(value):
            yield Span("PASSWORD", m.start("v"), m.end("v"), value)
    for field, value, start in _netrc_fields(text):
        if field == "password" and len(value) >= 3 and not _is_reference(value, True) \
                and not _placeholder_password(value):
            yield Span("PASSWORD", start, start + len(value), value)
    for pattern in (MYSQL_INLINE_PASSWORD, SSHPASS_INLINE_PASSWORD, REDIS_PASSWORD, *TOOL_PASSWORDS):
        for m in pattern.finditer(text):
            got = _value(m)
            if got and not _is_reference(got[0], True) and not _placeholder_password(got[0]) \
                    and got[0].lower() not in FLAG_PROSE:  # "redis-cli's -a flag"
                yield Span("PASSWORD", got[1], got[2], got[0])
    for m in PROSE_PASSWORD.finditer(text):
        pw = m.group("pw")
        if re.search(r"[\d\W]", pw) and not _is_reference(pw, True) and not _placeholder_password(pw):
            yield Span("PASSWORD", m.start("pw"), m.end("pw"), pw)
    for m in URL_CREDENTIALS.finditer(text):
        pw = m.group("pw")
        if pw and not _is_reference(pw, True) and not _placeholder_password(pw):
            yield Span("PASSWORD", m.start("pw"), m.end("pw"), pw)


# a quoted key of a mapping: `'posix_user': {`. The characters are those a username may
# have (`_username_ok`), so the key between the quotes is the whole run
QUOTED_KEY = re.compile(r"(?<=[\"'])([A-Za-z0-9._\\-]+)[\"'][ \t]*:")


def _quoted_keys(text: str) -> set[str]:
    """The quoted keys of the document, found in one pass: a value that is one of them
    (`'posix_user': {...}` and later `'user': 'posix_user'`) is a name the code defines, such
    as an install scheme, not a login (searching the text again for each value was O(len) a
    value)."""
    return set(QUOTED_KEY.findall(text))


def _username_ok(value: str) -> bool:
    low = value.lower()
    return (re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._\\-]{1,38}[A-Za-z0-9_]|[A-Za-z0-9]{2,3}", value)
            is not None and low not in SERVICE_ACCOUNTS and low not in NON_VALUES
            and not value.isdigit() and low not in PLACEHOLDER_USERS
            and PLACEHOLDER_WORD.search(value) is None
            and not low.startswith(("test", "demo", "example", "sample", "dummy", "fake")))


def find_usernames(text: str) -> Iterator[Span]:
    keys: set[str] | None = None
    for m in USER_ASSIGN.finditer(text):
        got = _value(m)
        if got is None:
            continue
        value, s, e = got
        quoted = bool(m.group("qv"))
        if not quoted and text[e:e + 1] in ("(", "[", "."):
            continue
        if _code_not_literal(m, text, value, e, quoted) or _in_shell_default(text, m):
            continue
        if _is_reference(value, quoted) or _looks_like_code_reference(value, "", quoted):
            continue
        if _username_ok(value):
            keys = _quoted_keys(text) if keys is None else keys
            if value not in keys:
                yield Span("USERNAME", s, e, value)
    for m in XML_VALUE.finditer(text):
        if re.search(USER_KEY + "$", m.group("tag"), re.I) and _username_ok(m.group("v")):
            yield Span("USERNAME", m.start("v"), m.end("v"), m.group("v"))
    for m in CLI_FLAG.finditer(text):
        if m.group("flag").lstrip("-") in {"user", "username", "u", "login", "l"}:
            if _other_meaning(text, m.start(), m.group("flag")):
                continue  # `sort -u`, `git push -u origin`: not a user flag there
            got = _value(m)
            if got and _username_ok(got[0]) and not _is_reference(got[0], True):
                yield Span("USERNAME", got[1], got[2], got[0])
    for user, start in curl_users(text):  # `curl -u user:PW`
        if _username_ok(user) and not _is_reference(user, True):
            yield Span("USERNAME", start, start + len(user), user)
    for m in SHELL_DEFAULT.finditer(text):
        if re.fullmatch(USER_KEY, m.group("key"), re.IGNORECASE) and _username_ok(m.group("v")):
            yield Span("USERNAME", m.start("v"), m.end("v"), m.group("v"))
    for m in KEYED_SETTING.finditer(text):
        if USER_NAME_END.search(m.group("key")) and _username_ok(m.group("v")) \
                and not _is_reference(m.group("v"), True):
            yield Span("USERNAME", m.start("v"), m.end("v"), m.group("v"))
    for field, value, start in _netrc_fields(text):
        if field == "login" and _username_ok(value) and not _is_reference(value, True):
            yield Span("USERNAME", start, start + len(value), value)
    for m in PROSE_USER.finditer(text):
        user = m.group("user")
        if re.search(r"[._\d]", user) and _username_ok(user):
            yield Span("USERNAME", m.start("user"), m.end("user"), user)
    for pattern in (URL_CREDENTIALS, SSH_TARGET, HOME_DIR, SSH_CONFIG_USER):
        for m in pattern.finditer(text):
            user = m.group("user")
            if _username_ok(user) and not _is_reference(user, True):
                yield Span("USERNAME", m.start("user"), m.end("user"), user)
    for m in HANDLE.finditer(text):
        user = m.group("user")
        line_start = text.rfind("\n", 0, m.start()) + 1
        before = text[line_start:m.start()]
        if DECORATOR_LEAD.fullmatch(before) and (DECORATOR_TAIL.match(text, m.end()) or "." in user):
            continue  # `@functools.cached_property  # note`, `>>> @total_ordering`, `@app.route`
        if DOC_TAG_LEAD.fullmatch(before) or before.endswith("["):
            continue  # `# @keyparam`, ` * @param`, XPath `[@attribute='v']`
        if (user.lower() in AT_KEYWORDS or user.split("-")[0].lower() in PY_DECORATORS
                or user in JAVA_ANNOTATIONS or not _username_ok(user)):
            continue
        if user.isupper():  # `See @XMLRPC3`: a reference tag; handles are not written in capitals
            continue
        yield Span("USERNAME", m.start("user"), m.end("user"), user)
