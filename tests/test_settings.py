"""A settings section's checks name the dotted key and say what was wanted."""

import pytest

from pfedes.settings import Section

SECTION = Section({"demo": {"mode": "fast", "rate": 2.5, "count": 3, "bad": "x", "on": True}}, "demo")


def test_good_values_are_read_and_missing_ones_take_the_default():
    assert SECTION.choice("mode", "slow", ["slow", "fast"]) == "fast"
    assert SECTION.number("rate", 1.0, "> 0", lambda v: v > 0) == 2.5
    assert SECTION.integer("count", 1, 0) == 3 and SECTION.integer("absent", 7, 0) == 7
    assert SECTION.flag("on", False) is True


@pytest.mark.parametrize("read, message", [
    (lambda s: s.choice("mode", "slow", ["slow"]), r"demo.mode 'fast' is unknown: expected one of \['slow'\]"),
    (lambda s: s.number("rate", 1.0, "in (0, 1]", lambda v: 0 < v <= 1), r"demo.rate must be in \(0, 1\], got 2.5"),
    (lambda s: s.number("bad", 1.0, "> 0", lambda v: v > 0), "demo.bad must be > 0, got x"),
    (lambda s: s.number("on", 1.0, "> 0", lambda v: v > 0), "demo.on must be > 0, got True"),
    (lambda s: s.integer("rate", 1, 0), "demo.rate must be an integer >= 0, got 2.5"),
])
def test_a_bad_value_names_its_key(read, message):
    with pytest.raises(ValueError, match=message):
        read(SECTION)
