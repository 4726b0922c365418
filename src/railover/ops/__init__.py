"""Operating railover on a cluster: ``railover status`` / ``exporter`` (state files and
journals of running processes, Prometheus metrics), ``doctor`` (host and configuration
checks), ``launch`` (NCCL environment for a job) and ``drill`` (a fault drill on a live
host). :mod:`~railover.ops.cli` registers the commands."""
