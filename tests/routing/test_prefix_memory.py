"""The share of a prompt a backend has probably cached (proxy.routing.prefix_memory)."""

from __future__ import annotations

from proxy.routing.prefix_memory import PrefixMemory, shared_prefix


def test_cached_share_is_the_longest_prefix_shared_with_a_recent_prompt() -> None:
    memory = PrefixMemory()
    system = {"role": "system", "content": "You are a careful assistant. " * 20}
    first = {"messages": [system, {"role": "user", "content": "What is 2 + 2?"}]}
    assert memory.cached_share(first) == 0.0
    memory.remember(first)
    second = {"messages": [system, {"role": "user", "content": "Name a colour."}]}
    assert 0.85 < memory.cached_share(second) < 0.99
    assert memory.cached_share({"messages": [{"role": "user", "content": "hi"}]}) == 0.0
    assert shared_prefix("abcdef", "abcxyz") == 3
    assert shared_prefix("", "abc") == 0
