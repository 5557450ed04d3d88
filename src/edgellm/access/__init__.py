"""Access: API keys and tenants, per-key rate limits and budgets, and usage records."""

from .guard import Principal, admit_generation, authenticate
from .usage import account, departed, observe

__all__ = ["Principal", "account", "admit_generation", "authenticate", "departed", "observe"]
