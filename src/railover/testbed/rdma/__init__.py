"""RDMA test bed: QEMU guests ("hosts") with Soft-RoCE (rxe) on every rail NIC.

* :mod:`railover.testbed.rdma.image`: the guest image (Debian kernel + initramfs), built from
  Debian packages at first use and cached under ``$XDG_CACHE_HOME/railover``.
* :mod:`railover.testbed.rdma.guest`: the guest's ``/init`` and control protocol.
* :mod:`railover.testbed.rdma.bed`: :class:`RdmaBed` boots the guests, runs commands in them,
  fetches files, and tears everything down.
* :mod:`railover.testbed.rdma.faults`: fault primitives (cable pull, admin down, black hole,
  one-way loss, rate limit, flap, address change) with exact undo, stamped on the guest's
  CLOCK_MONOTONIC.
"""
from railover.testbed.rdma.bed import (GuestCrash, GuestProc, RdmaBed, RdmaBedError, RdmaHost,
                                       RdmaNic, list_rdma_beds, cleanup_rdma_leftovers)

__all__ = ["GuestCrash", "GuestProc", "RdmaBed", "RdmaBedError", "RdmaHost", "RdmaNic",
           "list_rdma_beds", "cleanup_rdma_leftovers"]
