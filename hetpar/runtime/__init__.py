"""Runtime profiles (what Megatron-LM and DeepSpeed can run), launch layouts and export."""

from hetpar.runtime.rules import RUNTIMES, Runtime, check_plan, get_runtime, runnable_by

__all__ = ["RUNTIMES", "Runtime", "check_plan", "get_runtime", "runnable_by"]
