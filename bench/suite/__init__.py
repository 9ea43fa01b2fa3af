"""The benchmark suite: four workloads, embedserve and its peers, one report (``python -m bench suite``)."""
