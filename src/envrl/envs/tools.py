"""Tool envs as a plain class (public methods are tools): a fresh instance per rollout, every tool call either run with
arguments validated strictly against its type hints or answered with an error tool message; nothing is coerced."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from envrl.data.traces import Message
from envrl.envs.environment import Environment
from envrl.envs.state import RolloutState
from envrl.model.client import ModelClient, SamplingArgs
from envrl.model.tool_calls import Family
from envrl.model.tool_calls import parse as parse_family
from envrl.sandbox.errors import SandboxError

NOT_TOOLS = frozenset({"reset", "close"})
"""Public methods with a lifecycle meaning, never offered to the model."""
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class ToolCallError(ValueError):
    """What the model got wrong in a tool call; its message is shown to the model."""


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str | None = None
    """The call's id when the model gave one (structured `tool_calls`)."""


def _doc_sections(doc: str) -> tuple[str, dict[str, str]]:
    """The description (first paragraph) and per-argument docs from a Google-style `Args:` block."""
    doc = inspect.cleandoc(doc or "")
    description = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    args: dict[str, str] = {}
    match = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?)+)", doc, re.MULTILINE)
    if match:
        current, arg_indent = None, 0
        for line in match.group(1).splitlines():
            indent = len(line) - len(line.lstrip())
            entry = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?\s*:\s*(.*)", line)
            if entry and (current is None or indent <= arg_indent):
                current, arg_indent = entry.group(1), indent
                args[current] = entry.group(2).strip()
            elif current is not None:  # a continuation line of the current argument
                args[current] = f"{args[current]} {line.strip()}".strip()
    return description, args


def _strip_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items() if k != "title" or not isinstance(v, str)}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


class Tool:
    """One method of the tool class: its OpenAI schema and a strict validator for its arguments."""

    def __init__(self, name: str, method: Callable[..., Any]) -> None:
        self.name = name
        self.is_async = inspect.iscoroutinefunction(method)
        description, arg_docs = _doc_sections(method.__doc__ or "")
        hints = inspect.get_annotations(method, eval_str=True)
        fields: dict[str, Any] = {}
        for param in list(inspect.signature(method).parameters.values())[1:]:  # skip self
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"tool {name}: *args/**kwargs cannot be described to the model; name every argument")
            if param.name not in hints:
                raise TypeError(f"tool {name}: argument {param.name!r} needs a type hint (it becomes the JSON schema)")
            default = ... if param.default is param.empty else param.default
            fields[param.name] = (hints[param.name], default)
        self.arguments: type[BaseModel] = create_model(
            f"{name}_arguments", __config__=ConfigDict(strict=True, extra="forbid"), **fields
        )
        parameters = _strip_titles(self.arguments.model_json_schema())
        for arg, text in arg_docs.items():
            if arg in parameters.get("properties", {}):
                parameters["properties"][arg]["description"] = text
        self.schema = {
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters},
        }

    async def call(self, instance: Any, arguments: dict[str, Any]) -> str:
        try:
            validated = self.arguments.model_validate(arguments)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'arguments'}: {err['msg']}" for err in e.errors())
            raise ToolCallError(f"invalid arguments for {self.name}: {problems}") from None
        kwargs = {field: getattr(validated, field) for field in type(validated).model_fields}
        result = getattr(instance, self.name)(**kwargs)
        if self.is_async:
            result = await result
        return result if isinstance(result, str) else json.dumps(result)


def tools_of(cls: type) -> dict[str, Tool]:
    """The public methods of `cls` (minus reset/close) as tools, by name."""
    methods = inspect.getmembers(cls, inspect.isfunction)
    tools = {name: Tool(name, fn) for name, fn in methods if not name.startswith("_") and name not in NOT_TOOLS}
    if not tools:
        raise TypeError(f"{cls.__name__} has no public methods to offer as tools")
    return tools


def parse_tool_calls(message: Message) -> list[ToolCall | ToolCallError]:
    """Tool calls from structured `tool_calls` (OpenAI), `<tool_call>{json}</tool_call>` text, or
    text in another family's syntax (`[TOOL_CALLS]...`, Llama-3 `{"name": ...}`), which a client
    that parsed it would have made structured: such text that does not parse is an error."""
    if message.get("tool_calls"):
        calls = []
        for call in message["tool_calls"]:
            function = call.get("function") or call
            parsed = _tool_call(
                {"name": function.get("name"), "arguments": _json_arguments(function.get("arguments", {}))}
            )
            if isinstance(parsed, ToolCall) and isinstance(call.get("id"), str):
                parsed.id = call["id"]
            calls.append(parsed)
        return calls
    text = message.get("content") or ""
    family = _other_family(text)
    if family is not None:
        parsed = parse_family(text, family)
        if parsed.get("tool_calls"):
            return parse_tool_calls(parsed)
        example = _EXAMPLES[family]
        return [ToolCallError(f"the tool call does not parse (write {example}): {text.strip()[:200]}")]
    calls: list[ToolCall | ToolCallError] = []
    for body in _TOOL_CALL.findall(text):
        try:
            data = json.loads(body)
            calls += [_tool_call(item) for item in (data if isinstance(data, list) and data else [data])]
        except json.JSONDecodeError as e:
            calls.append(
                ToolCallError(f"the tool call is not valid JSON ({e.msg} at character {e.pos}): {body.strip()[:200]}")
            )
    if text.count("<tool_call>") > len(_TOOL_CALL.findall(text)):
        calls.append(ToolCallError("a <tool_call> was opened but not closed with </tool_call>"))
    return calls


