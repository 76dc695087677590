"""What the engine's in-process tests share: the bundled SmolLM2, loaded once per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from proxy.engine.generate import LocalModel
from proxy.engine.model_files import bundled_model_path


@pytest.fixture(scope="module")
def model() -> Iterator[LocalModel]:
    loaded = LocalModel.load(bundled_model_path(), n_ctx=2048, n_threads=1, calibrate=False)
    yield loaded
    loaded.close()
