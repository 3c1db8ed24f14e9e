"""Attention-sink masking ablations for lm-evaluation-harness.

Importing this package is deliberately cheap (no torch, no lm_eval): the start-up hook in
``_autoload`` imports it in every interpreter.
"""

__version__ = "0.1.0"
