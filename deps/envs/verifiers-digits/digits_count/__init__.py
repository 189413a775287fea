from digits_count.taskset import DigitsTaskset

__all__ = ["DigitsTaskset"]
