"""The combiner the worker scores with: the shipped weights, or ``[quality] weights_path``.

A calibrated file (``frugal calibrate``) is tagged with the SHA-256 of the model file it was
fitted for; :meth:`GateWeights.start` refuses one tagged for another model, or a corrupt one
(:class:`quality.combiner.WeightsError`, which the worker reports as a fatal start error). With
``[quality] auto_calibrate`` the file may not exist yet (the shipped weights serve until the
first refit), and a new file written later is picked up on the next answer: the worker looks at
its modification time and size before each score (one ``stat``), and loads it again when they
changed. A new file that fails to load then keeps the weights in use, and says why in
:attr:`GateWeights.problem`.
"""

from __future__ import annotations

import os

from quality.combiner import Combiner, WeightsError, file_sha256


class GateWeights:
    def __init__(self, path: str, model_path: str, *, optional: bool = False) -> None:
        self.path = path
        self.model_path = model_path
        self.optional = optional  # auto_calibrate: a missing file means "not refitted yet"
        self.combiner: Combiner | None = None  # None: the shipped weights
        self.problem: str | None = None
        self._seen: tuple[int, int] | None = None
        self._model_sha256: str | None = None

    def start(self) -> dict[str, object]:
        """Load the file now; raises :class:`WeightsError`. What was loaded, for ``/healthz``."""
        if self.path:
            stamp = self._stamp()
            if stamp is None and not self.optional:
                raise WeightsError(f"[quality] weights_path = {self.path!r}: no such file")
            if stamp is not None:
                self._load(stamp)
        return self.info()

    def info(self) -> dict[str, object]:
        return {"path": self.path or None, "calibrated": self.combiner is not None}

    def current(self) -> Combiner | None:
        """The combiner to score with now (None: the shipped one)."""
        if not self.path:
            return None
        stamp = self._stamp()
        if stamp is not None and stamp != self._seen:
            try:
                self._load(stamp)
            except WeightsError as exc:
                self._seen = stamp  # tried once; the weights in use stay
                self.problem = str(exc)
        return self.combiner

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _load(self, stamp: tuple[int, int]) -> None:
        if self._model_sha256 is None:
            self._model_sha256 = file_sha256(self.model_path)
        self.combiner = Combiner.load_for_model(
            self.path, self.model_path, model_sha256=self._model_sha256
        )
        self._seen = stamp
        self.problem = None
