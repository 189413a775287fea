from digits_tools.taskset import DigitsToolsTaskset

__all__ = ["DigitsToolsTaskset"]
