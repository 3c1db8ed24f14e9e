"""Experiments built on the package: each module runs one study end to end and writes its report."""
