"""The GPU run: random-weight models at real shapes, the workloads, and the device script's entry."""
