"""Access: API keys and tenants, per-key rate limits and budgets, and usage records."""

from .guard import Principal, admit_generation, admit_tokens, authenticate
from .usage import account, departed, observe

__all__ = ["Principal", "account", "admit_generation", "admit_tokens", "authenticate", "departed", "observe"]
