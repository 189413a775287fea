"""Token-in/token-out client of the inference server: `generate` returns exactly one logprob per completion token (a
mismatch is an error, never padded), every call ends within its `RetryPolicy` deadline, and no key, token or secret
goes to another local user's listener (`ForeignListener`) or a proxy."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from loguru import logger
from pydantic import BaseModel

from envrl.runtime.http import (
    HttpCallError,
    RetryPolicy,
    bearer,
    keep_alive_session,
    own_server_client,
    poll_delays,
    request_json,
)
from envrl.runtime.secrets import API_KEY_ENV, api_key

WAIT_REPORT_S = 30.0
"""Seconds between the lines saying that the client still waits for its server."""


class TokenCompletion(BaseModel):
    completion_ids: list[int]
    logprobs: list[float]
    """Logprob of each sampled token under the serving policy; same length as `completion_ids`."""
    finish_reason: str
    """As vLLM reports it: "stop", "length", ..."""
    policy_steps: list[int | None] | None = None
    """The policy step whose weights sampled each token (None: weights loaded without a step);
    None when the server labels no token. Two steps when a reload came mid-generation."""


def token_policy_steps(spans: Any, num_tokens: int) -> list[int | None] | None:
    """Per token, the policy step of vLLM's `weight_versions` spans (`{"version", "start", "end"}`
    over output-token indexes; a version that is not a step number, such as reload.UNLABELLED,
    is None); None without spans. InferenceError unless the spans cover the tokens exactly."""
    if not spans:
        return None
    steps: list[int | None] = []
    for span in spans:
        version = str(span["version"])
        if span["start"] != len(steps) or span["end"] < span["start"]:
            raise InferenceError(f"weight_versions spans {spans} do not tile {num_tokens} tokens")
        steps += [int(version) if version.isdigit() else None] * (span["end"] - span["start"])
    if len(steps) != num_tokens:
        raise InferenceError(f"weight_versions spans {spans} cover {len(steps)} tokens, not {num_tokens}")
    return steps


class InferenceError(RuntimeError):
    """The inference server answered, but not with what the call needs."""


class ServerNotReady(TimeoutError):
    """An inference server that did not answer `/health` in time (the message names its URL)."""


class ContextLengthError(InferenceError):
    """The prompt leaves no room for a single generated token in the server's context
    (`max_model_len`): the rollout cannot go on, which is a truncation, not a failure."""


GENERATE_PATH = "/inference/v1/generate"
"""vLLM's token-in/token-out endpoint (served with `--enable-scale-out`, which envrl sets): ids
and per-token logprobs in and out, no text: the same ids and logprobs as `/v1/completions` for
the same seeds, for less server CPU (docs/measurements.md)."""

CONTEXT_LENGTH_REFUSAL = "maximum context length"
"""What vLLM's 400 answer says when a prompt is longer than its context."""


def raise_for_context_length(error: HttpCallError, prompt_len: int | str) -> None:
    """Re-raise a 400 refusal of a too-long prompt as ContextLengthError (anything else: return)."""
    if error.status == 400 and CONTEXT_LENGTH_REFUSAL in str(error):
        raise ContextLengthError(f"prompt of {prompt_len} tokens does not fit the served context: {error}") from None


