"""The version of the PII detection rules: the pii stage's rules version, which a prepare's
signature records (`kiln.data.stage_rules`, named by its StageSpec).

A changed rule redacts other spans: a prepare resumed across the change would mix documents
redacted by both rule sets, and a finished one would no longer be what this Kiln makes. Bump
PII_RULES with any change to what `redact` replaces; tests/test_pii_rules_version.py pins the
redactions of the labelled corpus to it, so a change that forgets fails there.
"""

# JSON lists, CJK edges, `-p PW;`, query fields, Basic auth, .netrc (quoted values), ${X:-PW}, [at], inline -pPW ends at a quote,
# tools' own password flags (requirepass, zip -P, 7z -pPW, openssl pass:/-k, curl -u user:PW), quoted arguments
# with spaces, mysql's spaced -p before a database name, 7z's / unzip's / curl's -p, `$1`,
# curl's `-uUSER` group: the first `u` takes the rest, `mysql -p WORD db`: WORD the password,
# a redis.conf line ends after its value
PII_RULES = "2026-12-08.4"
