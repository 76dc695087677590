"""``[batch]`` (proxy/config/batch_settings.py): loaded from TOML, its ranges checked when it is
made, each error naming the key, the value and what was expected."""

from __future__ import annotations

import re
from typing import Any

import pytest

from proxy import config
from proxy.config import BatchSettings
from proxy.errors import ConfigError


def test_the_batch_section_loads_with_its_defaults_and_its_values() -> None:
    assert config.from_dict({}).batch == BatchSettings()
    assert BatchSettings().fallback == "batch"
    loaded = config.from_dict(
        {"batch": {"fallback": "flex", "poll_interval_s": 1, "max_output_bytes": 4096}}
    )
    assert loaded.batch.fallback == "flex"
    assert loaded.batch.poll_interval_s == 1.0 and loaded.batch.max_output_bytes == 4096


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"fallback": "later"}, "[batch] fallback = 'later': expected one of \"batch\""),
        ({"poll_interval_s": 0.0}, "[batch] poll_interval_s = 0.0: expected a number of seconds"),
        (
            {"poll_interval_s": 10.0, "max_poll_interval_s": 5.0},
            "[batch] max_poll_interval_s = 5.0: expected a number of seconds from 10.0",
        ),
        ({"max_output_bytes": 10}, "[batch] max_output_bytes = 10: expected an integer of at"),
        ({"sync_concurrency": 0}, "[batch] sync_concurrency = 0: expected an integer from 1"),
    ],
)
def test_a_bad_batch_value_names_the_key(values: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        config.from_dict({"batch": values})
    with pytest.raises(ConfigError, match=re.escape(needle)):
        BatchSettings(**values)


def test_an_unknown_batch_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=re.escape("[batch] window: unknown key")):
        config.from_dict({"batch": {"window": "24h"}})
