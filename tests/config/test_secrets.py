"""The secrets the proxy knows (proxy/config/secrets.py); how a foreign body is cleared of them."""

from __future__ import annotations

import json
import urllib.parse

import pytest

from proxy.config import (
    BackendSettings,
    FallbackSettings,
    LedgerSettings,
    LocalSettings,
    ServerSettings,
    Settings,
)
from proxy.config.secrets import MARK, NO_SECRETS, Secrets

PROVIDER = "sk-prov+i39/key=0123456789abcdef"
CLIENT = "frugal-client_key-0123456789abcdef"
BACKEND = "backend-key-0123456789"
PASSWORD = "pg-password-0123456789"
LITELLM = "anthropic-0123456789abcdef"


def _settings() -> Settings:
    return Settings(
        server=ServerSettings(api_keys_env="MY_CLIENTS"),
        local=LocalSettings(
            backends=(BackendSettings(name="b", api_base="http://b", api_key_env="B_KEY"),)
        ),
        fallback=FallbackSettings(api_key_env="MY_UPSTREAM"),
        ledger=LedgerSettings(password_env="PG_PASS_FILE_VALUE"),
    )


ENVIRON = {
    "MY_UPSTREAM": PROVIDER,
    "MY_CLIENTS": f"alice;admin:{CLIENT}, bob;max_concurrency=2:{CLIENT[::-1]}, {BACKEND}x",
    "B_KEY": BACKEND,
    "PG_PASS_FILE_VALUE": PASSWORD,
    "ANTHROPIC_API_KEY": LITELLM,
    "HF_TOKEN": "short",  # under MIN_SECRET_CHARS: not scrubbed
    "SSH_AUTH_SOCK": "a list of words",  # white space: a setting, not a key
    "PATH": "/usr/local/bin:/usr/bin",
}


def test_known_secrets_are_the_configured_keys_and_the_secret_named_variables() -> None:
    known = Secrets.known(_settings(), ENVIRON)
    assert known.values == {
        PROVIDER,
        CLIENT,
        CLIENT[::-1],
        BACKEND,
        BACKEND + "x",
        PASSWORD,
        LITELLM,
    }


@pytest.mark.parametrize("many", [True, False], ids=["one-re2-pass", "few-by-in"])
def test_every_form_of_a_secret_is_replaced_by_the_mark(many: bool) -> None:
    known = Secrets.known(_settings(), ENVIRON) if many else Secrets.of([PROVIDER])
    assert (known.finder is not None) == many
    forms = {
        "plain": PROVIDER,
        "bearer": f"Bearer {PROVIDER}",
        "url-encoded": urllib.parse.quote(PROVIDER, safe=""),
        "url-encoded, lower-case hex": urllib.parse.quote(PROVIDER, safe="").lower(),
        "query form": urllib.parse.quote_plus(PROVIDER),
        "json": json.dumps(PROVIDER),
        "json, slashes escaped": json.dumps(PROVIDER).replace("/", "\\/"),
    }
    for name, form in forms.items():
        if name == "url-encoded, lower-case hex":  # only the escapes are lower-cased
            form = urllib.parse.quote(PROVIDER, safe="").replace("%2B", "%2b")
            form = form.replace("%2F", "%2f").replace("%3D", "%3d")
        body = f'{{"error": {{"message": "you sent {form} here"}}}}'.encode()
        scrubbed = known.scrub(body)
        print(f"{name}: {body!r} -> {scrubbed!r}")
        assert MARK.encode() in scrubbed, name
        assert b"0123456789abcdef" not in scrubbed, name
    assert known.scrub(f"Bearer {PROVIDER}".encode()) == MARK.encode()  # the prefix goes too


def test_every_kind_of_secret_is_scrubbed_and_nothing_else() -> None:
    known = Secrets.known(_settings(), ENVIRON)
    text = " | ".join([PROVIDER, CLIENT, BACKEND, PASSWORD, LITELLM, "short", "/usr/bin"])
    assert known.scrub_text(text) == " | ".join([MARK] * 5 + ["short", "/usr/bin"])
    untouched = b'{"choices": [{"message": {"content": "Paris."}}]}'
    assert known.scrub(untouched) is untouched  # nothing found: the same bytes, no copy


def test_an_error_body_also_loses_what_is_shaped_like_a_key_and_escapes_hid() -> None:
    stranger = "sk-" + "A1b2" * 8
    body = f'{{"error": {{"message": "key {stranger}", "code": "\\u0073k-{"x" * 20}"}}}}'
    assert stranger.encode() in NO_SECRETS.scrub(body.encode())  # answers keep such text
    cleared = NO_SECRETS.scrub_error(body.encode())
    assert stranger.encode() not in cleared
    parsed = NO_SECRETS.scrub_tree(json.loads(cleared))
    assert parsed == {"error": {"message": f"key {MARK}", "code": MARK}}


def test_a_callers_own_token_is_added_per_request() -> None:
    known = Secrets.known(_settings(), ENVIRON)
    caller = "frugal-stored-key-" + "z" * 20
    assert caller.encode() in known.scrub(caller.encode())
    assert known.plus(caller).scrub(caller.encode()) == MARK.encode()
    assert known.plus(None, "tiny") is known
