"""The places of the local edge's HTTP front, as pure functions: one address's share of the
connection places as the edge fills, and the deadlines a loaded edge gives."""

from __future__ import annotations

import pytest

from edgellm_local.emulator.hardening import PRESSURE_FROM, PRESSURE_FULL, ConnectionBook, ServerLimits, address_share, scaled_timeout


@pytest.mark.parametrize(
    ("capacity", "open_now", "floor", "ceiling", "share"),
    [
        (512, 0, 4, 256, 256),  # idle: half the free places
        (512, 0, 4, 64, 64),  # never past the ceiling
        (512, 300, 4, 256, 106),  # filling: half of the 212 free
        (512, 500, 4, 256, 6),
        (512, 505, 4, 256, 4),  # the floor, while any place is free
        (512, 511, 4, 256, 4),
        (512, 512, 4, 256, 0),  # full: nobody gets another
        (512, 600, 4, 256, 0),
        (24, 0, 4, 8, 8),
        (10, 0, 8, 2, 2),  # a ceiling under the floor wins
    ],
)
def test_an_address_share_is_half_the_free_places_within_its_bounds(capacity: int, open_now: int, floor: int, ceiling: int,
                                                                    share: int) -> None:
    assert address_share(capacity, open_now, floor, ceiling) == share


@pytest.mark.parametrize(
    ("pressure", "expected"),
    [
        (0.0, 30.0),
        (PRESSURE_FROM, 30.0),
        ((PRESSURE_FROM + PRESSURE_FULL) / 2, 16.0),  # halfway between 30 and 2
        (PRESSURE_FULL, 2.0),
        (1.0, 2.0),
        (1.5, 2.0),
    ],
)
def test_a_deadline_shrinks_with_the_pressure(pressure: float, expected: float) -> None:
    assert scaled_timeout(30.0, 2.0, pressure) == pytest.approx(expected)


def test_a_floor_above_the_base_never_lengthens_a_deadline() -> None:
    assert scaled_timeout(1.0, 5.0, 0.0) == 1.0 and scaled_timeout(1.0, 5.0, 1.0) == 1.0


def test_one_greedy_address_leaves_others_their_floor() -> None:
    """An address taking all it may, alone on the edge, leaves two thirds of the places; nine
    more greedy ones after it never fill the last few, and a newcomer still gets its floor."""
    limits = ServerLimits(max_connections=512)
    book = ConnectionBook(limits)
    for n in range(10):
        while book.admit(f"10.0.0.{n}") is None:
            pass
    first = book.by_address["10.0.0.0"]
    assert 160 <= first <= 180  # about a third
    assert book.open < limits.max_connections
    assert all(book.admit("10.9.9.9") is None for _ in range(limits.min_connections_per_client))
    assert book.admit("10.9.9.9") is not None
    for address, held in list(book.by_address.items()):
        for _ in range(held):
            book.leave(address)
    assert book.open == 0 and book.by_address == {}


def test_bodies_never_take_the_reserved_places() -> None:
    limits = ServerLimits(max_connections=64, reserved_connections=8)
    book = ConnectionBook(limits)
    taken = sum(book.take_body_place() for _ in range(100))
    assert taken == limits.body_places == 56
    assert ServerLimits(max_connections=10, reserved_connections=32).body_places == 5  # at most half reserved
