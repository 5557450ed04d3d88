"""Answer and request ids cut from blocks of CSPRNG bytes (`edgellm.ids`): one draw from the OS
serves many ids, and no two ids share bytes."""

from __future__ import annotations

import re
import secrets

from edgellm.ids import RandomIds


def test_ids_come_from_one_draw_per_block_and_never_repeat() -> None:
    draws: list[int] = []

    def source(n: int) -> bytes:
        draws.append(n)
        return secrets.token_bytes(n)

    ids = RandomIds(block=120, source=source)
    made = [ids.new("chatcmpl") for _ in range(100)]  # 12 bytes each: 10 per block
    assert all(re.fullmatch(r"chatcmpl-[0-9a-f]{24}", i) for i in made)
    assert len(set(made)) == 100
    assert draws == [120] * 10
    assert len(ids.hex(8)) == 16 and len(ids.hex(500)) == 1000  # larger than a block: a draw of its own size


def test_the_bytes_are_the_sources_own_in_order() -> None:
    stream = bytes(range(256)) * 4
    taken = iter([stream[:48], stream[48:96]])
    ids = RandomIds(block=48, source=lambda n: next(taken))
    assert [ids.hex(12) for _ in range(8)] == [stream[i:i + 12].hex() for i in range(0, 96, 12)]
