"""deploy/docker-compose.yml (+ the GPU override) and deploy/prometheus.yml.

Validated by Docker Compose v2's own ``config`` and by the compose-spec JSON
schema, each shown to reject a broken copy; then the wiring no validator
sees: ports, names and health targets that must agree across services and
with the Prometheus config.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deploy_validators import COMPOSE, COMPOSE_GPU, DEPLOY, ROOT, compose_config, compose_schema_errors, flag
from deploy_validators import deploy_copy  # noqa: F401 (a fixture)


def test_compose_file_passes_docker_compose_config() -> None:
    result = compose_config(COMPOSE, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_compose_gpu_override_merges_and_passes_config() -> None:
    result = compose_config(COMPOSE, COMPOSE_GPU, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_compose_files_match_the_compose_spec_schema() -> None:
    for path in (COMPOSE, COMPOSE_GPU):
        assert compose_schema_errors(yaml.safe_load(path.read_text())) == [], path


@pytest.mark.parametrize("broken, expected", [
    (("condition: service_healthy", "condition: service_happy"), "condition"),
    (("    healthcheck:\n      test: [\"CMD\", \"python\", \"-m\", \"embedserve.healthprobe\", \"grpc",
      "    healthchek:\n      test: [\"CMD\", \"python\", \"-m\", \"embedserve.healthprobe\", \"grpc"),
     "healthchek"),
])
def test_compose_validators_reject_a_broken_copy(deploy_copy: Path, broken: tuple[str, str],
                                                 expected: str) -> None:
    compose = deploy_copy / "docker-compose.yml"
    text = compose.read_text()
    assert broken[0] in text
    compose.write_text(text.replace(broken[0], broken[1]))
    result = compose_config(compose, cwd=deploy_copy.parent)
    assert result.returncode != 0 and expected in result.stderr
    assert any(expected in error or "not valid" in error
               for error in compose_schema_errors(yaml.safe_load(compose.read_text())))


def test_compose_config_rejects_a_dependency_on_a_missing_service(deploy_copy: Path) -> None:
    compose = deploy_copy / "docker-compose.yml"
    compose.write_text(compose.read_text().replace("      replica:\n        condition: service_healthy",
                                                   "      replicas:\n        condition: service_healthy"))
    result = compose_config(compose, cwd=deploy_copy.parent)
    assert result.returncode != 0 and "replicas" in result.stderr


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_topology_is_wired_consistently() -> None:
    services = _compose()["services"]
    replica, gateway = services["replica"], services["gateway"]
    # Scalable: no fixed container name or host port on the replicas.
    assert "container_name" not in replica and "ports" not in replica
    assert replica["deploy"]["replicas"] == 2
    # The gateway discovers every replica container through the service name.
    grpc_port = flag(replica["command"], "port")
    assert flag(gateway["command"], "upstream") == f"dns:replica:{grpc_port}"
    assert replica["healthcheck"]["test"][-1] == f"grpc://127.0.0.1:{grpc_port}"
    assert gateway["depends_on"]["replica"]["condition"] == "service_healthy"
    gateway_port = flag(gateway["command"], "port")
    assert gateway["healthcheck"]["test"][-1] == f"http://127.0.0.1:{gateway_port}/ready"
    for service in services.values():
        assert service["restart"] in ("unless-stopped", "always", "on-failure")
    # One named volume holds the models for every embedserve service.
    for service in (replica, gateway):
        assert any(str(v).startswith("models:/models") for v in service["volumes"])
        assert flag(service["command"], "model").startswith("/models/")


def test_prometheus_scrapes_every_tier_where_compose_exposes_it() -> None:
    services = _compose()["services"]
    prometheus = services["prometheus"]
    mounted = [v for v in prometheus["volumes"] if v.startswith("./prometheus.yml:")]
    assert mounted, "the provided prometheus.yml is mounted into the Prometheus service"
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    metrics_port = int(flag(services["replica"]["command"], "metrics-port"))
    assert str(metrics_port) in services["replica"]["expose"]
    replica_sd = jobs["replica"]["dns_sd_configs"][0]
    assert replica_sd["names"] == ["replica"] and replica_sd["port"] == metrics_port
    gateway_port = flag(services["gateway"]["command"], "port")
    assert jobs["gateway"]["static_configs"][0]["targets"] == [f"gateway:{gateway_port}"]


def test_gpu_override_reserves_a_gpu_and_runs_on_cuda() -> None:
    replica = yaml.safe_load(COMPOSE_GPU.read_text())["services"]["replica"]
    device = replica["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert flag(replica["command"], "device") == "cuda"
    assert replica["build"]["args"]["TORCH_VARIANT"].startswith("${TORCH_VARIANT:-cu")
