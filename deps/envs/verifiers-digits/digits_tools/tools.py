"""The MCP tool server of digits-tools: one tool that continues a count (a verifiers `Toolset`,
started by verifiers per rollout as `python -m digits_tools.tools`)."""

import verifiers.v1 as vf


class CountToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "count"

    @vf.tool
    def next_numbers(self, last: int, n: int = 3) -> str:
        """The `n` numbers after `last`, space-separated (n is capped at 10)."""
        return " ".join(str(last + i) for i in range(1, min(max(n, 1), 10) + 1))


if __name__ == "__main__":
    CountToolset.run()
