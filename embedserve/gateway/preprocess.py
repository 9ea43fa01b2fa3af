"""Turn request inputs into packed token ids: prompts, tokenization, limits.

Owns applying a prompt template, running the tokenizer off the event loop
(in a small executor; the Numba encoder releases the GIL), adding the
model's special tokens around raw token ids, and the length rules: cut on
request (``truncate`` and its direction) or refuse with ``InputTooLong``
naming the input index and its length. Knows nothing about replicas.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor

import numpy as np

from embedserve.errors import InputTooLong, InvalidInput
from embedserve.gateway.dispatch import Packed
from embedserve.gateway.model_meta import ModelMeta


class Preprocessor:
    def __init__(self, tokenizer, meta: ModelMeta, executor: Executor) -> None:
        self.tokenizer = tokenizer
        self.meta = meta
        self._executor = executor
        # The single-sequence template, read off the tokenizer: encoding ""
        # gives just the specials (<s> </s> for XLM-R, [CLS] [SEP] for BERT).
        specials = np.asarray(tokenizer.encode_batch([""]).ids, dtype=np.int32)
        self._prefix, self._suffix = specials[:1], specials[1:]

    @property
    def template_sizes(self) -> tuple[int, int]:
        """Special tokens the single-sequence template puts before and after the text."""
        return len(self._prefix), len(self._suffix)

    async def _run(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def encode_texts(self, texts: Sequence[str], prompt: str, truncate: bool,
                           direction: str, field: str, return_offsets: bool = False,
                           add_special_tokens: bool = True, check_length: bool = True):
        """Tokenize ``prompt + text`` for each text; an EncodedBatch within limits."""
        check_texts(texts, field)
        prompted = [prompt + t for t in texts] if prompt else list(texts)
        limit = self.meta.max_positions
        encoded = await self._run(self.tokenizer.encode_batch, prompted,
                                  max_length=limit if truncate else None,
                                  truncation=direction.lower() if truncate else None,
                                  add_special_tokens=add_special_tokens,
                                  return_offsets=return_offsets)
        if check_length and not truncate:
            check_lengths(np.diff(encoded.cu_seqlens), limit, field)
        return encoded

    async def pack_texts(self, texts: Sequence[str], prompt: str, truncate: bool,
                         direction: str, field: str) -> Packed:
        encoded = await self.encode_texts(texts, prompt, truncate, direction, field)
        return Packed(np.asarray(encoded.ids, dtype=np.int32), np.asarray(encoded.cu_seqlens, dtype=np.int32))

    def pack_ids(self, sequences: Sequence[Sequence[int]], truncate: bool, direction: str,
                 field: str) -> Packed:
        """Raw token ids (no specials) -> sequences wrapped in the model's specials."""
        limit = self.meta.max_positions
        room = limit - len(self._prefix) - len(self._suffix)
        parts: list[np.ndarray] = []
        lengths = np.empty(len(sequences), dtype=np.int32)
        for i, seq in enumerate(sequences):
            try:
                ids = np.asarray(seq, dtype=np.int64)
            except OverflowError:  # an id beyond int64: out of the vocabulary, not a crash
                raise InvalidInput(f"{field}[{i}] has a token id outside [0, {self.meta.vocab_size})",
                                   field=f"{field}[{i}]") from None
            if ids.size == 0:
                raise InvalidInput(f"{field}[{i}] is an empty list of token ids", field=f"{field}[{i}]")
            if int(ids.min()) < 0 or int(ids.max()) >= self.meta.vocab_size:
                raise InvalidInput(f"{field}[{i}] has a token id outside [0, {self.meta.vocab_size})",
                                   field=f"{field}[{i}]")
            if ids.size > room:
                if not truncate:
                    raise InputTooLong(f"{field}[{i}] has {ids.size + limit - room} tokens with special "
                                       f"tokens; the limit is {limit} (set truncate to cut it)",
                                       index=i, length=int(ids.size + limit - room), limit=limit,
                                       field=f"{field}[{i}]")
                ids = ids[:room] if direction.lower() == "right" else ids[-room:]
            parts += [self._prefix, ids.astype(np.int32), self._suffix]
            lengths[i] = ids.size + limit - room
        cu = np.zeros(len(sequences) + 1, dtype=np.int32)
        np.cumsum(lengths, out=cu[1:])
        return Packed(np.concatenate(parts), cu)

    async def pack_pairs(self, query: str, docs: Sequence[str], truncate: bool, direction: str,
                         field: str) -> Packed:
        """``<s> query </s></s> doc </s>`` per document, for the reranker."""
        check_texts([query], "query")
        check_texts(docs, field)
        limit = self.meta.max_positions
        encoded = await self._run(self.tokenizer.encode_pairs, query, list(docs),
                                  max_length=limit if truncate else None,
                                  truncation=direction.lower() if truncate else None)
        if not truncate:
            check_lengths(np.diff(encoded.cu_seqlens), limit, field)
        type_ids = getattr(encoded, "token_type_ids", None)
        return Packed(np.asarray(encoded.ids, dtype=np.int32), np.asarray(encoded.cu_seqlens, dtype=np.int32),
                      None if type_ids is None else np.asarray(type_ids, dtype=np.int32))


def check_texts(texts: Sequence[str], field: str) -> None:
    if len(texts) == 0:
        raise InvalidInput(f"{field} must not be empty", field=field)
    for i, text in enumerate(texts):
        if not text:
            name = field if len(texts) == 1 and field == "query" else f"{field}[{i}]"
            raise InvalidInput(f"{name} is an empty string", field=name)


def check_lengths(lengths: np.ndarray, limit: int, field: str) -> None:
    too_long = np.flatnonzero(lengths > limit)
    if too_long.size:
        i = int(too_long[0])
        more = f" ({too_long.size} inputs are too long)" if too_long.size > 1 else ""
        raise InputTooLong(f"{field}[{i}] has {int(lengths[i])} tokens; the limit is {limit} "
                           f"(set truncate to cut it){more}", index=i, length=int(lengths[i]),
                           limit=limit, field=f"{field}[{i}]")
