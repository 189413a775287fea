"""The distillation teacher: `logprobs(ids)` returns one float per token (0.0 at position 0) from the ids
themselves, or raises `TeacherError`; `start` refuses a teacher whose tokenizer disagrees with the student's; no key
goes to another local user's listener or a proxy."""

from __future__ import annotations

import asyncio
import json
import os
import time

import httpx
from loguru import logger

from envrl.runtime.http import (
    HttpCallError,
    ResponseTooLarge,
    RetryPolicy,
    bearer,
    fetch,
    own_server_client,
    poll_delays,
    request_json,
)
from envrl.runtime.secrets import API_KEY_ENV, api_key

PROBE_TEXT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "Reverse 'héllo wörld', then add 1234 + 5678 = ?\t{\"tool\": [x_1]}<|im_end|>\n<|im_start|>assistant\n"
)
"""Text both servers tokenize at start-up: chat markers, accents, digits, whitespace and JSON, so a
different vocabulary or merge table shows up as different ids."""


TEACHER_API_KEY_ENV = "ENVRL_TEACHER_API_KEY"
"""Environment variable with the teacher server's API key, sent as a bearer token when set."""


class TeacherError(RuntimeError):
    """The teacher cannot score the student's tokens; the message says which server and why."""


def _api_root(url: str) -> str:
    """`url` without a trailing slash or "/v1": the server's root (routes are added per call)."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


class TeacherClient:
    """Scores token ids on the teacher server at `base_url` (with or without "/v1"); `model` is
    the served name to ask for (None: the one model the server lists)."""

    def __init__(
        self, base_url: str, model: str | None, retry: RetryPolicy, api_key_env: str = TEACHER_API_KEY_ENV
    ) -> None:
        self.base_url = _api_root(base_url)
        self.model = model
        self.retry = retry
        key = os.environ.get(api_key_env)
        self._http = own_server_client(bearer(key, f"environment variable {api_key_env}") if key else None)

    async def start(self, student_url: str, student_model: str, timeout: float) -> None:
        """Wait (at most `timeout` s) for the teacher to list its models, resolve `model`, and
        check that it tokenizes like the student served at `student_url` as `student_model`."""
        served = await self._wait_for_models(timeout)
        if self.model is None:
            if len(served) != 1:
                raise TeacherError(
                    f"the teacher at {self.base_url} serves {served}; set orchestrator.distill.teacher_model to one of them"
                )
            self.model = served[0]
        elif self.model not in served:
            raise TeacherError(
                f"the teacher at {self.base_url} serves {served}, not orchestrator.distill.teacher_model = {self.model!r}"
            )
        key = api_key()  # the student's own key: the teacher's is never sent to the student, nor the other way
        async with own_server_client(bearer(key, f"environment variable {API_KEY_ENV}") if key else None) as http:
            student = await self._tokenize(http, _api_root(student_url), student_model)
        teacher = await self._tokenize(self._http, self.base_url, self.model)
        if student != teacher:
            first = next(
                (i for i, (a, b) in enumerate(zip(student, teacher, strict=False)) if a != b),
                min(len(student), len(teacher)),
            )
            raise TeacherError(
                f"refusing teacher {self.model!r} at {self.base_url}: its tokenizer differs from the student's "
                f"({student_model!r}): the same probe text gives {len(teacher)} vs {len(student)} token ids, first "
                f"different at position {first}; distillation needs the student's tokenizer (same model family)"
            )
        logger.info(f"teacher {self.model!r} at {self.base_url} tokenizes like the student ({len(student)} probe ids)")

    async def logprobs(self, ids: list[int]) -> list[float]:
        """The teacher's logprob of every token of `ids` given the ones before it; 0.0 at position 0."""
        url = f"{self.base_url}/v1/completions"
        payload = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
        try:
            body = await request_json(self._http, "POST", url, payload, self.retry)
        except HttpCallError as e:
            raise TeacherError(f"the teacher could not score a sample of {len(ids)} tokens: {e}") from None
        try:
            entries = body["choices"][0]["prompt_logprobs"]
            if len(entries) != len(ids):
                raise ValueError(f"{len(entries)} prompt logprobs for a prompt of {len(ids)} tokens")
            scores = [0.0] + [
                float(entry[str(token)]["logprob"]) for entry, token in zip(entries[1:], ids[1:], strict=True)
            ]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise TeacherError(
                f"POST {url}: no prompt logprob for every token ({type(e).__name__}: {e}); the teacher must be a "
                f"server that honours vLLM's `prompt_logprobs` (e.g. envrl's `inference` or `vllm serve`): {str(body)[:300]}"
            ) from None
        return scores

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _wait_for_models(self, timeout: float) -> list[str]:
        url = f"{self.base_url}/v1/models"
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        for delay in poll_delays(max_s=1.0):
            try:
                status, body = await fetch(self._http, "GET", url, None, 5.0)
                if status == 200:
                    return [m["id"] for m in json.loads(body)["data"]]
                if status in (401, 403):
                    raise TeacherError(
                        f"the teacher at {self.base_url} refused GET {url} (HTTP {status}): it wants an "
                        f"API key; put it in the environment variable {TEACHER_API_KEY_ENV}"
                    )
                last = f"HTTP {status}: {body[:200].decode(errors='replace')}"
            except ResponseTooLarge as e:
                raise TeacherError(str(e)) from None
            except (httpx.HTTPError, KeyError, TypeError, ValueError) as e:
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            if time.monotonic() + delay > deadline:
                raise TeacherError(
                    f"the teacher at {self.base_url} did not list its models within {timeout:.0f} s (last: {last}); "
                    "start it first (e.g. `inference --model.name TEACHER --port PORT`) or fix orchestrator.distill.teacher_url"
                )
            await asyncio.sleep(delay)
        raise AssertionError("unreachable: poll_delays never ends")

    async def _tokenize(self, http: httpx.AsyncClient, root: str, model: str) -> list[int]:
        url = f"{root}/tokenize"
        payload = {"model": model, "prompt": PROBE_TEXT, "add_special_tokens": False}
        try:
            body = await request_json(http, "POST", url, payload, self.retry)
            return [int(t) for t in body["tokens"]]
        except (HttpCallError, KeyError, TypeError, ValueError) as e:
            raise TeacherError(
                f"POST {url} failed ({type(e).__name__}: {e}); the teacher and the student must both serve vLLM's "
                "/tokenize, which is how envrl checks that they share a tokenizer"
            ) from None
