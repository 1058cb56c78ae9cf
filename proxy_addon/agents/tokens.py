"""Agent names and tokens: a new token, the salted hash config.yaml keeps of it, and the check of a token.

A token is 32 random bytes (`secrets.token_urlsafe`: URL-safe, so it goes into a proxy URL as it is). Its hash is
`sha256$<salt>$<digest>`, the digest SHA-256 over a random 16-byte salt and the token. No slow KDF: a slow hash
exists to make guessing a *chosen* password expensive, and 256 random bits cannot be guessed at any speed; a
KDF's milliseconds would instead be paid on the proxy's hot path. The salt keeps two equal tokens (or one
reused across installs) from having equal hashes. Digests are compared in constant time (`hmac.compare_digest`),
and nothing here keeps a token after the call that checks it.
"""

import hashlib
import hmac
import re
import secrets

AGENT_NAME_MAX = 255  # an agent's name, as proxy authentication gave it and its column holds
TOKEN_BYTES = 32
SALT_BYTES = 16
HASH_SCHEME = "sha256"
HASH_PATTERN = re.compile(r"^sha256\$[0-9a-f]{32}\$[0-9a-f]{64}$")
# A user name as a proxy URL carries it without escaping (RFC 3986 unreserved characters, less '~'), starting with a letter
# or a digit. `anonymous` and `other` are taken: they are what the metrics call an agent without a name and an
# agent whose name is not configured (metrics.py).
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ANONYMOUS_AGENT, OTHER_AGENT = "anonymous", "other"
RESERVED_NAMES = frozenset({ANONYMOUS_AGENT, OTHER_AGENT})


def check_name(name: str) -> str:
    """The name, if an agent may have it; else ValueError saying why, in one line."""
    if not NAME_PATTERN.match(name):
        shown = name[:80] if name.isprintable() else ascii(name[:80])
        raise ValueError(
            f"invalid agent name {shown!r}: 1 to 64 letters, digits, '.', '_' or '-', starting with a letter "
            "or a digit (it is the user name of a proxy URL)"
        )
    if name.lower() in RESERVED_NAMES:
        raise ValueError(f"the agent name {name!r} is reserved (the metrics' label for {name.lower()} agents)")
    return name


def check_hash(stored: str) -> str:
    """The stored hash, if it has the form `token_hash` does; else ValueError (a hand-edited, broken entry)."""
    if not HASH_PATTERN.match(stored):
        raise ValueError("not a token hash (sha256$<32 hex digits>$<64 hex digits>); `receipts agents add` writes one")
    return stored


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_hash(token: str, salt: bytes | None = None) -> str:
    """`sha256$<salt>$<digest>` of this token, with a new random salt unless one is given."""
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    return f"{HASH_SCHEME}${salt.hex()}${_digest(salt, token)}"


def token_matches(token: str, stored: str) -> bool:
    """Whether this token is the one `stored` (a `token_hash`) was made from; in constant time for its length."""
    scheme, salt_hex, digest = stored.split("$")
    if scheme != HASH_SCHEME:
        return False
    return hmac.compare_digest(_digest(bytes.fromhex(salt_hex), token), digest)


def _digest(salt: bytes, token: str) -> str:
    return hashlib.sha256(salt + token.encode("utf-8", "surrogatepass")).hexdigest()


# A hash no token matches (its salt and digest were never made from one): an unknown name costs the same check.
NO_AGENT_HASH = token_hash(secrets.token_urlsafe(TOKEN_BYTES))
