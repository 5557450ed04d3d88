"""A `Generation` from scripted events, for renderer tests (an exception item is raised there)."""

from __future__ import annotations

from typing import Any, AsyncIterator

from edgellm.generation import Generation


async def _events(*items: Any) -> AsyncIterator[Any]:
    for item in items:
        if isinstance(item, BaseException):
            raise item
        yield item


def scripted_generation(*items: Any, model: str = "@cf/meta/llama-2-7b-chat-int8") -> Generation:
    return Generation(model, _events(*items))
