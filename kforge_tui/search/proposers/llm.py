"""The LLM proposer: one candidate per call to any litellm model (hosted or local).

Failure is data here, not an exception: prose without code, a truncated answer, HTTP 429/5xx
after retries, a timeout, a refused connection — each returns `Proposal(source=None,
error="one line")`, which the engine records as a failed node, so a flaky provider costs budget,
never the run. Retries are ours (litellm's and the OpenAI SDK's are turned off) so that the
policy is one place: exponential backoff with full jitter, Retry-After respected when the
server sends it, at most `max_retries` retries after the first attempt.

litellm is imported lazily (it takes seconds to import) with its local cost map, so neither
`kforge --help` nor an air-gapped machine touches the network at import.
"""
from __future__ import annotations

import asyncio
import os
import random
import socket
import time
from urllib.parse import urlparse

from kforge_tui.errors import UsageError
from kforge_tui.search import prompts
from kforge_tui.search.proposers.base import Proposal, ProposalContext

MAX_CHILDREN = 6  # children one node may get from the LLM before can_expand() says no
MAX_BACKOFF_S = 60.0
_NO_KEY = "sk-no-key"  # local OpenAI-compatible servers ignore the key but the SDK wants one


def _litellm():
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm

    litellm.suppress_debug_info = True  # no "Provider List: ..." banners on stdout
    litellm.telemetry = False
    return litellm


def _one_line(e: BaseException | str, limit: int = 240) -> str:
    s = " ".join(str(e).split())
    return s[:limit] + ("..." if len(s) > limit else "")


def _status_of(e: BaseException) -> int | None:
    code = getattr(e, "status_code", None)
    return code if isinstance(code, int) else None


def _retry_after(e: BaseException) -> float | None:
    """Seconds from a Retry-After (or retry-after-ms) header of the failed response, if any."""
    for headers in (getattr(e, "litellm_response_headers", None),
                    getattr(getattr(e, "response", None), "headers", None),
                    getattr(e, "headers", None)):
        if not headers:
            continue
        try:
            ms = headers.get("retry-after-ms")
            if ms is not None:
                return float(ms) / 1000.0
            v = headers.get("retry-after")
            if v is not None:
                return float(v)
        except (TypeError, ValueError):
            continue  # an HTTP-date Retry-After: fall back to our own backoff
    return None


def _retryable(e: BaseException) -> bool:
    if isinstance(e, (asyncio.TimeoutError, TimeoutError, ConnectionError)):
        return True
    name = type(e).__name__
    if name in ("Timeout", "APITimeoutError", "APIConnectionError", "RateLimitError",
                "InternalServerError", "ServiceUnavailableError", "BadGatewayError"):
        return True
    code = _status_of(e)
    return code is not None and (code == 429 or code == 408 or code >= 500)


def _describe_failure(e: BaseException, timeout_s: float) -> str:
    if isinstance(e, (asyncio.TimeoutError, TimeoutError)) or type(e).__name__ in (
            "Timeout", "APITimeoutError"):
        return f"timed out after {timeout_s:g} s"
    code = _status_of(e)
    kind = type(e).__name__
    msg = _one_line(e, 160)
    return f"HTTP {code} {kind}: {msg}" if code else f"{kind}: {msg}"


