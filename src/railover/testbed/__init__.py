"""Test beds with real link faults.

* :mod:`railover.testbed.netns`: hosts and NICs as network namespaces, veth pairs and one
  bridge per rail (``TestBed``); ``railover testbed up|down|list``.
* :mod:`railover.testbed.faults`: fault primitives (port down, silent black hole, one-way
  loss, rate limit, address change, ...) with exact undo and CLOCK_MONOTONIC timestamps.
* :mod:`railover.testbed.scenario`: runs ``railover-perf`` ranks on a bed under a fault
  schedule and analyses their journals.

The names most callers need are re-exported here (``from railover.testbed import TestBed``).
"""
from railover.testbed.netns import (PrivilegeError, TestBed, TestBedError, Topology,
                                    list_testbeds, now_us, poll_until)

__all__ = ["PrivilegeError", "TestBed", "TestBedError", "Topology", "list_testbeds", "now_us",
           "poll_until"]
