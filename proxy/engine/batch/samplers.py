"""The grammars of the batch's sequences: a llama.cpp grammar sampler each, on numpy logits.

The single path hands its grammar to ``Llama.generate``; the batch samples each row itself, so
each constrained sequence gets its own ``llama_sampler`` (made from the request's
``LlamaGrammar``), which masks a row's logits in place (``-inf`` for every token the grammar
does not allow next) and is told each token that was picked.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["GrammarMasks"]

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class GrammarMasks:
    """Makes, applies, advances and frees the grammar samplers of one model's sequences."""

    def __init__(self, lib: Any, llm: Any, n_vocab: int) -> None:
        self._lib = lib
        self._vocab = llm._model.vocab
        self.n_vocab = n_vocab
        self._data = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        self._data["id"] = np.arange(n_vocab, dtype=np.int32)

    def new(self, grammar: Any) -> Any:
        """A grammar sampler for a ``LlamaGrammar``; ValueError when llama.cpp cannot parse it."""
        sampler = self._lib.llama_sampler_init_grammar(
            self._vocab, grammar._grammar.encode("utf-8"), grammar._root.encode()
        )
        if not sampler:
            raise ValueError("llama.cpp could not parse the grammar of this request")
        return sampler

    def apply(self, sampler: Any, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """``logits`` with every token the grammar does not allow next at ``-inf``."""
        data = self._data
        data["logit"] = logits
        data["p"] = 0.0
        array = self._lib.llama_token_data_array(
            data=ctypes.cast(data.ctypes.data, self._lib.llama_token_data_p),
            size=self.n_vocab,
            selected=-1,
            sorted=False,
        )
        self._lib.llama_sampler_apply(sampler, ctypes.byref(array))
        # The sampler masks in place (logit -inf) and keeps the order when nothing was sorted.
        out = np.full(self.n_vocab, -np.inf, dtype=np.float32)
        size = int(array.size)
        out[data["id"][:size]] = data["logit"][:size]
        return out

    def accept(self, sampler: Any, token: int) -> None:
        """Advance the grammar past the token that was picked."""
        self._lib.llama_sampler_accept(sampler, token)

    def free(self, sampler: Any) -> None:
        self._lib.llama_sampler_free(sampler)
