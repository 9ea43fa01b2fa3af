"""Turn request inputs into packed token ids: prompts, tokenization, limits.

Owns applying a prompt template, running the tokenizer off the event loop
(in a small executor; the Numba encoder releases the GIL) unless the texts
are short enough that the two thread hops would cost more than the
tokenization itself (``INLINE_MAX_CHARS``), adding the
model's special tokens around raw token ids, and the length rules: cut on
request (``truncate`` and its direction) or refuse with ``InputTooLong``
naming the input index and its length, or cut into windows to be pooled
(the policy is ``long_inputs``'s, the windows ``model/windows``', the
server's default held here). Knows nothing about replicas.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor

import numpy as np

from embedserve import ragged, validate
from embedserve.errors import InvalidInput
from embedserve.gateway import long_inputs
from embedserve.gateway.long_inputs import LongInputPolicy
from embedserve.model import llm_reranker
from embedserve.model.info import ModelInfo
from embedserve.model.windows import Windows, cut_windows
from embedserve.ragged import RaggedBatch
from embedserve.tokenizer import EncodedBatch, TokenizerBackend

# Texts up to this many characters in all are tokenized on the event loop: a
# one-sentence query takes tens of microseconds there, while handing it to the
# executor and back costs two thread wake-ups (hundreds on a busy machine).
# A few KB block the loop for well under a millisecond.
INLINE_MAX_CHARS = 2048


class Preprocessor:
    def __init__(self, tokenizer: TokenizerBackend, model: ModelInfo, executor: Executor,
                 auto_truncate: str = "refuse", chunk_overlap: int = 0) -> None:
        """``auto_truncate``/``chunk_overlap``: the server's long-input policy (its flags);
        ValueError when they do not fit this model, so a bad flag fails at start-up."""
        self.tokenizer = tokenizer
        self.model = model
        self._executor = executor
        # The single-sequence template's specials: <s> / </s> for XLM-R, [CLS] / [SEP]
        # for BERT, none / <|endoftext|> for Qwen3-Embedding.
        self._prefix, self._suffix = tokenizer.single_specials
        self._llm_affixes: tuple[np.ndarray, np.ndarray] | None = None   # an LLM reranker's prompt ends
        self.long_input_default = long_inputs.server_policy(auto_truncate, chunk_overlap,
                                                            self.window_room)

    @property
    def template_sizes(self) -> tuple[int, int]:
        """Special tokens the single-sequence template puts before and after the text."""
        return len(self._prefix), len(self._suffix)

    @property
    def window_room(self) -> int:
        """Content tokens one sequence of the model holds besides the template's specials."""
        return self.model.max_positions - len(self._prefix) - len(self._suffix)

    def long_input_policy(self, truncate: bool | str | None, direction: str | None,
                          overlap: int | None) -> LongInputPolicy:
        """A request's long-input fields over the server's default (400 naming a bad one)."""
        return long_inputs.resolve_policy(self.long_input_default, truncate, direction, overlap,
                                          self.window_room)

    def cut_windows(self, packed: RaggedBatch, overlap: int) -> Windows:
        """``packed`` (specials included) as windows of the model's length."""
        return cut_windows(packed, len(self._prefix), len(self._suffix), self.model.max_positions,
                           overlap)

    async def _run(self, chars: int, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` for inputs of ``chars`` characters: here when short, else
        in the executor."""
        if chars <= INLINE_MAX_CHARS:
            return fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def encode_texts(self, texts: Sequence[str], prompt: str, truncate: bool,
                           direction: str, field: str, return_offsets: bool = False,
                           add_special_tokens: bool = True, check_length: bool = True,
                           max_length: int | None = None) -> EncodedBatch:
        """Tokenize ``prompt + text`` for each text; an EncodedBatch within limits (the model's
        window, or ``max_length`` when given: a multi-vector model's per-task length)."""
        check_texts(texts, field)
        prompted = [prompt + t for t in texts] if prompt else list(texts)
        limit = max_length or self.model.max_positions
        encoded = await self._run(sum(map(len, prompted)), self.tokenizer.encode_batch, prompted,
                                  max_length=limit if truncate else None,
                                  truncation=direction.lower() if truncate else None,
                                  add_special_tokens=add_special_tokens,
                                  return_offsets=return_offsets)
        if check_length and not truncate:
            validate.check_lengths(encoded.lengths, limit, field)
        return encoded

    def pack_ids(self, sequences: Sequence[Sequence[int]], truncate: bool, direction: str,
                 field: str, check_length: bool = True) -> RaggedBatch:
        """Raw token ids (no specials) -> sequences wrapped in the model's specials.

        Too long: cut when ``truncate``, else refused when ``check_length``,
        else kept whole (to be cut into windows).
        """
        raw = [_int64_ids(seq, i, self.model.vocab_size, field) for i, seq in enumerate(sequences)]
        for i, ids in enumerate(raw):
            if ids.size == 0:
                raise InvalidInput(f"{field}[{i}] is an empty list of token ids", field=f"{field}[{i}]")
        raw_lengths = np.array([ids.size for ids in raw], dtype=np.int64)
        validate.check_token_ids(np.concatenate(raw), ragged.cu_seqlens_from_lengths(raw_lengths),
                                 self.model.vocab_size, field)
        specials = len(self._prefix) + len(self._suffix)
        if check_length and not truncate:
            validate.check_lengths(raw_lengths + specials, self.model.max_positions, field)
        room = self.window_room
        from_right = direction.lower() == "right"
        kept = [ids if not truncate or ids.size <= room else ids[:room] if from_right else ids[-room:]
                for ids in raw]
        parts = [part for ids in kept for part in (self._prefix, ids.astype(np.int32), self._suffix)]
        lengths = np.array([ids.size for ids in kept], dtype=np.int64) + specials
        return ragged.from_lengths(np.concatenate(parts), lengths)

    async def pack_pairs(self, query: str, docs: Sequence[str], truncate: bool, direction: str,
                         field: str, instruction: str | None = None) -> RaggedBatch:
        """The model's pair template per document, for the reranker: ``<s> query </s></s> doc </s>``
        (XLM-R) or ``[CLS] query [SEP] doc [SEP]`` with segment ids 0 then 1 (BERT), which
        the batch carries as ``token_type_ids`` to the scheduler; an LLM reranker's prompt
        (``instruction`` in it) for a decoder reranker."""
        check_texts([query], "query")
        check_texts(docs, field)
        if self.model.pair_template:
            return await self._pack_prompted_pairs(query, docs, truncate, direction, field, instruction)
        if instruction is not None:
            raise InvalidInput("instruction applies to an LLM reranker's prompt; this model takes "
                               "plain pairs", field="instruction")
        limit = self.model.max_positions
        encoded = await self._run(len(query) + sum(map(len, docs)),
                                  self.tokenizer.encode_pairs, query, list(docs),
                                  max_length=limit if truncate else None,
                                  truncation=direction.lower() if truncate else None)
        if not truncate:
            validate.check_lengths(encoded.lengths, limit, field)
        return encoded


    async def _pack_prompted_pairs(self, query: str, docs: Sequence[str], truncate: bool,
                                   direction: str, field: str, instruction: str | None) -> RaggedBatch:
        """Qwen3-Reranker's prompt per document (model/llm_reranker.py): the fixed prefix's
        ids, the formatted pair's ids (cut to the room the prefix and suffix leave, when
        ``truncate``), the fixed suffix's ids, as the model card joins them."""
        if self._llm_affixes is None:
            markers = dict(self.model.prompt_markers)

            def encode(texts: Sequence[str]) -> list[np.ndarray]:
                batch = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
                return [batch.sequence(i) for i in range(batch.num_sequences)]

            self._llm_affixes = (llm_reranker.encode_with_markers(llm_reranker.PREFIX, markers, encode),
                                 llm_reranker.encode_with_markers(llm_reranker.SUFFIX, markers, encode))
        prefix, suffix = self._llm_affixes
        room = self.model.max_positions - len(prefix) - len(suffix)
        texts = [llm_reranker.format_pair(query, doc, instruction) for doc in docs]
        encoded = await self._run(sum(map(len, texts)), self.tokenizer.encode_batch, texts,
                                  max_length=room if truncate else None,
                                  truncation=direction.lower() if truncate else None,
                                  add_special_tokens=False)
        if not truncate:
            validate.check_lengths(encoded.lengths, room, field)
        parts = [part for i in range(encoded.num_sequences) for part in (prefix, encoded.sequence(i), suffix)]
        return ragged.from_lengths(np.concatenate(parts).astype(np.int32),
                                   encoded.lengths.astype(np.int64) + len(prefix) + len(suffix))


def check_texts(texts: Sequence[str], field: str) -> None:
    if len(texts) == 0:
        raise InvalidInput(f"{field} must not be empty", field=field)
    for i, text in enumerate(texts):
        if not text:
            name = field if len(texts) == 1 and field == "query" else f"{field}[{i}]"
            raise InvalidInput(f"{name} is an empty string", field=name)


def _int64_ids(sequence: Sequence[int], index: int, vocab_size: int, field: str) -> np.ndarray:
    try:
        return np.asarray(sequence, dtype=np.int64)
    except OverflowError:  # an id beyond int64: out of the vocabulary, not a crash
        token_id = next(v for v in sequence if not -2**63 <= v < 2**63)
        raise validate.outside_vocabulary(index, token_id, vocab_size, field) from None