_EXAMPLES: dict[Family, str] = {
    "mistral": '[TOOL_CALLS][{"name": NAME, "arguments": {...}}]',
    "llama3": '{"name": NAME, "parameters": {...}}',
}


def _other_family(text: str) -> Family | None:
    """The non-Hermes family whose call syntax `text` starts (None: Hermes or plain text)."""
    if "<tool_call>" in text:
        return None
    if "[TOOL_CALLS]" in text:
        return "mistral"
    if "<|python_tag|>" in text or text.lstrip().startswith('{"name"'):
        return "llama3"
    return None


def _json_arguments(arguments: Any) -> Any:
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments  # reported by _tool_call as not an object


def _tool_call(data: Any) -> ToolCall | ToolCallError:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCallError('a tool call must be a JSON object {"name": NAME, "arguments": {...}}')
    arguments = data.get("arguments", {})
    if not isinstance(arguments, dict):
        return ToolCallError(f"the arguments of tool call {data['name']!r} must be a JSON object, got {arguments!r}")
    return ToolCall(name=data["name"], arguments=arguments)


class ToolEnvironment(Environment):
    """A multi-turn env whose model calls the tools of `tool_class`; reward functions get `env`."""

    def __init__(
        self,
        *,
        tool_class: type,
        factory: Callable[[], Any] | None = None,
        max_turns: int = 8,
        tool_timeout: float | None = 60.0,
        **kwargs: Any,
    ) -> None:
        """`tool_timeout`: seconds an async tool call may run before it is cancelled and the model
        told so (None: no limit but the rollout's own timeout)."""
        super().__init__(max_turns=max_turns, **kwargs)
        self.tool_timeout = tool_timeout
        self.tool_class = tool_class
        self.factory = factory or tool_class
        self.tool_by_name = tools_of(tool_class)
        self.schemas = [tool.schema for tool in self.tool_by_name.values()]

    def tools(self, state: RolloutState) -> list[dict[str, Any]]:
        return self.schemas

    async def setup(self, state: RolloutState) -> None:
        state.env = self.factory()
        if hasattr(state.env, "reset"):
            fields = {name: getattr(state.task, name) for name in type(state.task).model_fields if name != "idx"}
            result = state.env.reset(**fields)
            if inspect.isawaitable(result):
                await result

    async def episode(self, state: RolloutState, client: ModelClient, sampling: SamplingArgs) -> None:
        await super().episode(state, client, sampling)
        metrics, turns = state.trace.metrics, state.trace.num_turns
        if turns:
            metrics["valid_tool_call_share"] = metrics.get("valid_tool_call_turns", 0.0) / turns

    async def env_response(self, state: RolloutState) -> list[Message]:
        calls = parse_tool_calls(state.messages[-1])
        if not calls:
            state.stop("completed")
            return []
        replies, valid = [], True
        for i, call in enumerate(calls):
            # The model's own id, else one unique in the rollout: turn number and position.
            call_id = call.id if isinstance(call, ToolCall) and call.id else f"call_{state.trace.num_turns}_{i}"
            content, well_formed = await self._run(state, call)
            valid = valid and well_formed
            replies.append({"role": "tool", "tool_call_id": call_id, "content": content})
            if getattr(state.env, "done", False):
                state.stop("tool_ended")
                break
        if valid:
            metrics = state.trace.metrics
            metrics["valid_tool_call_turns"] = metrics.get("valid_tool_call_turns", 0.0) + 1
        return replies

    async def _run(self, state: RolloutState, call: ToolCall | ToolCallError) -> tuple[str, bool]:
        """The tool's reply and whether the call itself was valid (parsed, a known tool, valid arguments)."""
        metrics = state.trace.metrics
        metrics["tool_calls"] = metrics.get("tool_calls", 0.0) + 1
        try:
            if isinstance(call, ToolCallError):
                raise call
            tool = self.tool_by_name.get(call.name)
            if tool is None:
                raise ToolCallError(f"there is no tool {call.name!r}; the tools are: {', '.join(self.tool_by_name)}")
            started = time.monotonic()
            try:
                return await self._call(tool, state.env, call.arguments), True
            finally:
                spent = state.trace.timing.tools
                spent[tool.name] = spent.get(tool.name, 0.0) + time.monotonic() - started
        except SandboxError:
            raise  # the sandbox failed, not the model: an error Trace of its type, not a tool message
        except Exception as e:  # noqa: BLE001 - the model is told what went wrong and may try again
            metrics["tool_errors"] = metrics.get("tool_errors", 0.0) + 1
            if isinstance(e, ToolCallError):
                return f"Error: {e}", False
            return f"Error: {type(e).__name__}: {e}", True

    async def _call(self, tool: Tool, instance: Any, arguments: dict[str, Any]) -> str:
        if self.tool_timeout is None or not tool.is_async:
            return await tool.call(instance, arguments)
        try:
            async with asyncio.timeout(self.tool_timeout) as deadline:
                return await tool.call(instance, arguments)
        except TimeoutError:
            if not deadline.expired():
                raise  # the tool's own TimeoutError
            raise TimeoutError(f"tool {tool.name} did not answer within {self.tool_timeout}s (tool_timeout)") from None

    async def cleanup(self, state: RolloutState) -> None:
        close = getattr(state.env, "close", None)
        if callable(close):
            result = close()
            if inspect.isawaitable(result):
                await result