class LLMProposer:
    """Proposer (search/proposers/base.py) backed by `litellm.acompletion`.

    Totals over the proposer's life (`calls`, `failures`, `prompt_tokens`, `completion_tokens`,
    `cost_usd`, `attempts`) are kept for the run; each Proposal also carries its own.
    """

    def __init__(self, model: str, *, api_base: str | None = None, api_key: str | None = None,
                 timeout_s: float = 120.0, max_retries: int = 3, concurrency: int = 4,
                 temperature: float = 0.7, stream: bool = False, max_tokens: int = 8192,
                 max_children: int = MAX_CHILDREN, backoff_s: float = 1.0,
                 max_backoff_s: float = MAX_BACKOFF_S, seed: int | None = None):
        self.model = model
        self.name = model
        self.api_base = api_base
        self.api_key = api_key
        self.timeout_s = float(timeout_s)
        self.max_retries = max(0, int(max_retries))
        self.temperature = temperature
        self.stream = stream
        self.max_tokens = max_tokens
        self.max_children = max_children
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._sem = asyncio.Semaphore(max(1, int(concurrency)))
        self._rng = random.Random(seed)
        self.calls = self.failures = self.attempts = 0
        self.prompt_tokens = self.completion_tokens = 0
        self.cost_usd = 0.0

    # -------------------------------------------------------------- Proposer API

    def can_expand(self, ctx: ProposalContext) -> bool:
        return len(ctx.siblings) < self.max_children

    async def propose(self, ctx: ProposalContext) -> Proposal:
        mode = ctx.mode if ctx.mode in ("root", "improve", "repair") else "improve"
        action = f"llm:{mode}"
        try:
            messages = prompts.build_messages(ctx)
        except Exception as e:  # a malformed context is a failed proposal, not a crash
            return self._account(Proposal(None, action, self.model,
                                          error=f"could not build the prompt: {_one_line(e)}"))
        prompt = prompts.render_prompt(messages)
        async with self._sem:
            text, finish, usage, cost, err = await self._complete(messages)
        prop = Proposal(None, action, self.model, prompt=prompt, response=text,
                        prompt_tokens=usage[0], completion_tokens=usage[1], cost_usd=cost)
        if err is not None:
            prop.error = err
        else:
            prop.source, prop.error = prompts.extract_code(text, finish)
        return self._account(prop)

    def _account(self, p: Proposal) -> Proposal:
        self.calls += 1
        self.failures += p.source is None
        self.prompt_tokens += p.prompt_tokens
        self.completion_tokens += p.completion_tokens
        self.cost_usd += p.cost_usd
        return p

    def totals(self) -> dict:
        return {"calls": self.calls, "failures": self.failures, "attempts": self.attempts,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cost_usd": self.cost_usd}

    # -------------------------------------------------------------- the call

    def _kwargs(self, messages: list[dict]) -> dict:
        kw = dict(model=self.model, messages=messages, temperature=self.temperature,
                  max_tokens=self.max_tokens, timeout=self.timeout_s, max_retries=0,
                  num_retries=0)
        if self.api_base:
            kw["api_base"] = self.api_base
        key = self.api_key
        if key is None and self.api_base and self.model.startswith(("openai/", "hosted_vllm/")) \
                and not os.environ.get("OPENAI_API_KEY"):
            key = _NO_KEY
        if key:
            kw["api_key"] = key
        if self.stream:
            kw["stream"] = True
            kw["stream_options"] = {"include_usage": True}
        return kw

    async def _once(self, litellm, messages: list[dict]):
        """One HTTP round trip -> (text, finish_reason, (prompt_tokens, completion_tokens), cost)."""
        resp = await litellm.acompletion(**self._kwargs(messages))
        if self.stream:
            parts: list[str] = []
            finish, usage = None, None
            async for chunk in resp:
                if getattr(chunk, "usage", None):
                    usage = chunk.usage
                for ch in chunk.choices or ():
                    if ch.delta is not None and ch.delta.content:
                        parts.append(ch.delta.content)
                    if ch.finish_reason:
                        finish = ch.finish_reason
            text = "".join(parts)
            ptok = int(getattr(usage, "prompt_tokens", 0) or 0)
            ctok = int(getattr(usage, "completion_tokens", 0) or 0)
            cost = self._cost(litellm, prompt_tokens=ptok, completion_tokens=ctok)
            return text, finish, (ptok, ctok), cost
        choice = resp.choices[0]
        text = choice.message.content or ""
        usage = getattr(resp, "usage", None)
        ptok = int(getattr(usage, "prompt_tokens", 0) or 0)
        ctok = int(getattr(usage, "completion_tokens", 0) or 0)
        return text, choice.finish_reason, (ptok, ctok), self._cost(litellm, response=resp)

    def _cost(self, litellm, *, response=None, prompt_tokens=0, completion_tokens=0) -> float:
        """USD from litellm's local price map; 0.0 for models it does not know (local ones)."""
        try:
            if response is not None:
                return float(litellm.completion_cost(completion_response=response) or 0.0)
            p, c = litellm.cost_per_token(model=self.model, prompt_tokens=prompt_tokens,
                                          completion_tokens=completion_tokens)
            return float(p + c)
        except Exception:
            return 0.0

    async def _complete(self, messages: list[dict]):
        """Call with retries -> (text, finish_reason, usage, cost, error-or-None)."""
        try:
            litellm = _litellm()
        except Exception as e:
            return None, None, (0, 0), 0.0, f"litellm is not usable: {_one_line(e)}"
        last = "no attempt"
        for attempt in range(self.max_retries + 1):
            self.attempts += 1
            try:
                # our own deadline too: a stream that trickles forever is also a timeout
                text, finish, usage, cost = await asyncio.wait_for(
                    self._once(litellm, messages), self.timeout_s + 1.0)
                return text, finish, usage, cost, None
            except asyncio.CancelledError:
                raise
            except Exception as e:
                last = _describe_failure(e, self.timeout_s)
                if not _retryable(e) or attempt == self.max_retries:
                    if attempt:
                        last += f" (after {attempt + 1} attempts)"
                    return None, None, (0, 0), 0.0, last
                await asyncio.sleep(self._delay(attempt, _retry_after(e)))
        return None, None, (0, 0), 0.0, last

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(0.0, retry_after), self.max_backoff_s)
        cap = min(self.max_backoff_s, self.backoff_s * (2 ** attempt))
        return self._rng.uniform(0.5 * cap, cap)  # jitter so parallel callers spread out


