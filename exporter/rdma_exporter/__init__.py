"""rdma-exporter: Prometheus metrics for InfiniBand and RoCE fabrics."""

__version__ = "0.1.0"
