"""`inference` serves chat tool calls with the vLLM parser of the model's family (issue 39)."""

from pathlib import Path

from envrl.config import ModelConfig
from envrl.inference.config import InferenceConfig
from envrl.inference.server import vllm_args
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

NO_TOOLS_TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"


def served(**vllm: object) -> InferenceConfig:
    return InferenceConfig(model=ModelConfig(name=str(DEFAULT_DIR)), vllm=vllm)


def test_a_hermes_template_is_served_with_vllms_hermes_parser_and_auto_tool_choice() -> None:
    args = vllm_args(served(), on_cpu=True)
    assert args.enable_auto_tool_choice and args.tool_call_parser == "hermes"


def test_a_template_that_teaches_no_tool_syntax_gets_no_parser(tmp_path: Path) -> None:
    template = tmp_path / "plain.jinja"
    template.write_text(NO_TOOLS_TEMPLATE)
    args = vllm_args(served(chat_template=str(template)), on_cpu=True)
    assert not args.enable_auto_tool_choice and args.tool_call_parser is None


def test_the_users_own_parser_wins() -> None:
    args = vllm_args(served(tool_call_parser="pythonic", enable_auto_tool_choice=True), on_cpu=True)
    assert args.tool_call_parser == "pythonic"
