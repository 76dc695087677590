""":class:`LedgerRow` against the ``requests`` table that each migration folder builds: the same
columns in the same order, ``NOT NULL`` exactly where the field cannot be ``None``, the storage
type of the field's Python type, and the schema's defaults as the fields' defaults."""

from __future__ import annotations

import types
import typing
from dataclasses import MISSING, fields
from typing import Any

from proxy.ledger.db import access
from proxy.ledger.db.location import Database
from proxy.ledger.db.migrate import open_database
from proxy.ledger.writing.ledger_row import COLUMNS, LedgerRow

# The storage type each backend's migrations give a field's Python type.
TYPES = {
    "sqlite": {str: {"TEXT"}, int: {"INTEGER"}, float: {"REAL"}},
    "postgresql": {str: {"text"}, int: {"integer", "bigint"}, float: {"double precision"}},
}


class Column(typing.NamedTuple):
    name: str
    type: str
    nullable: bool
    default: str | None


def table_columns(db: Database) -> list[Column]:
    """The ``requests`` table's columns in order, as the database itself describes them."""
    with access.connect(db) as conn:
        if not db.is_postgres:
            info = conn.query("PRAGMA table_info(requests)")
            return [
                Column(name, kind, not notnull, default)
                for _, name, kind, notnull, default, _ in info
            ]
        info = conn.query(
            "SELECT column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = 'requests' "
            "ORDER BY ordinal_position"
        )
        return [
            Column(name, kind, nullable == "YES", default) for name, kind, nullable, default in info
        ]


def field_types() -> dict[str, tuple[type, bool]]:
    """Each field's Python type without ``None``, and whether it may be ``None``."""
    out: dict[str, tuple[type, bool]] = {}
    for name, hint in typing.get_type_hints(LedgerRow).items():
        if isinstance(hint, types.UnionType):
            [base] = [a for a in typing.get_args(hint) if a is not type(None)]
            out[name] = (base, True)
        else:
            out[name] = (hint, False)
    return out


def test_the_requests_table_of_each_migration_folder_has_exactly_the_rows_fields(
    database: Database,
) -> None:
    open_database(database)
    columns = [c for c in table_columns(database) if c.name != "id"]
    assert [c.name for c in columns] == list(COLUMNS)
    kinds = field_types()
    backend = "postgresql" if database.is_postgres else "sqlite"
    for column in columns:
        base, optional = kinds[column.name]
        assert column.type in TYPES[backend][base], column
        # A column may be NOT NULL with a default and still be optional in no field.
        assert column.nullable == optional, column


def test_every_schema_default_is_the_fields_default(database: Database) -> None:
    open_database(database)
    defaults: dict[str, Any] = {f.name: f.default for f in fields(LedgerRow)}
    with_default = [c for c in table_columns(database) if c.default is not None and c.name != "id"]
    assert with_default, "no column has a default: the schema was not read"
    for column in with_default:
        assert defaults[column.name] is not MISSING, column
        assert float(column.default.strip("'")) == defaults[column.name], column


def test_a_row_names_every_column_and_only_them() -> None:
    row = LedgerRow(
        request_id="r", ts=1.0, route="api", reason="forced", status=200, latency_ms=2.0
    )
    assert tuple(row.as_dict()) == COLUMNS
    assert (
        row.as_dict()["endpoint"] == "chat.completions" and row.as_dict()["api_cost_pusd"] is None
    )
