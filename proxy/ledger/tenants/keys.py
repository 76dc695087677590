"""Client keys: where they come from and how they are stored.

``frugal keys create | list | revoke`` (:mod:`proxy.cli.ledger`) is a thin command over
:func:`create`, :func:`listing` and :func:`revoke`.

Two sources, one namespace of names:

- the environment variable named by ``[server] api_keys_env`` (``FRUGAL_API_KEYS``): keys
  separated by commas, each ``name:key`` or a bare key (named ``key-1``, ``key-2``, … by
  position). A name may carry options after a ``;``: ``name;max_concurrency=4:key``, and
  ``name;admin:key`` for an admin key. Parsed by :func:`parse_env_keys`.
- the ``api_keys`` table of the ledger database (``migrations/0003_keys.sql``; SQLite or the
  PostgreSQL database that every replica shares), managed by the commands above. A key is 32
  random bytes; only its SHA-256 digest and a short hint (its first characters, to tell keys
  apart) are stored.

A plain SHA-256 is the right hash here: the keys are random and long, so there is nothing to
guess, and checking one costs a microsecond instead of a password hash's hundred milliseconds
on every request. Keys from the environment are held to at least 16 characters for the same
reason.

A stored key may carry limits (``migrations/0008_budgets_cache.sql``): a monthly budget of API
spend (:mod:`proxy.ledger.tenants.budgets`), requests per minute (:mod:`proxy.ledger.tenants.rpm`)
and the models it may ask for; the server reads them with the keys, so a change holds within a
refresh. It may also carry its share of the server's concurrency
(``migrations/0009_key_concurrency.sql``, ``--max-concurrency``; :mod:`proxy.server.shares`).

A key has a scope (``migrations/0010_key_scope.sql``). A client key, the default, reads only
its own figures: ``/v1/frugal/report`` and the dashboard count its own requests, and
``/metrics`` (unless ``[server] metrics_open``) and the full ``/healthz`` are refused to it. An
admin key (``--admin``) reads everything, every key's figures included. Keyless loopback mode has
no keys and no scopes: whoever reaches the port sees everything, as before.

A name is 1 to 64 letters, digits or ``_ . @ -``, matched whole (``fullmatch``): a newline or
any other control character is refused, so two keys can never show as the same name.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import sqlite3
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proxy.errors import ConfigError, UserError
from proxy.ledger.db import access
from proxy.ledger.db.location import Database, as_database
from proxy.ledger.db.migrate import open_database
from proxy.ledger.pricing import PUSD_PER_USD

KEY_PREFIX = "frugal-"
HINT_CHARS = len(KEY_PREFIX) + 4
MIN_ENV_KEY_CHARS = 16
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")  # always fullmatch: "$" allows "\n"


@dataclass(frozen=True, slots=True)
class ClientKey:
    name: str
    digest: bytes  # SHA-256 of the key
    monthly_budget_pusd: int | None = None  # API spend allowed per UTC month; None: no budget
    rpm: int | None = None  # requests per minute; None: no limit
    models: tuple[str, ...] | None = None  # the models it may ask for; None: any
    max_concurrency: int | None = None  # its requests in flight at most; None: the default
    key_id: int | None = None  # the api_keys row; None: a key of the environment's
    admin: bool = False  # reads every key's figures, /metrics and the full /healthz
    created_at: float | None = None  # when it was stored; None: a key of the environment's

    @property
    def identity(self) -> str:
        """What belongs to this key and no other (its cache entries, its share of the slots):
        the stored row's id, or the digest of an environment key. Never its name, which a
        revoked key hands on to the next key given it."""
        return f"id:{self.key_id}" if self.key_id is not None else "env:" + self.digest.hex()


MAX_BUDGET_USD = 1_000_000_000


def budget_pusd(usd: float) -> int:
    """``--monthly-budget-usd`` as pico-dollars."""
    if not 0 <= usd <= MAX_BUDGET_USD or usd != usd:
        raise KeyCommandError(
            f"--monthly-budget-usd {usd!r}: expected a number from 0 to {MAX_BUDGET_USD:,}"
        )
    from decimal import Decimal

    return int(Decimal(str(usd)) * PUSD_PER_USD)


def parse_models(text: str) -> tuple[str, ...]:
    """``--models gpt-4o-mini,local`` as names (at least one, none empty)."""
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",")))
    if not names or any(not name or len(name) > 256 for name in names):
        raise KeyCommandError(
            f"--models {text!r}: expected model names separated by commas, e.g. gpt-4o-mini,local"
        )
    return names


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        control = any(ord(c) < 32 or 127 <= ord(c) < 160 for c in name)
        raise ConfigError(
            f"key name {name!r}: "
            + ("a name may not hold a newline or any other control character; " if control else "")
            + "expected 1 to 64 letters, digits or _ . @ -, starting with a letter or digit"
        )
    return name


MAX_KEY_CONCURRENCY = 100_000


def check_concurrency(value: int | None, where: str = "--max-concurrency") -> int | None:
    """A key's share of the server's requests in flight: a whole number of at least 1."""
    if value is not None and not 1 <= value <= MAX_KEY_CONCURRENCY:
        raise KeyCommandError(
            f"{where} {value}: expected a whole number from 1 to {MAX_KEY_CONCURRENCY:,} (the "
            "server holds it below [server] max_concurrency, so that other keys keep a slot)"
        )
    return value


def _env_options(name: str, where: str) -> tuple[str, int | None, bool]:
    """``alice;max_concurrency=4;admin`` -> ("alice", 4, True): the options an entry may carry."""
    name, _, options = name.partition(";")
    share: int | None = None
    admin = False
    for option in filter(None, (o.strip() for o in options.split(";"))):
        field, _, value = option.partition("=")
        if option == "admin":
            admin = True
            continue
        if field.strip() != "max_concurrency" or not value.strip().isdigit():
            raise ConfigError(
                f"{where}: unknown option {field.strip()[:40]!r} after the name; expected "
                "name;max_concurrency=N:key or name;admin:key"
            )
        share = int(value)
        if not 1 <= share <= MAX_KEY_CONCURRENCY:
            raise ConfigError(
                f"{where}: max_concurrency={share}: expected a whole number from 1 to "
                f"{MAX_KEY_CONCURRENCY:,}"
            )
    return name, share, admin


def parse_env_keys(value: str, env_name: str) -> list[ClientKey]:
    """``"alice:KEY1, bob:KEY2, KEY3"`` → keys named alice, bob and key-3."""
    keys: list[ClientKey] = []
    names: set[str] = set()
    for position, entry in enumerate(value.split(","), start=1):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, key = entry.partition(":")
        if not sep:
            name, key = f"key-{position}", entry
        where = f"${env_name} (entry {position})"
        name, share, admin = _env_options(name, where) if sep else (name, None, False)
        if not NAME_RE.fullmatch(name):
            raise ConfigError(
                f"{where}: the name before ':' must be 1 to 64 letters, digits or _ . @ -; "
                "write entries as name:key or as a bare key"
            )
        key = key.strip()
        if len(key) < MIN_ENV_KEY_CHARS:
            raise ConfigError(
                f"{where}: the key named {name!r} is {len(key)} characters long; expected at "
                f"least {MIN_ENV_KEY_CHARS} (make one with: python3 -c "
                "'import secrets; print(secrets.token_urlsafe(32))')"
            )
        if name in names:
            raise ConfigError(f"{where}: the name {name!r} is given twice")
        names.add(name)
        keys.append(ClientKey(name, digest(key), max_concurrency=share, admin=admin))
    return keys


def env_keys(env_name: str) -> list[ClientKey]:
    """The keys in the variable named by ``[server] api_keys_env`` (none when it is unset)."""
    if not env_name:
        return []
    return parse_env_keys(os.environ.get(env_name, ""), env_name)


# -- the api_keys table ---------------------------------------------------------------------------
#
# On PostgreSQL every replica reads this one table, so a key created or revoked on any of them
# (or by `frugal keys --db postgresql://...`) holds everywhere at the next refresh of
# proxy/server/auth.py.


def _open(target: str | Database) -> Database:
    db = as_database(target)
    open_database(db)  # creates the database and applies migrations (0003 makes the table)
    return db


def create(
    target: str | Database,
    name: str,
    *,
    monthly_budget_pusd: int | None = None,
    rpm: int | None = None,
    models: tuple[str, ...] | None = None,
    max_concurrency: int | None = None,
    admin: bool = False,
) -> str:
    """Store a new key named ``name``; returns the key, which is never shown again."""
    check_name(name)
    if rpm is not None and rpm < 1:
        raise KeyCommandError(f"--rpm {rpm}: expected a whole number of at least 1")
    check_concurrency(max_concurrency)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    with access.connect(_open(target)) as conn:
        try:
            conn.execute(
                "INSERT INTO api_keys (name, key_hash, hint, created_at, monthly_budget_pusd, "
                "rpm, models, max_concurrency, admin) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    name,
                    digest(key).hex(),
                    key[:HINT_CHARS],
                    time.time(),
                    monthly_budget_pusd,
                    rpm,
                    ",".join(models) if models else None,
                    max_concurrency,
                    int(admin),
                ),
            )
        except access.Duplicate:
            raise KeyCommandError(
                f"a key named {name!r} exists already; revoke it first or choose another name"
            ) from None
    return key


def revoke(target: str | Database, name: str) -> None:
    with access.connect(_open(target)) as conn:
        changed = conn.execute(
            "UPDATE api_keys SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL",
            (time.time(), name),
        )
    if changed == 0:
        raise KeyCommandError(f"no usable key named {name!r}; see `frugal keys list`")


def listing(target: str | Database) -> list[dict[str, Any]]:
    """Every stored key, oldest first, with the requests the ledger attributes to its name."""
    with access.connect(_open(target)) as conn:
        usage = {
            name: (n, last)
            for name, n, last in conn.query(
                "SELECT key_name, count(*), max(ts) FROM requests "
                "WHERE key_name IS NOT NULL GROUP BY key_name"
            )
        }
        rows = conn.query(
            "SELECT name, hint, created_at, revoked_at, monthly_budget_pusd, rpm, models, "
            "max_concurrency, admin FROM api_keys ORDER BY id"
        )
    out = []
    for name, hint, created_at, revoked_at, budget, rpm, models, share, admin in rows:
        requests, last = usage.get(name, (0, None))
        out.append(
            {
                "name": name,
                "hint": hint + "…",
                "created": _iso(created_at),
                "revoked": _iso(revoked_at),
                "requests": int(requests),
                "last_used": _iso(last),
                "monthly_budget_usd": None if budget is None else int(budget) / PUSD_PER_USD,
                "rpm": rpm,
                "models": models.split(",") if models else None,
                "max_concurrency": None if share is None else int(share),  # None: the default
                "scope": "admin" if admin else "client",
            }
        )
    return out


def load_active(target: str | Database) -> tuple[list[ClientKey], int]:
    """(usable keys, number of keys ever stored). Read-only; the database must exist."""
    db = as_database(target)
    with access.connect(db, readonly=True) as conn:
        columns = conn.columns("api_keys")
        limits = "monthly_budget_pusd" in columns  # 0008 applied
        extra = ", monthly_budget_pusd, rpm, models" if limits else ", NULL, NULL, NULL"
        extra += ", max_concurrency" if "max_concurrency" in columns else ", NULL"  # 0009
        extra += ", admin" if "admin" in columns else ", 0"  # 0010
        rows = conn.query(
            f"SELECT id, name, key_hash, revoked_at, created_at{extra} FROM api_keys"  # noqa: S608
        )
    active = [
        ClientKey(
            name,
            bytes.fromhex(h),
            None if budget is None else int(budget),
            None if rpm is None else int(rpm),
            tuple(models.split(",")) if models else None,
            None if share is None else int(share),
            int(key_id),
            bool(admin),
            float(created),
        )
        for key_id, name, h, revoked, created, budget, rpm, models, share, admin in rows
        if revoked is None
    ]
    return active, len(rows)


def stored_count(target: str | Database) -> int:
    """Keys ever stored (revoked ones included); 0 when there is no database yet.

    A database that exists but whose keys cannot be read (damaged, locked, not a database,
    a PostgreSQL server that cannot be reached) is a :class:`ConfigError`, never "no keys":
    taking it for none would start an open proxy.
    """
    db = as_database(target)
    if db.is_postgres:
        open_database(db)  # the table exists from here on; an unreachable server is an error
        try:
            return load_active(db)[1]
        except ValueError as exc:  # a key_hash that is not hex
            raise _unreadable(db.label, exc) from exc
    if not Path(db.path).exists():
        return 0
    try:
        return load_active(db)[1]
    except sqlite3.OperationalError as exc:
        if "no such table: api_keys" in str(exc):  # a database from before 0003: no keys
            return 0
        raise _unreadable(db.path, exc) from exc
    except (sqlite3.Error, ValueError) as exc:  # ValueError: a key_hash that is not hex
        raise _unreadable(db.path, exc) from exc


def _unreadable(db_path: str, exc: Exception) -> ConfigError:
    return ConfigError(
        f"[ledger] path = {db_path!r}: the stored client keys cannot be read "
        f"({type(exc).__name__}: {exc}); not starting, since without them anyone could use "
        "the proxy. Repair or restore the database, or stop whatever holds it locked"
    )


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


class KeyCommandError(UserError):
    """A ``frugal keys`` request that cannot be done; printed as one line, exit status 1."""

    label = "frugal keys"