# ----------------------------------------------------------------------- settings check

_LOCAL_PROVIDERS = ("ollama", "ollama_chat", "hosted_vllm", "lm_studio", "llamafile", "vllm")
_DEFAULT_BASES = {"ollama": "http://localhost:11434", "ollama_chat": "http://localhost:11434"}


def check_llm_settings(model: str, api_base: str | None = None,
                       api_key_env: str | None = None, *, connect_timeout_s: float = 3.0) -> None:
    """Refuse bad LLM settings in one line (UsageError) before any profiling starts.

    Checks: the provider string is one litellm knows; a hosted provider has its API key in
    the environment (named); the api_base (or a local provider's default) accepts a TCP
    connection within `connect_timeout_s`.
    """
    if not model or not model.strip():
        raise UsageError("--llm needs a model, e.g. openai/gpt-4o or ollama/qwen2.5-coder")
    litellm = _litellm()
    try:
        _, provider, _, _ = litellm.get_llm_provider(model, api_base=api_base)
    except Exception:
        raise UsageError(f"unknown LLM provider in {model!r}: write PROVIDER/MODEL, e.g. "
                         "openai/gpt-4o, anthropic/claude-sonnet-4-5, gemini/gemini-2.5-pro, "
                         "ollama/qwen2.5-coder, hosted_vllm/MODEL") from None
    if provider == "hosted_vllm" and not (api_base or os.environ.get("HOSTED_VLLM_API_BASE")):
        raise UsageError(f"{model}: hosted_vllm needs --api-base (the server's URL, e.g. "
                         "http://localhost:8000/v1)")
    if api_key_env:
        if not os.environ.get(api_key_env):
            raise UsageError(f"the API key variable {api_key_env} is not set")
    elif not api_base and provider not in _LOCAL_PROVIDERS:
        try:
            env = litellm.validate_environment(model=model)
        except Exception:
            env = {"keys_in_environment": True, "missing_keys": []}
        missing = [k for k in env.get("missing_keys", []) if "KEY" in k or "TOKEN" in k]
        if not env.get("keys_in_environment") and missing:
            raise UsageError(f"{model}: no API key; set {' or '.join(missing)} "
                             f"(or pass --api-base for a local server)")
    base = api_base or _DEFAULT_BASES.get(provider)
    if base:
        _check_reachable(base, connect_timeout_s, given=bool(api_base))


def _check_reachable(base: str, timeout_s: float, given: bool) -> None:
    u = urlparse(base if "://" in base else f"http://{base}")
    if u.scheme not in ("http", "https") or not u.hostname or any(c.isspace() for c in base):
        raise UsageError(f"--api-base {base!r} is not a URL (e.g. http://localhost:8000/v1)")
    port = u.port or (443 if u.scheme == "https" else 80)
    t0 = time.monotonic()
    try:
        with socket.create_connection((u.hostname, port), timeout=timeout_s):
            pass
    except OSError as e:
        what = "--api-base" if given else "the default server"
        raise UsageError(f"{what} {base} is unreachable ({_one_line(e, 80)}, "
                         f"{time.monotonic() - t0:.1f} s)") from None
