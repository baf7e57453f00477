from kiln.optim.adamw import build_optimizer, param_groups

__all__ = ["build_optimizer", "param_groups"]
