"""One home for timing units: tuner._units converts between seconds and the millisecond formats."""

from __future__ import annotations

import pytest

from tuner._units import from_seconds, ms_to_s, s_to_ms, to_seconds


def test_conversions_round_trip_and_agree() -> None:
    assert to_seconds(1500.0, "ms") == 1.5 == ms_to_s(1500.0)
    assert to_seconds(250.0, "us") == 0.00025
    assert to_seconds(2.0, "s") == 2.0
    assert from_seconds(1.5, "ms") == 1500.0 == s_to_ms(1.5)
    assert from_seconds(0.00025, "us") == pytest.approx(250.0)
    for unit in ("s", "ms", "us"):
        assert to_seconds(from_seconds(0.125, unit), unit) == pytest.approx(0.125)


def test_an_unknown_unit_is_refused() -> None:
    with pytest.raises(ValueError, match="'min'"):
        to_seconds(1.0, "min")
