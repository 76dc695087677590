"""What the engine's in-process tests share: the bundled SmolLM2, loaded once per module, and
an engine of a test's own settings, started for a block (:func:`started`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from proxy.config import LocalSettings
from proxy.engine.generate import LocalModel
from proxy.engine.local_engine import LocalEngine
from proxy.engine.model_files import bundled_model_path


@pytest.fixture(scope="module")
def model() -> Iterator[LocalModel]:
    loaded = LocalModel.load(bundled_model_path(), n_ctx=2048, n_threads=1, calibrate=False)
    yield loaded
    loaded.close()


@asynccontextmanager
async def started(**settings: Any) -> AsyncIterator[LocalEngine]:
    """An engine of these ``[local]`` settings, started, and stopped when the block ends."""
    own = LocalEngine(LocalSettings(**settings))
    await own.start()
    try:
        yield own
    finally:
        await own.stop()
