"""How envs talk to a model: every `ModelClient` answers `generate` with the assistant message (train clients also
with exact token ids, their logprobs of equal length and each token's policy step); a `ClientConfig` is plain data."""

from __future__ import annotations

import asyncio
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Annotated, Any, Literal, Self

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from envrl.data.seeds import call_seed
from envrl.data.traces import Message, Turn, TurnTokens
from envrl.model.chat_tokens import chat_renderer
from envrl.model.inference import raise_for_context_length
from envrl.model.replicas import ReplicaUrls, replica_urls
from envrl.runtime.http import HttpCallError, RetryPolicy, bearer, request_json


class _Plain(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class SamplingParams(_Plain):
    """How a run samples: the `sampling` config table (orchestrator, `eval`, one env's overrides),
    and every key of a model call's `SamplingArgs` but the per-rollout seed."""

    max_tokens: int = Field(128, ge=1)
    """Most tokens the model may generate in one turn."""
    temperature: float = Field(1.0, ge=0)
    """Softmax temperature; 0 is greedy decoding (evaluation only: the orchestrator refuses it for
    train envs, since the trainer divides its logits by the temperature)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Sample from the smallest set of tokens whose probability adds up to this (1: all)."""
    top_k: int = Field(0, ge=0)
    """Sample from the k most likely tokens only (0: all)."""
    stop: list[str] | None = None
    """Strings that end a turn (the server then detokenizes as it generates)."""
    max_episode_tokens: int | None = Field(None, ge=1)
    """Most tokens the model may generate over all turns of one rollout (None: no budget). Each
    turn's `max_tokens` is capped by what is left; an exhausted budget ends the rollout as
    truncated (stop reason `episode_tokens`)."""
    extra: dict[str, Any] = {}
    """Further sampling parameters, passed to the server as-is (vLLM: min_p, ...). Training rejects
    the ones that reshape the sampling distribution in ways the trainer does not reproduce."""

    @model_validator(mode="after")
    def _no_shadowed_keys(self) -> Self:
        if "seed" in self.extra:
            raise ValueError(
                "sampling.extra sets 'seed': each rollout's seed is set by whoever dispatches it; remove it"
            )
        shadowed = sorted(set(self.extra) & set(SamplingParams.model_fields))
        if shadowed:
            raise ValueError(f"sampling.extra sets {shadowed}: set them as sampling keys of their own")
        return self


class SamplingArgs(SamplingParams):
    """Sampling parameters of one model call (one turn): the run's `SamplingParams` and the seed."""

    seed: int | None = None
    """Set per rollout by whoever dispatches it (the orchestrator derives it from the run's `seed`)."""

    def for_call(self, call: int) -> SamplingArgs:
        """The arguments of the rollout's model call number `call` (0: the first): its own seed."""
        if self.seed is None or call == 0:
            return self
        return self.model_copy(update={"seed": call_seed(self.seed, call)})

    def to_request(self) -> dict[str, Any]:
        """The parameters as the server's completion request fields."""
        fields = self.model_dump(exclude={"extra", "max_episode_tokens"}, exclude_none=True)
        if not self.top_k:
            del fields["top_k"]  # 0 means all tokens; OpenAI-style chat APIs do not know the field
        return {**fields, **self.extra}


class TrainClientConfig(_Plain):
    """Token-in/token-out against the envrl inference server (vLLM); what RL training uses."""

    type: Literal["train"] = "train"
    base_url: ReplicaUrls
    """Inference server root, e.g. http://127.0.0.1:8000 (without /v1), or a list of replicas that
    serve the same model and policy: a rollout's first turn goes to the replica with the fewest of
    this worker's calls in flight, each later turn to the replica that answered the turn it
    continues (its prefix is cached there)."""
    model: str
    """Model name the server serves (its --model)."""
    tokenizer: str | None = None
    """Directory whose tokenizer and chat template render prompts; defaults to `model`."""
    retry: RetryPolicy = RetryPolicy()

    @property
    def base_urls(self) -> list[str]:
        """Every replica's URL (one for a single server)."""
        return replica_urls(self.base_url)


class ChatClientConfig(_Plain):
    """Plain OpenAI chat completions against any compatible server: an env table's `client` (the
    only kind an env may name, so without a `type`); bound to a server as an `EvalClientConfig`."""

    base_url: str
    """API root including the version, e.g. http://127.0.0.1:8000/v1 or https://api.openai.com/v1."""
    model: str
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (keys never go into configs)."""
    extra_body: dict[str, Any] = {}
    """Extra request fields, passed as-is."""


class EvalClientConfig(ChatClientConfig):
    """A chat client where a model client may be of any kind (`rl eval --client`, an env server's
    `--client`): the same keys, picked by `type = "eval"`, plus tokens and retries."""

    type: Literal["eval"] = "eval"
    return_tokens: bool = False
    """Ask a vLLM server for prompt/completion token ids and logprobs too."""
    retry: RetryPolicy = RetryPolicy()

    @classmethod
    def of(cls, chat: ChatClientConfig) -> EvalClientConfig:
        """`chat` as a client of any kind (what an env server serves)."""
        return cls.model_validate({**chat.model_dump(), "type": "eval"})


class ScriptedClientConfig(_Plain):
    """Canned replies, no server: for tests and for debugging the layers above the model."""

    type: Literal["scripted"] = "scripted"
    replies: list[str] = ["hello"]
    """Replies served in order, one per call, cycling when exhausted."""
    tokenizer: str | None = None
    """If set, turns carry tokens rendered with this tokenizer's chat template (reply + eos)."""
    delay_s: float = 0.0
    """Seconds each call waits before answering (to exercise timeouts and cancellation)."""
    finish_reason: str = "stop"


ClientConfig = Annotated[TrainClientConfig | EvalClientConfig | ScriptedClientConfig, Field(discriminator="type")]


class ModelResponse(BaseModel):
    """One model call's answer: the assistant message and, where known, its exact tokens."""

    message: Message
    tokens: TurnTokens | None = None
    finish_reason: str | None = None


class ModelClient(ABC):
    """The only way environments reach a model."""

    @abstractmethod
    async def generate(
        self,
        messages: list[Message],
        sampling: SamplingArgs,
        *,
        tools: list[dict[str, Any]] | None = None,
        previous: Turn | None = None,
    ) -> ModelResponse:
        """Answer `messages`. `previous` is the branch's last turn: token clients extend its tokens.

        Raises `envrl.model.inference.ContextLengthError` when the prompt leaves no room in the
        model's context (the rollout loop ends the rollout as truncated).
        """

    async def aclose(self) -> None:  # noqa: B027 - a client without connections has nothing to release
        """Release connections; the client is unusable afterwards."""


AUTO_TOOL_CHOICE_REFUSAL = "tool choice requires --enable-auto-tool-choice"
"""vLLM's 400 for a chat request with tools to a server started without a tool-call parser."""


def _assistant(content: str) -> Message:
    return {"role": "assistant", "content": content}


class TrainClient(ModelClient):
    """Renders with the chat template, sends token ids to vLLM's /inference/v1/generate (of one of the replicas),
    keeps ids and logprobs."""

    def __init__(self, config: TrainClientConfig) -> None:
        from envrl.model.replicas import InferenceReplicas  # the inference package is a peer, loaded on use

        self.config = config
        self.renderer = chat_renderer(config.tokenizer or config.model)
        self.inference = InferenceReplicas(config.base_urls, config.model, retry=config.retry)

    async def generate(
        self,
        messages: list[Message],
        sampling: SamplingArgs,
        *,
        tools: list[dict[str, Any]] | None = None,
        previous: Turn | None = None,
    ) -> ModelResponse:
        prompt_ids = self.renderer.prompt_ids(messages, tools, previous)
        continues = None
        if previous is not None and previous.tokens is not None:
            continues = [*previous.tokens.prompt_ids, *previous.tokens.completion_ids]
        out = await self.inference.generate(prompt_ids, sampling.to_request(), continues=continues)
        tokens = TurnTokens(
            prompt_ids=prompt_ids,
            completion_ids=out.completion_ids,
            completion_logprobs=out.logprobs,
            completion_policy_steps=out.policy_steps,
        )
        message = self.renderer.assistant_message(out.completion_ids, tools)
        finish = "tool_calls" if message.get("tool_calls") and out.finish_reason == "stop" else out.finish_reason
        return ModelResponse(message=message, tokens=tokens, finish_reason=finish)

    async def aclose(self) -> None:
        await self.inference.aclose()


class EvalClient(ModelClient):
    """POST {base_url}/chat/completions; tools are passed as OpenAI tools."""

    def __init__(self, config: EvalClientConfig) -> None:
        self.config = config
        headers = {}
        if config.api_key_env:
            key = os.environ.get(config.api_key_env)
            if not key:
                raise ValueError(f"eval client: environment variable {config.api_key_env} (api_key_env) is not set")
            headers = bearer(key, f"environment variable {config.api_key_env} (api_key_env)")
        self.http = httpx.AsyncClient(headers=headers)

    async def generate(
        self,
        messages: list[Message],
        sampling: SamplingArgs,
        *,
        tools: list[dict[str, Any]] | None = None,
        previous: Turn | None = None,
    ) -> ModelResponse:
        payload: dict[str, Any] = {"model": self.config.model, "messages": messages, **sampling.to_request()}
        if tools:
            payload["tools"] = tools
        if self.config.return_tokens:
            payload |= {"logprobs": True, "return_token_ids": True}
        payload |= self.config.extra_body
        url = f"{self.config.base_url.rstrip('/')}/chat/completions"
        try:
            body = await request_json(self.http, "POST", url, payload, self.config.retry)
        except HttpCallError as e:
            raise_for_context_length(e, "?")
            if tools and e.status == 400 and AUTO_TOOL_CHOICE_REFUSAL in str(e):
                raise HttpCallError(
                    f"{e}; the server at {self.config.base_url} does not serve tool calls: start it with envrl's "
                    "`inference` (it enables the model family's parser), or give vLLM --enable-auto-tool-choice "
                    "--tool-call-parser <parser> (docs/eval.md)",
                    e.status,
                ) from None
            raise
        choice = body["choices"][0]
        raw = choice["message"]
        message: Message = {"role": "assistant", "content": raw.get("content") or ""}
        if raw.get("tool_calls"):
            message["tool_calls"] = raw["tool_calls"]
        return ModelResponse(
            message=message, tokens=self._tokens(body, choice), finish_reason=choice.get("finish_reason")
        )

    def _tokens(self, body: dict[str, Any], choice: dict[str, Any]) -> TurnTokens | None:
        if not self.config.return_tokens or "token_ids" not in choice or "prompt_token_ids" not in body:
            return None
        logprobs = [entry["logprob"] for entry in (choice.get("logprobs") or {}).get("content") or []]
        return TurnTokens(
            prompt_ids=body["prompt_token_ids"], completion_ids=choice["token_ids"], completion_logprobs=logprobs
        )

    async def aclose(self) -> None:
        await self.http.aclose()


class ScriptedClient(ModelClient):
    """Serves `config.replies` in order, or `respond(messages)` when given (in-process tests)."""

    SCRIPTED_LOGPROB = -1.0
    """The logprob recorded for every scripted token (a constant, so tests can check alignment)."""

    def __init__(self, config: ScriptedClientConfig, respond: Callable[[list[Message]], str] | None = None) -> None:
        if not config.replies and respond is None:
            raise ValueError("scripted client: give at least one reply (replies=[...]) or a respond function")
        self.config = config
        self.respond = respond
        self.renderer = chat_renderer(config.tokenizer) if config.tokenizer else None
        self.calls = 0

    async def generate(
        self,
        messages: list[Message],
        sampling: SamplingArgs,
        *,
        tools: list[dict[str, Any]] | None = None,
        previous: Turn | None = None,
    ) -> ModelResponse:
        reply = self.respond(messages) if self.respond else self.config.replies[self.calls % len(self.config.replies)]
        self.calls += 1
        if self.config.delay_s:
            await asyncio.sleep(self.config.delay_s)
        tokens = None
        if self.renderer is not None:
            prompt_ids = self.renderer.prompt_ids(messages, tools, previous)
            stopped = [self.renderer.eos_id] if self.config.finish_reason == "stop" else []
            completion = [*self.renderer.encode(reply), *stopped]
            tokens = TurnTokens(
                prompt_ids=prompt_ids,
                completion_ids=completion,
                completion_logprobs=[self.SCRIPTED_LOGPROB] * len(completion),
            )
        return ModelResponse(message=_assistant(reply), tokens=tokens, finish_reason=self.config.finish_reason)


def build_client(config: TrainClientConfig | EvalClientConfig | ScriptedClientConfig) -> ModelClient:
    """The client a config describes. Build one per (config, event loop) and reuse it: it pools connections."""
    if isinstance(config, TrainClientConfig):
        return TrainClient(config)
    if isinstance(config, EvalClientConfig):
        return EvalClient(config)
    return ScriptedClient(config)
