"""`railover demo` rejects bad options before it builds anything (no root needed)."""
from __future__ import annotations

import pytest
import typer

from railover import demo


@pytest.mark.parametrize("layout,size,duration,faults,words", [
    ("foo", "4M", 0, "port-down:a0", "unknown layout"),
    ("99x99", "4M", 0, "port-down:a0", "names would collide"),
    ("T2", "abc", 0, "port-down:a0", "bad size"),
    ("T2", "-4M", 0, "port-down:a0", "bad size"),
    ("T2", "0", 0, "port-down:a0", "at least 1 byte"),
    ("T2", "4M", -5, "port-down:a0", "must be >= 0"),
    ("1x2", "4M", 0, "silent:b0", "has no NIC b0"),
])
def test_bad_options_are_rejected_naming_the_option(layout, size, duration, faults, words):
    with pytest.raises(typer.BadParameter, match=words):
        demo.check_args(layout, size, duration, demo.parse_faults(faults))


def test_good_options_pass():
    demo.check_args("T2", "4M", 0, demo.parse_faults("port-down:a0,silent:b0"))
    demo.check_args("T3", "64K", 10, demo.parse_faults("host-down:c1"))
