"""The account an intent belongs to: a keyed hash of the request's credentials, never the credentials.

Two agents with different API keys may send the same body; they are different intents. Every secret header
but the rotating ones counts (rules/redaction.py says which). The same key gives a secret field's value its part in
the intent's identity (`digest`, used by rules/fingerprint.py). The HMAC key comes in as bytes: keyfiles.py reads it
from `RECEIPTS_SECRET` (give every replica the same one) or from a local file created with mode 0600.
"""

import hashlib
import hmac

from proxy_addon.rules.redaction import counts_for_account
from proxy_addon.rules.signing import NO_SIGNING, Signing, account_part

ANONYMOUS = "anonymous"


class AccountHasher:
    def __init__(self, key: bytes):
        self._key = key

    def account_of(
        self,
        headers: list[tuple[str, str]],
        secret_headers: frozenset[str] = frozenset(),
        signing: Signing = NO_SIGNING,
        signers: list[tuple[str, str]] | None = None,
    ) -> str:
        """`acct:<hex>` over the credentials present (sorted), or `anonymous` when there are none.
        `secret_headers`: the configured `redact_headers`, added to the built-in ones. A header signed per
        attempt counts by its signer alone (rules/signing.py), as do `signers` (a presigned URL's)."""
        parts = (account_part(n, v, signing) for n, v in headers if counts_for_account(n, secret_headers))
        creds = sorted([p for p in parts if p is not None] + (signers or []))
        if not creds:
            return ANONYMOUS
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for name, value in creds:
            mac.update(name.encode() + b"\0" + value.encode("utf-8", "surrogateescape") + b"\0")
        return "acct:" + mac.hexdigest()[:40]

    def digest(self, value: bytes) -> str:
        """A secret's value as it counts for an intent's identity: keyed, so it cannot be guessed offline."""
        return "hmac:" + hmac.new(self._key, b"receipts-secret-value\0" + value, hashlib.sha256).hexdigest()