class InferenceClient:
    """Calls one inference server (`base_url` like "http://127.0.0.1:8000", without "/v1")."""

    def __init__(
        self, base_url: str, model: str, retry: RetryPolicy | None = None, reload_token: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.retry = retry or RetryPolicy()
        self._session: aiohttp.ClientSession | None = None
        """Generation and model info: every rollout's call keeps its connection (`keep_alive_session`),
        made on first use, in the event loop that uses it."""
        key = api_key()
        self._auth = bearer(key, f"environment variable {API_KEY_ENV}") if key else {}
        """vLLM's `--api-key` (`API_KEY_ENV`), sent on every call but the reload (which sends its token)."""
        self._http = own_server_client(self._auth)
        self._reload_http = own_server_client(bearer(reload_token, "the reload token") if reload_token else None)
        self._max_model_len: int | None = None

    async def max_model_len(self) -> int:
        """The served context length (`GET /v1/models`, asked once)."""
        if self._max_model_len is None:
            url = f"{self.base_url}/v1/models"
            body = await request_json(self._generation(), "GET", url, None, self.retry)
            try:
                self._max_model_len = int(next(m for m in body["data"] if m["id"] == self.model)["max_model_len"])
            except (KeyError, StopIteration, TypeError, ValueError) as e:
                raise InferenceError(
                    f"GET {url}: no max_model_len for model {self.model!r} ({type(e).__name__}): {str(body)[:500]}"
                ) from None
        return self._max_model_len

    async def generate(self, prompt_ids: list[int], sampling: dict[str, Any]) -> TokenCompletion:
        """Sample one completion for `prompt_ids`; `sampling` is passed to vLLM as is.

        `sampling` holds vLLM `SamplingParams` fields (max_tokens, temperature, top_p, stop,
        seed, min_tokens, logit_bias, ...); the token-in/token-out options are set here and
        cannot be overridden. The call goes to vLLM's own token-in/token-out endpoint
        (`GENERATE_PATH`), which turns no ids into text: the completion is not detokenised at all
        unless stop strings need it. A prompt that leaves no room in the served context raises
        ContextLengthError (vLLM itself caps `max_tokens` to the room that is left, and then
        reports finish_reason "length").
        """
        if len(prompt_ids) >= await self.max_model_len():
            raise ContextLengthError(
                f"prompt of {len(prompt_ids)} tokens leaves no room in the served context of {self._max_model_len} tokens"
            )
        params = {**sampling, "n": 1, "logprobs": 0, "detokenize": bool(sampling.get("stop"))}
        payload = {"model": self.model, "token_ids": prompt_ids, "sampling_params": params, "stream": False}
        url = f"{self.base_url}{GENERATE_PATH}"
        try:
            body = await request_json(self._generation(), "POST", url, payload, self.retry)
        except HttpCallError as e:
            raise_for_context_length(e, len(prompt_ids))
            raise
        try:
            choice = body["choices"][0]
            completion_ids = choice["token_ids"]
            logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
            finish_reason = choice["finish_reason"]
            spans = choice.get("weight_versions")
        except (KeyError, IndexError, TypeError) as e:
            raise InferenceError(
                f"POST {url}: unexpected response shape ({type(e).__name__}: {e}): {str(body)[:500]}"
            ) from None
        if completion_ids is None or len(completion_ids) != len(logprobs):
            raise InferenceError(
                f"POST {url}: got {len(completion_ids or [])} completion token ids but "
                f"{len(logprobs)} logprobs; the server must return one logprob per token"
            )
        return TokenCompletion(
            completion_ids=completion_ids,
            logprobs=logprobs,
            finish_reason=finish_reason or "unknown",
            policy_steps=token_policy_steps(spans, len(completion_ids)),
        )

    async def wait_until_ready(self, timeout: float) -> None:
        """Poll `GET /health` until the server answers 200; raise TimeoutError after `timeout` s.
        The polls carry no API key (`/health` needs none): whoever answers them learns nothing.
        Says every `WAIT_REPORT_S` what it waits for (a server that is not started looks the same
        as one still loading, so it waits the whole `timeout` either way)."""
        url = f"{self.base_url}/health"
        start = time.monotonic()
        deadline, next_report = start + timeout, start + WAIT_REPORT_S
        last = "no answer yet"
        delays = poll_delays(max_s=0.1)  # a poll is one request on the kept client, and step 0 waits on this
        async with own_server_client() as http:
            while True:
                if time.monotonic() >= next_report:
                    next_report += WAIT_REPORT_S
                    logger.info(
                        f"still waiting for the inference server at {self.base_url} ({time.monotonic() - start:.0f} s "
                        f"of {timeout:.0f} s; last: {last}); is it started (`inference --config ...`) at that address?"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ServerNotReady(
                        f"inference server at {self.base_url} not ready after {timeout:.0f}s (last: {last}); check its log"
                    )
                try:
                    response = await http.get(url, timeout=min(5.0, remaining))
                    if response.status_code == 200:
                        return
                    last = f"HTTP {response.status_code}"
                except httpx.HTTPError as e:
                    last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                await asyncio.sleep(min(next(delays), max(0.0, deadline - time.monotonic())))

    async def update_weights(
        self,
        path: str | Path,
        step: int | None = None,
        timeout_s: float | None = None,
        replica: tuple[int, int] = (0, 1),
        in_flight: str = "wait",
        transfer: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Make the server load the HF safetensors in `path` (policy `step`); returns once they serve.

        With a `step`, retries are safe: the server loads a step once and answers a repeated
        POST with its first answer. A bad path or a shape mismatch is raised as `HttpCallError`
        (status 400) with the server's explanation; the server keeps serving its previous weights
        then. `timeout_s` shortens the server's own deadline for this reload. `replica`: this
        server's index among how many load `path` at once (a policy sent in memory needs it).
        `in_flight`: what happens to generations running meanwhile (reload.IN_FLIGHT_PAUSE).
        `transfer`: the secret of a policy sent in memory (envrl.transport.memory.TransferSecret).
        """
        url = f"{self.base_url}/update_weights"
        payload: dict[str, Any] = {"path": str(Path(path).resolve()), "step": step, "in_flight": in_flight}
        payload["replica"], payload["replicas"] = replica
        if timeout_s is not None:
            payload["timeout_s"] = timeout_s
        if transfer is not None:
            payload["transfer"] = transfer
        body = await request_json(self._reload_http, "POST", url, payload, self.retry)
        if not isinstance(body, dict) or body.get("status") != "ok":
            raise InferenceError(f"POST {url} for {path}: unexpected answer {str(body)[:500]}")
        return body

    async def served_weights(self) -> str:
        """The resolved directory (or model id) of the weights the server serves now."""
        url = f"{self.base_url}/weights"
        body = await request_json(self._http, "GET", url, None, self.retry)
        if not isinstance(body, dict) or not isinstance(body.get("path"), str):
            raise InferenceError(f"GET {url}: unexpected answer {str(body)[:500]}")
        return body["path"]

    def _generation(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = keep_alive_session(self._auth)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
        await self._http.aclose()
        await self._reload_http.aclose()


__all__ = ["ContextLengthError", "HttpCallError", "InferenceClient", "InferenceError", "TokenCompletion"]
