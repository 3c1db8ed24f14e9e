"""lm-eval task configs for the sink-masking ablations (GSM8K and HumanEval variants).

Point lm-eval at ``TASKS_DIR`` (``--include_path``, or ``TaskManager(include_path=...)``).
Nothing heavy is imported here: the YAMLs reference ``gsm8k``, ``humaneval`` and
``code_eval`` in this package, which import lm-eval/datasets only when a task is built.
"""

from pathlib import Path

TASKS_DIR: Path = Path(__file__).resolve().parent

__all__ = ["TASKS_DIR"]
