"""railover: an NCCL network plugin with transparent NIC failover, and tools to operate it.

The data path is the C++ plugin ``libnccl-net-railover.so``; this package finds it, sets
NCCL's environment, builds network-namespace test beds, injects faults and runs benchmarks.
"""

__version__ = "0.1.0"
