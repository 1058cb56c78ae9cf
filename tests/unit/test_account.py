"""The account an intent belongs to (rules/account.py): a keyed hash of the credentials present, never the
credentials, and the key it is made with, from RECEIPTS_SECRET or a private file that replicas create once."""

import os
import re
import stat
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from proxy_addon.config import BUILTIN_SECRET_HEADERS
from proxy_addon.exceptions import ConfigError
from proxy_addon.keyfiles import SECRET_ENV, load_or_create_key
from proxy_addon.rules.account import ANONYMOUS, AccountHasher
from proxy_addon.rules.signing import SIGNER

SECRET = "hunter2-s3cr3t"
CREDS = frozenset(BUILTIN_SECRET_HEADERS)
KEY = b"k" * 64


def account(headers: list[tuple[str, str]], key: bytes = KEY) -> str:
    return AccountHasher(key).account_of(headers, CREDS)


@pytest.mark.parametrize("a, b, same", [
    ([("Authorization", "Bearer one")], [("Authorization", "Bearer one")], True),
    ([("Authorization", "Bearer one")], [("authorization", "Bearer one"), ("Accept", "x")], True),
    ([("Authorization", "Bearer one")], [("Authorization", "Bearer two")], False),
    # two credentials in either order (not Cookie: it rotates, and so counts for no account at all)
    ([("Authorization", "x"), ("X-Api-Key", "c")], [("X-Api-Key", "c"), ("Authorization", "x")], True),
    ([("Authorization", "x")], [("X-Api-Key", "x")], False),  # the same value as another credential
    ([("Authorization", "x"), ("X-Api-Key", "c")], [("Authorization", "c"), ("X-Api-Key", "x")], False),
    ([("X-Api-Key", "x"), ("Proxy-Authorization", "p1")], [("X-Api-Key", "x"), ("Proxy-Authorization", "p2")], True),
])
def test_account_is_a_keyed_hash_of_the_credentials(a, b, same):
    assert (account(a) == account(b)) is same
    assert re.fullmatch(r"acct:[0-9a-f]{40}", account(a))


@pytest.mark.parametrize("headers", [[], [("Accept", "x")], [("Proxy-Authorization", "Basic cHJveHk=")]])
def test_no_credential_is_anonymous(headers):
    assert account(headers) == ANONYMOUS


def test_account_depends_on_the_key_and_never_shows_the_secret():
    headers = [("Authorization", f"Bearer {SECRET}")]
    assert account(headers) != account(headers, key=b"q" * 64)
    assert SECRET not in account(headers) and "Bearer" not in account(headers)


def test_load_or_create_key_makes_a_private_file_and_reuses_it(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    path = tmp_path / "secret"
    old_umask = os.umask(0)  # the mode must not depend on a permissive umask
    try:
        key = load_or_create_key(path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key) >= 32
    assert load_or_create_key(path) == key and path.read_text().strip().encode() == key
    assert load_or_create_key(tmp_path / "other") != key


def test_secret_env_wins_over_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "shared-by-every-replica-0123456789")
    assert load_or_create_key(tmp_path / "secret") == b"shared-by-every-replica-0123456789"
    assert not (tmp_path / "secret").exists()


@pytest.mark.parametrize("setup", ["short", "no-dir"])
def test_unusable_secret_file_is_one_config_error(tmp_path, monkeypatch, setup):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    path = tmp_path / "secret" if setup == "short" else tmp_path / "missing" / "secret"
    if setup == "short":
        path.write_text("too-short")
    with pytest.raises(ConfigError) as err:
        load_or_create_key(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_replicas_creating_the_key_file_at_once_all_read_the_same_whole_key(tmp_path, monkeypatch):
    """Proxies started together on one secret_file: none may read it half-written, and all must use one key."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    for attempt in range(20):
        path = tmp_path / f"secret-{attempt}"
        start = threading.Barrier(8)

        def load() -> bytes:
            start.wait(10)
            return load_or_create_key(path)

        with ThreadPoolExecutor(8) as pool:
            keys = {f.result() for f in [pool.submit(load) for _ in range(8)]}
        assert keys == {path.read_text().strip().encode()}
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(f"secret-{i}" for i in range(20))  # no drafts left




def test_a_configured_redact_header_counts_for_the_account_and_is_nothing_without_it():
    headers = [("X-Tenant", "tenant-a")]
    assert AccountHasher(KEY).account_of(headers, CREDS) == ANONYMOUS
    configured = CREDS | {"x-tenant"}
    a = AccountHasher(KEY).account_of(headers, configured)
    assert a.startswith("acct:") and a != AccountHasher(KEY).account_of([("X-Tenant", "tenant-b")], configured)


def test_a_presigned_urls_signers_count_like_credentials():
    hasher = AccountHasher(KEY)
    alone = hasher.account_of([], CREDS, signers=[(SIGNER, "aws4:AKIDEXAMPLE")])
    assert alone.startswith("acct:") and alone != hasher.account_of([], CREDS, signers=[(SIGNER, "aws4:AKIDOTHER")])
    both = hasher.account_of([("X-Api-Key", "k")], CREDS, signers=[(SIGNER, "aws4:AKIDEXAMPLE")])
    assert both not in (alone, account([("X-Api-Key", "k")]))


def test_a_credential_that_is_not_valid_utf8_still_has_an_account():
    """Header values reach here decoded with surrogateescape: the hash must take them, not raise."""
    odd = "Bearer \udcff\udcfe"
    assert account([("Authorization", odd)]) != account([("Authorization", "Bearer ")])


def test_a_secrets_digest_is_keyed_stable_and_never_shows_the_value():
    a = AccountHasher(KEY)
    got = a.digest(SECRET.encode())
    assert re.fullmatch(r"hmac:[0-9a-f]{64}", got) and SECRET not in got
    assert got == AccountHasher(KEY).digest(SECRET.encode())
    assert got != a.digest(b"other") and got != AccountHasher(b"q" * 64).digest(SECRET.encode())


@pytest.mark.parametrize(("key", "ok"), [("x" * 31, False), ("x" * 32, True), ("  " + "y" * 32 + "\n", True), ("", False)])
def test_a_key_file_needs_32_characters_after_surrounding_blanks(tmp_path, monkeypatch, key, ok):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    path = tmp_path / "secret"
    path.write_text(key)
    if ok:
        assert load_or_create_key(path) == key.strip().encode()
    else:
        with pytest.raises(ConfigError, match="too short"):
            load_or_create_key(path)


def test_an_empty_secret_env_is_no_key_and_the_file_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "")
    path = tmp_path / "secret"
    path.write_text("z" * 40)
    assert load_or_create_key(path) == b"z" * 40


def test_a_key_path_that_cannot_be_read_is_one_config_error(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    (tmp_path / "secret").mkdir()
    with pytest.raises(ConfigError, match="cannot read it") as err:
        load_or_create_key(tmp_path / "secret")
    assert "\n" not in str(err.value)
