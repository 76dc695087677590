"""Client keys: parsing the environment, the hashed store, ``frugal keys``, the bind check."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from proxy import cli, config
from proxy.errors import ConfigError
from proxy.ledger.tenants import keys
from proxy.server import auth
from proxy.serving import clients

GOOD = "k" * 16


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- the environment ----------------------------------------------------------------------------


def test_env_keys_take_names_or_are_named_by_position() -> None:
    parsed = keys.parse_env_keys(f" alice:{GOOD}a , {GOOD}b,, bob:{GOOD}c ", "KEYS")
    assert [k.name for k in parsed] == ["alice", "key-2", "bob"]
    assert parsed[0].digest == keys.digest(GOOD + "a")
    assert parsed[1].digest == keys.digest(GOOD + "b")


def test_an_unset_or_empty_variable_means_no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FRUGAL_TEST_KEYS", raising=False)
    assert keys.env_keys("FRUGAL_TEST_KEYS") == []
    monkeypatch.setenv("FRUGAL_TEST_KEYS", " , ")
    assert keys.env_keys("FRUGAL_TEST_KEYS") == []
    assert keys.env_keys("") == []


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("alice:short", "the key named 'alice' is 5 characters long; expected at least 16"),
        ("tooshort", "the key named 'key-1' is 8 characters long"),
        (f"al ice:{GOOD}", "$KEYS (entry 1): the name before ':' must be"),
        (f"a:{GOOD}1,a:{GOOD}2", "$KEYS (entry 2): the name 'a' is given twice"),
    ],
)
def test_bad_env_keys_are_config_errors_naming_the_entry(value: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        keys.parse_env_keys(value, "KEYS")
    assert needle in str(info.value)


def test_a_bad_key_never_appears_in_the_error() -> None:
    with pytest.raises(ConfigError) as info:
        keys.parse_env_keys("alice:SeCrEt-123", "KEYS")
    assert "SeCrEt" not in str(info.value)


def test_api_keys_env_must_name_a_variable_not_hold_a_key() -> None:
    with pytest.raises(ConfigError, match=r"\[server\] api_keys_env = 'sk-abc-123'"):
        config.from_dict({"server": {"api_keys_env": "sk-abc-123"}})


# -- the store and the command -------------------------------------------------------------------


def test_create_prints_the_key_once_and_stores_only_its_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "ledger.db")
    code, out, err = run_cli(capsys, "keys", "create", "alice", "--db", db)
    assert code == 0
    key = out.strip()
    assert key.startswith("frugal-") and len(key) > 40 and "\n" not in key
    assert "only time it is shown" in err and key not in err
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert key.encode() not in raw
    with sqlite3.connect(db) as conn:
        (stored,) = conn.execute("SELECT key_hash FROM api_keys WHERE name = 'alice'").fetchone()
    assert stored == keys.digest(key).hex()
    # list shows the name and a hint, never the key
    code, out, _ = run_cli(capsys, "keys", "list", "--db", db)
    assert code == 0 and "alice" in out and "active" in out and key not in out
    assert key[: keys.HINT_CHARS] + "…" in out


def test_names_are_unique_among_usable_keys_and_free_again_after_revoke(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "ledger.db")
    first = keys.create(db, "ci")
    code, _, err = run_cli(capsys, "keys", "create", "ci", "--db", db)
    assert code == 1 and "a key named 'ci' exists already" in err
    code, _, err = run_cli(capsys, "keys", "revoke", "ci", "--db", db)
    assert code == 0 and "Revoked key 'ci'" in err
    code, _, err = run_cli(capsys, "keys", "revoke", "ci", "--db", db)
    assert code == 1 and "no usable key named 'ci'" in err
    second = keys.create(db, "ci")
    active, ever = keys.load_active(db)
    assert [k.digest for k in active] == [keys.digest(second)] and ever == 2
    assert keys.digest(first) not in [k.digest for k in active]
    code, out, _ = run_cli(capsys, "keys", "list", "--db", db, "--format", "json")
    rows = json.loads(out)
    assert [(r["name"], r["revoked"] is None) for r in rows] == [("ci", False), ("ci", True)]


def test_list_counts_the_requests_the_ledger_attributes_to_each_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "ledger.db")
    keys.create(db, "alice")
    with sqlite3.connect(db) as conn:
        for name in ("alice", "alice", None):
            conn.execute(
                "INSERT INTO requests (request_id, ts, endpoint, route, reason, status, "
                "latency_ms, key_name) VALUES ('r', 1700000000, 'chat.completions', 'local', "
                "'accepted', 200, 1, ?)",
                (name,),
            )
    rows = keys.listing(db)
    assert rows[0]["requests"] == 2 and rows[0]["last_used"] == "2023-11-14 22:13:20"


def test_bad_names_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "keys", "create", "no spaces", "--db", str(tmp_path / "x.db"))
    assert code == 2 and "key name 'no spaces'" in err


def test_keys_reads_the_ledger_path_from_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "state" / "frugal.db"
    db.parent.mkdir()
    cfg = tmp_path / "frugal.toml"
    cfg.write_text(f'[ledger]\npath = "{db}"\n')
    code, out, _ = run_cli(capsys, "keys", "create", "ops", "--config", str(cfg))
    assert code == 0 and keys.load_active(str(db))[0][0].name == "ops"
    code, _, err = run_cli(capsys, "keys", "list", "--db", str(tmp_path / "nowhere" / "x.db"))
    assert code == 2 and "does not exist" in err


# -- matching a presented key ---------------------------------------------------------------------


async def test_the_authenticator_names_env_and_stored_keys_and_sees_revocations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = str(tmp_path / "ledger.db")
    stored = keys.create(db, "bob")
    monkeypatch.setenv("FRUGAL_TEST_KEYS", f"alice:{GOOD}")
    settings = config.from_dict(
        {"server": {"api_keys_env": "FRUGAL_TEST_KEYS"}, "ledger": {"path": db}}
    )
    authn = clients.Authenticator(settings)
    await authn.refresh()
    assert authn.enabled
    assert authn.name_of(GOOD) == "alice"
    assert authn.name_of(stored) == "bob"
    assert authn.name_of(stored[:-1]) is None
    assert authn.name_of("") is None and authn.name_of(None) is None
    keys.revoke(db, "bob")
    await authn.refresh()
    assert authn.name_of(stored) is None
    assert authn.enabled


async def test_revoking_the_last_stored_key_locks_the_proxy_rather_than_opening_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FRUGAL_API_KEYS", raising=False)
    db = str(tmp_path / "ledger.db")
    settings = config.from_dict({"ledger": {"path": db}})
    keys.create(db, "only")
    keys.revoke(db, "only")
    authn = clients.Authenticator(settings)
    await authn.refresh()
    assert authn.enabled and authn.name_of("anything-at-all-here") is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([(b"authorization", b"Bearer abc")], "abc"),
        ([(b"authorization", b"bearer   abc ")], "abc"),
        ([(b"x-api-key", b"xyz")], "xyz"),
        ([(b"authorization", b"Basic abc"), (b"x-api-key", b"xyz")], "xyz"),
        ([(b"authorization", b"Bearer ")], None),
        ([], None),
    ],
)
def test_the_key_is_taken_from_bearer_or_x_api_key(
    headers: list[tuple[bytes, bytes]], expected: str | None
) -> None:
    assert auth.presented_key({"type": "http", "headers": headers}) == expected


# -- the bind check ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("203.0.113.7", False),
        ("myhost.example", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert auth.is_loopback(host) is loopback


def test_a_public_bind_without_keys_is_refused_unless_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FRUGAL_API_KEYS", raising=False)
    db = str(tmp_path / "ledger.db")
    public = config.from_dict({"server": {"host": "0.0.0.0"}, "ledger": {"path": db}})
    with pytest.raises(ConfigError) as info:
        auth.check_bind(public)
    message = str(info.value)
    assert "[server] host = '0.0.0.0' is not a loopback address" in message
    assert "frugal keys create NAME" in message and "$FRUGAL_API_KEYS" in message
    assert "allow_public_without_keys" in message and "--insecure-public" in message
    assert auth.check_bind(public, insecure_public=True) is False
    forced = config.from_dict(
        {"server": {"host": "0.0.0.0", "allow_public_without_keys": True}, "ledger": {"path": db}}
    )
    assert auth.check_bind(forced) is False
    local = config.from_dict({"ledger": {"path": db}})
    assert auth.check_bind(local) is False
    keys.create(db, "ops")
    assert auth.check_bind(public) is True
    monkeypatch.setenv("FRUGAL_API_KEYS", f"x:{GOOD}")
    assert auth.check_bind(config.from_dict({"server": {"host": "0.0.0.0"}})) is True
    monkeypatch.setenv("FRUGAL_API_KEYS", "x:short")
    with pytest.raises(ConfigError, match="at least 16"):
        auth.check_bind(local)


# -- issue 24: names matched whole, a key's concurrency share, its identity ----------------------


@pytest.mark.parametrize(
    "name", ["alice\n", "al\nice", "bob\r", "tab\there", "nul\x00", "esc\x1b[31m", "del\x7f"]
)
def test_names_with_a_newline_or_control_character_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    db = tmp_path / "ledger.db"
    code, out, err = run_cli(capsys, "keys", "create", name, "--db", str(db))
    assert code == 2 and out == ""
    assert f"key name {name!r}: a name may not hold a newline or any other control" in err
    assert not db.exists()  # refused before anything was stored
    with pytest.raises(ConfigError, match="control character"):
        keys.create(str(db), name)
    with pytest.raises(ConfigError, match=r"\$KEYS \(entry 1\): the name before ':' must be"):
        keys.parse_env_keys(f"{name}:{GOOD}", "KEYS")


def test_a_good_name_is_still_accepted_whole() -> None:
    assert keys.check_name("alice.b@x-1_2") == "alice.b@x-1_2"
    assert keys.check_name("a" * 64) == "a" * 64
    with pytest.raises(ConfigError):
        keys.check_name("a" * 65)


def test_max_concurrency_is_stored_listed_and_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "ledger.db"
    code, _, _ = run_cli(
        capsys, "keys", "create", "batch", "--max-concurrency", "3", "--db", str(db)
    )
    assert code == 0
    keys.create(str(db), "plain")
    for bad in ("0", "-2", "100001"):
        code, _, err = run_cli(
            capsys, "keys", "create", "x", "--max-concurrency", bad, "--db", str(db)
        )
        assert code == 1 and f"--max-concurrency {bad}: expected a whole number from 1" in err
    active, _ = keys.load_active(str(db))
    assert [(k.name, k.max_concurrency) for k in active] == [("batch", 3), ("plain", None)]
    code, out, _ = run_cli(capsys, "keys", "list", "--db", str(db), "--format", "json")
    assert [(r["name"], r["max_concurrency"]) for r in json.loads(out)] == [
        ("batch", 3),
        ("plain", None),
    ]
    code, out, _ = run_cli(capsys, "keys", "list", "--db", str(db))
    header, batch, plain = out.splitlines()
    assert header.split()[-2:] == ["CONCURRENCY", "SCOPE"]
    assert batch.split()[-2:] == ["3", "client"] and plain.split()[-2:] == ["default", "client"]
    cfg = tmp_path / "frugal.toml"  # with the config, the default is known: 40 // 4
    cfg.write_text(f'[server]\nmax_concurrency = 40\n\n[ledger]\npath = "{db}"\n')
    code, out, _ = run_cli(capsys, "keys", "list", "--config", str(cfg))
    assert out.splitlines()[2].endswith(" 10 (default)  client")


def test_env_keys_may_carry_a_concurrency_share() -> None:
    parsed = keys.parse_env_keys(f"alice;max_concurrency=4:{GOOD}a, bob:{GOOD}b", "KEYS")
    assert [(k.name, k.max_concurrency) for k in parsed] == [("alice", 4), ("bob", None)]
    assert parsed[0].digest == keys.digest(GOOD + "a")
    for value, needle in (
        (f"alice;root:{GOOD}", "unknown option 'root' after the name"),
        (f"alice;admin=1:{GOOD}", "unknown option 'admin' after the name"),
        (f"alice;max_concurrency=x:{GOOD}", "unknown option 'max_concurrency'"),
        (f"alice;max_concurrency=0:{GOOD}", "max_concurrency=0: expected a whole number"),
    ):
        with pytest.raises(ConfigError) as info:
            keys.parse_env_keys(value, "KEYS")
        assert "$KEYS (entry 1)" in str(info.value) and needle in str(info.value)
        assert GOOD not in str(info.value)


def test_an_admin_key_is_stored_listed_and_read_with_its_scope(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "ledger.db"
    code, out, err = run_cli(capsys, "keys", "create", "ops", "--admin", "--db", str(db))
    assert code == 0 and out.startswith(keys.KEY_PREFIX) and "an admin key 'ops'" in err
    code, _, err = run_cli(capsys, "keys", "create", "alice", "--db", str(db))
    assert code == 0 and "a client key 'alice'" in err
    active, _ = keys.load_active(str(db))
    assert [(k.name, k.admin) for k in active] == [("ops", True), ("alice", False)]
    assert all(k.created_at is not None and k.created_at > 0 for k in active)
    code, out, _ = run_cli(capsys, "keys", "list", "--db", str(db), "--format", "json")
    assert [(r["name"], r["scope"]) for r in json.loads(out)] == [
        ("ops", "admin"),
        ("alice", "client"),
    ]
    code, out, _ = run_cli(capsys, "keys", "list", "--db", str(db))
    _, ops, alice = out.splitlines()
    assert ops.split()[-1] == "admin" and alice.split()[-1] == "client"


def test_env_keys_may_be_admin_keys() -> None:
    parsed = keys.parse_env_keys(
        f"ops;admin:{GOOD}a, both;max_concurrency=2;admin:{GOOD}b, bob:{GOOD}c", "KEYS"
    )
    assert [(k.name, k.admin, k.max_concurrency) for k in parsed] == [
        ("ops", True, None),
        ("both", True, 2),
        ("bob", False, None),
    ]


def test_a_keys_identity_is_its_row_or_its_digest_never_its_name(tmp_path: Path) -> None:
    db = str(tmp_path / "ledger.db")
    keys.create(db, "alice")
    (first,), _ = keys.load_active(db)
    keys.revoke(db, "alice")
    keys.create(db, "alice")
    (second,), _ = keys.load_active(db)
    assert first.name == second.name == "alice"
    assert first.identity != second.identity
    assert first.identity == f"id:{first.key_id}" and second.identity == f"id:{second.key_id}"
    (env,) = keys.parse_env_keys(f"alice:{GOOD}", "KEYS")
    assert env.key_id is None and env.identity == "env:" + keys.digest(GOOD).hex()


@pytest.mark.parametrize(
    ("server", "own", "share"),
    [
        ({}, None, 16),  # a quarter of 64
        ({"max_concurrency": 2}, None, 1),  # at least 1
        ({"max_concurrency": 1}, None, 1),  # the only slot: nothing else is possible
        ({}, 100, 63),  # never every slot
        ({"max_concurrency_per_key": 5}, None, 5),
        ({"max_concurrency_per_key": 5}, 9, 9),  # the key's own wins
    ],
)
def test_a_keys_share_defaults_to_a_quarter_and_is_never_every_slot(
    server: dict[str, int], own: int | None, share: int
) -> None:
    settings = config.from_dict({"server": server})
    assert settings.server.key_concurrency(own) == share


@pytest.mark.parametrize("value", [-1, 64, 65])
def test_max_concurrency_per_key_must_leave_a_slot_for_others(value: int) -> None:
    with pytest.raises(ConfigError) as info:
        config.from_dict({"server": {"max_concurrency_per_key": value}})
    assert f"[server] max_concurrency_per_key = {value}: expected 0" in str(info.value)
    assert "1 to 63, below max_concurrency = 64" in str(info.value)
