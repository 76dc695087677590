"""[audit] settings: defaults, the budget in pico-dollars, and errors that name the key."""

from __future__ import annotations

import dataclasses

import pytest

from proxy.config.audit_settings import PICO_PER_USD, AuditSettings
from proxy.errors import ConfigError
from proxy.ledger.pricing import PUSD_PER_USD


def test_defaults_are_the_issues() -> None:
    s = AuditSettings()
    assert (s.rate, s.monthly_budget_usd, s.judge_model, s.correctness, s.max_pending) == (
        0.02,
        5.0,
        "",
        "strict",
        64,
    )
    assert s.enabled
    assert s.monthly_budget_pusd == 5 * 10**12


def test_the_audit_budget_is_counted_in_the_ledgers_unit() -> None:
    # two names for one unit, because these settings sit below the ledger in the import layers
    assert PICO_PER_USD == PUSD_PER_USD
    assert AuditSettings(monthly_budget_usd=0.000001).monthly_budget_pusd * 10**6 == PUSD_PER_USD


def test_settings_are_frozen_and_keyword_only() -> None:
    s = AuditSettings(rate=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.rate = 0.5  # type: ignore[misc]
    with pytest.raises(TypeError):
        AuditSettings(0.5)  # type: ignore[call-arg]


def test_budget_is_exact_in_pico_dollars() -> None:
    assert AuditSettings(monthly_budget_usd=0.1).monthly_budget_pusd == 100_000_000_000
    assert AuditSettings(monthly_budget_usd=0.3).monthly_budget_pusd == 300_000_000_000


def test_judge_defaults_to_the_requested_model() -> None:
    assert AuditSettings().judge_for("gpt-4o-mini") == "gpt-4o-mini"
    assert AuditSettings(judge_model="gpt-4o").judge_for("gpt-4o-mini") == "gpt-4o"


def test_zero_rate_or_zero_budget_turns_audits_off() -> None:
    assert not AuditSettings(rate=0.0).enabled
    assert not AuditSettings(monthly_budget_usd=0.0).enabled


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"rate": 1.5}, "[audit] rate = 1.5"),
        ({"rate": -0.1}, "[audit] rate = -0.1"),
        ({"rate": float("nan")}, "[audit] rate = nan"),
        ({"rate": True}, "[audit] rate = True"),
        ({"monthly_budget_usd": -1.0}, "[audit] monthly_budget_usd = -1.0"),
        ({"judge_model": 3}, "[audit] judge_model = 3"),
        ({"correctness": "lenient"}, "[audit] correctness = 'lenient'"),
        ({"max_pending": 0}, "[audit] max_pending = 0"),
        ({"max_pending": 2.5}, "[audit] max_pending = 2.5"),
    ],
)
def test_a_bad_value_names_its_key(values: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        AuditSettings(**values)  # type: ignore[arg-type]
    assert str(caught.value).startswith(key + ":")
    assert "expected" in str(caught.value)
