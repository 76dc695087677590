"""Where the ledger lives: a SQLite file or a PostgreSQL database, named by one URL.

    sqlite:///var/lib/frugal/frugal.db    a file (a bare path means the same)
    postgresql://frugal@db.internal/frugal?sslmode=require

``[ledger] url`` names it; when it is empty, ``[ledger] path`` is the SQLite file, as before.
A PostgreSQL URL never holds a password: :func:`parse` refuses one, naming ``[ledger]
password_env``, the environment variable the password is read from when a connection opens.
The password is passed to libpq as its own keyword, never formatted into a URL, so it cannot
reach a log or an error message; :meth:`Database.scrub` removes it from any text that might
quote a connection string all the same.

:class:`Database` is what every reader and writer of the ledger takes (a plain path or URL
string is accepted too, through :func:`as_database`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from proxy.errors import ConfigError

__all__ = ["Database", "as_database", "parse"]

SQLITE = "sqlite"
POSTGRES = "postgresql"
_PG_SCHEMES = ("postgresql", "postgres")


@dataclass(frozen=True, slots=True)
class Database:
    """One ledger database. ``path`` for SQLite; ``url`` (without a password) for PostgreSQL."""

    dialect: str  # "sqlite" | "postgresql"
    path: str = ""  # the SQLite file
    url: str = ""  # the PostgreSQL URL, as configured (it holds no password)
    password_env: str = ""  # the variable the PostgreSQL password is read from ("" for none)
    spill_base: str = ""  # rows no database took go to <spill_base>.rejected.jsonl

    @property
    def is_postgres(self) -> bool:
        return self.dialect == POSTGRES

    @property
    def label(self) -> str:
        """What messages and ``/healthz`` show: the file, or the URL (no password in it)."""
        return self.url if self.is_postgres else self.path

    def missing(self, not_yet: str) -> str | None:
        """Why a command cannot read this ledger before it even tries: its SQLite file is not
        there (the message says the proxy has not ``not_yet`` there yet). ``None`` when the file
        is there, and always on PostgreSQL, whose absence shows when it is reached."""
        if self.is_postgres or os.path.isfile(self.path):
            return None
        return (
            f"no ledger database at {self.path}: the proxy has not {not_yet} yet "
            "(or [ledger] path / --db points elsewhere)"
        )

    def connect_kwargs(self) -> dict[str, Any]:
        """psycopg's ``connect`` arguments: the URL, and the password from the environment."""
        kwargs: dict[str, Any] = {"conninfo": self.url, "connect_timeout": 5}
        password = self.password()
        if password:
            kwargs["password"] = password
        return kwargs

    def password(self) -> str:
        return os.environ.get(self.password_env, "") if self.password_env else ""

    def scrub(self, text: str) -> str:
        """``text`` with the password, should it appear, replaced by ``***``."""
        password = self.password()
        return text.replace(password, "***") if password else text


def parse(url_or_path: str, *, password_env: str = "", spill_base: str = "") -> Database:
    """A :class:`Database` from ``[ledger] url`` (or a ``--db`` argument): a ``sqlite:///``
    URL, a ``postgresql://`` URL, or a plain file path."""
    text = url_or_path.strip()
    if text.startswith("sqlite:"):
        if not text.startswith("sqlite:///") or len(text) == len("sqlite:///"):
            raise ConfigError(
                f"[ledger] url = {text!r}: expected sqlite:///PATH (three slashes, then the "
                "file; sqlite:////abs/path for an absolute one)"
            )
        path = text[len("sqlite:///") :]
        return Database(SQLITE, path=path, spill_base=spill_base or path)
    scheme = text.split(":", 1)[0].lower() if "://" in text else ""
    if scheme in _PG_SCHEMES:
        return _postgres(text, password_env, spill_base)
    if scheme:
        raise ConfigError(
            f"[ledger] url: the scheme {scheme!r} is not supported; expected sqlite:///PATH "
            "or postgresql://USER@HOST/DATABASE"
        )
    if not text:
        raise ConfigError("[ledger] path: expected a file path, got an empty string")
    return Database(SQLITE, path=text, spill_base=spill_base or text)


def _postgres(url: str, password_env: str, spill_base: str) -> Database:
    parts = urlsplit(url)
    if parts.password is not None or "password=" in unquote(parts.query).lower():
        raise ConfigError(
            "[ledger] url: holds a password; remove it from the URL and put it in an "
            "environment variable named by [ledger] password_env (e.g. password_env = "
            '"FRUGAL_DB_PASSWORD"), so that it never sits in a config file or a log'
        )
    where = f"{parts.scheme}://{parts.netloc}{parts.path}"
    if not parts.hostname and "host=" not in parts.query:
        raise ConfigError(f"[ledger] url = {where!r}: expected postgresql://USER@HOST/DATABASE")
    if password_env and password_env not in os.environ:
        raise ConfigError(
            f"[ledger] password_env = {password_env!r}: the variable is not set; export it "
            "with the database password, or leave password_env empty when the server needs none"
        )
    return Database(
        POSTGRES,
        url=url,
        password_env=password_env,
        spill_base=spill_base or "frugal-ledger",
    )


def as_database(target: str | Database, *, password_env: str = "") -> Database:
    """``target`` itself, or the database a path or URL string names."""
    if isinstance(target, Database):
        return target
    return parse(target, password_env=password_env)


def from_settings(ledger: Any) -> Database:
    """The database ``[ledger]`` names: ``url`` when set, else the file at ``path``."""
    url = getattr(ledger, "url", "") or ""
    return parse(
        url or ledger.path,
        password_env=getattr(ledger, "password_env", "") or "",
        spill_base=ledger.path,
    )


CLI_PASSWORD_ENV = "FRUGAL_DB_PASSWORD"


def from_argument(text: str) -> Database:
    """The database a ``--db`` option names (a file, ``sqlite:///`` or ``postgresql://``). A
    PostgreSQL password comes from ``$FRUGAL_DB_PASSWORD`` when it is set, else from libpq's
    own ``$PGPASSWORD`` or ``~/.pgpass``."""
    env = CLI_PASSWORD_ENV if CLI_PASSWORD_ENV in os.environ else ""
    return parse(text, password_env=env)
