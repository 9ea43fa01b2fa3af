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

from deploy_validators import (
    COMPOSE,
    COMPOSE_GPU,
    DEPLOY,
    DOCKERFILE,
    ROOT,
    compose_config,
    compose_resolved,
    compose_schema_errors,
    deploy_copy,  # noqa: F401 (a fixture)
    flag,
    instructions,
)
from embedserve.defaults.model_args import parse_model_spec

COMPOSE_RERANKER = DEPLOY / "docker-compose.reranker.yml"


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
def test_compose_validators_reject_a_broken_copy(deploy_copy: Path, broken: tuple[str, str],  # noqa: F811 (fixture)
                                                 expected: str) -> None:
    compose = deploy_copy / "docker-compose.yml"
    text = compose.read_text()
    assert broken[0] in text
    compose.write_text(text.replace(broken[0], broken[1]))
    result = compose_config(compose, cwd=deploy_copy.parent)
    assert result.returncode != 0 and expected in result.stderr
    assert any(expected in error or "not valid" in error
               for error in compose_schema_errors(yaml.safe_load(compose.read_text())))


def test_compose_config_rejects_a_dependency_on_a_missing_service(deploy_copy: Path) -> None:  # noqa: F811
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
    # A fixed frame port beside it, exposed like the gRPC one (the gateway learns it from Info).
    frame_port = flag(replica["command"], "frame-port")
    assert frame_port != grpc_port and {grpc_port, frame_port} <= set(replica["expose"])
    assert gateway["depends_on"]["replica"]["condition"] == "service_healthy"
    gateway_port = flag(gateway["command"], "port")
    assert gateway["healthcheck"]["test"][-1] == f"http://127.0.0.1:{gateway_port}/ready"
    for name, service in services.items():
        # model-init is one-shot: the others wait for it to exit 0, so it must not restart.
        expected = ("no",) if name == "model-init" else ("unless-stopped", "always", "on-failure")
        assert service["restart"] in expected, name
    resolved = compose_resolved(COMPOSE, cwd=ROOT)["services"]
    # One named volume holds the models for every embedserve service.
    for name in ("replica", "gateway"):
        assert any(v["source"] == "models" and v["target"] == "/models" for v in resolved[name]["volumes"])
        assert flag(resolved[name]["command"], "model").startswith("/models/")


def _mounts(service: dict) -> dict[str, dict]:
    """A resolved service's named volumes by source."""
    return {v["source"]: v for v in service.get("volumes", []) if v["type"] == "volume"}


@pytest.mark.parametrize("files", [(COMPOSE,), (COMPOSE, COMPOSE_GPU), (COMPOSE, COMPOSE_RERANKER)])
def test_one_service_writes_the_shared_volumes_before_the_others_start(files: tuple[Path, ...]) -> None:
    # Two replicas mounting a fresh `models` volume at once both copied the image's
    # /models into it, and one failed ("failed to create symlink ... file exists").
    services = compose_resolved(*files, cwd=ROOT)["services"]
    writers = {name for name, service in services.items()
               for volume in _mounts(service).values()
               if volume["source"] in ("models", "hf-cache")
               and not volume.get("volume", {}).get("nocopy", False)}
    assert writers == {"model-init"}
    for name, service in services.items():
        if name != "model-init" and {"models", "hf-cache"} & set(_mounts(service)):
            assert service["depends_on"]["model-init"]["condition"] == "service_completed_successfully", name
    assert _mounts(services["gateway"])["models"].get("read_only") is True


@pytest.mark.parametrize("files", [(COMPOSE,), (COMPOSE, COMPOSE_GPU), (COMPOSE, COMPOSE_RERANKER)])
def test_each_image_is_built_by_one_service(files: tuple[Path, ...]) -> None:
    # Two services with `build:` and one tag built the image twice (and left a dangling copy).
    services = compose_resolved(*files, cwd=ROOT)["services"]
    builders: dict[str, list[str]] = {}
    for name, service in services.items():
        if "build" in service:
            builders.setdefault(service["image"], []).append(name)
    assert all(len(names) == 1 for names in builders.values()), builders
    for name, service in services.items():
        if service["image"].startswith("embedserve:") and "build" not in service:
            # Runs an image another service builds; never pulled from a registry.
            assert service["image"] in builders and service["pull_policy"] == "never", name


def test_a_hub_id_is_the_model_of_every_embedserve_service() -> None:
    env = {"EMBEDSERVE_MODEL": "BAAI/bge-small-en-v1.5"}
    services = compose_resolved(COMPOSE, cwd=ROOT, env=env)["services"]
    assert services["model-init"]["command"] == ["model", "pull", "BAAI/bge-small-en-v1.5"]
    for name in ("replica", "gateway"):
        assert flag(services[name]["command"], "model") == "BAAI/bge-small-en-v1.5"
    # model-init pulls (the image is offline otherwise) on the network that reaches out,
    # into the volume the others read as the image's HF_HOME.
    init = services["model-init"]
    assert init["environment"]["HF_HUB_OFFLINE"] == "0" and set(init["networks"]) == {"edge"}
    image_env = dict(pair.split("=", 1) for kind, rest in instructions(DOCKERFILE.read_text())
                     if kind == "ENV" for pair in rest.split() if "=" in pair)
    hf_home = image_env["HF_HOME"]
    assert image_env["HF_HUB_OFFLINE"] == "1"
    for name in ("model-init", "replica", "gateway"):
        assert _mounts(services[name])["hf-cache"]["target"] == hf_home, name
    # HF_TOKEN is passed on from the shell only when set there (gated or private repos):
    # null, i.e. left unset in the container, otherwise.
    assert init["environment"]["HF_TOKEN"] is None
    with_token = compose_resolved(COMPOSE, cwd=ROOT, env={**env, "HF_TOKEN": "hf_x"})["services"]
    assert with_token["model-init"]["environment"]["HF_TOKEN"] == "hf_x"


def test_compose_publishes_the_gateway_grpc_api_on_its_flag_port() -> None:
    gateway = _compose()["services"]["gateway"]
    grpc_port = flag(gateway["command"], "grpc-port")
    assert grpc_port != flag(gateway["command"], "port")
    assert f"${{EMBEDSERVE_GRPC_PORT:-{grpc_port}}}:{grpc_port}" in gateway["ports"]
    reranker = yaml.safe_load((DEPLOY / "docker-compose.reranker.yml").read_text())
    assert flag(reranker["services"]["gateway"]["command"], "grpc-port") == grpc_port


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


def test_images_and_package_sources_come_from_the_environment(tmp_path: Path) -> None:
    # Without Docker Hub or the public internet every name of a registry or
    # index must be replaceable; Compose itself resolves the file here.
    ca = tmp_path / "ca.pem"
    ca.write_text("not a real certificate\n")
    env = {"PYTHON_IMAGE": "local/base:1", "PROMETHEUS_IMAGE": "local/prometheus:1",
           "EMBEDSERVE_BUILD_NETWORK": "host", "TORCH_INDEX_URL": "http://127.0.0.1:9/torch/",
           "PIP_INDEX_URL": "http://mirror.invalid/simple", "PIP_EXTRA_INDEX_URL": "http://127.0.0.1:9/extra/",
           "PIP_TRUSTED_HOST": "mirror.invalid", "PIP_CERT": str(ca)}
    resolved = compose_resolved(COMPOSE, cwd=ROOT, env=env)
    services = resolved["services"]
    assert services["prometheus"]["image"] == "local/prometheus:1"
    for name in ("model-init",):
        build = services[name]["build"]
        assert build["network"] == "host"
        assert build["args"] == {"PYTHON_IMAGE": "local/base:1", "TORCH_VARIANT": "cpu",
                                 "TORCH_INDEX_URL": "http://127.0.0.1:9/torch/",
                                 "PIP_INDEX_URL": "http://mirror.invalid/simple",
                                 "PIP_EXTRA_INDEX_URL": "http://127.0.0.1:9/extra/",
                                 "PIP_TRUSTED_HOST": "mirror.invalid"}
        assert [secret["source"] for secret in build["secrets"]] == ["pip_ca"]
    assert resolved["secrets"]["pip_ca"]["file"] == str(ca)


def test_defaults_build_from_the_public_registries() -> None:
    resolved = compose_resolved(COMPOSE, cwd=ROOT)
    services = resolved["services"]
    assert services["prometheus"]["image"].startswith("prom/prometheus:")
    build = services["model-init"]["build"]
    assert build["network"] == "default"
    assert build["args"]["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"
    # Empty: the Dockerfile picks PyTorch's index for TORCH_VARIANT.
    assert build["args"]["TORCH_INDEX_URL"] == "" and build["args"]["PIP_EXTRA_INDEX_URL"] == ""
    # No CA given: an empty secret, which the Dockerfile skips.
    assert resolved["secrets"]["pip_ca"]["file"] == "/dev/null"


def test_gpu_override_keeps_the_torch_index_following_the_variant() -> None:
    replica = compose_resolved(COMPOSE, COMPOSE_GPU, cwd=ROOT)["services"]["replica"]
    assert replica["build"]["args"]["TORCH_VARIANT"].startswith("cu")
    # A fixed .../whl/cpu URL here would silently build a CPU torch into the CUDA image.
    assert replica["build"]["args"]["TORCH_INDEX_URL"] == ""


def test_only_the_gateway_and_prometheus_reach_the_replicas() -> None:
    resolved = compose_resolved(COMPOSE, cwd=ROOT)
    services, networks = resolved["services"], resolved["networks"]
    replica_networks = set(services["replica"]["networks"])
    assert replica_networks == {"replicas"} and networks["replicas"].get("internal") is True
    assert "ports" not in services["replica"]
    reaching = {name for name, service in services.items() if replica_networks & set(service["networks"])}
    assert reaching == {"replica", "gateway", "prometheus"}
    # Published ports need a non-internal network.
    for name in ("gateway", "prometheus"):
        assert services[name]["ports"] and "edge" in services[name]["networks"]
        assert not networks["edge"].get("internal", False)


def test_gateway_is_not_restarted_when_a_replica_restarts() -> None:
    # depends_on `restart: true` would restart the gateway whenever Compose
    # restarts a replica, dropping every in-flight request; replica loss is
    # handled inside the gateway (health checks, retry on another replica).
    gateway = compose_resolved(COMPOSE, cwd=ROOT)["services"]["gateway"]
    dependency = gateway["depends_on"]["replica"]
    assert dependency["condition"] == "service_healthy" and not dependency.get("restart", False)


def test_gateway_and_replicas_share_the_replica_token() -> None:
    # Replicas refuse calls without the token; the gateway must send the same one.
    env = {"EMBEDSERVE_REPLICA_TOKEN_FILE": "/srv/embedserve/replica-token"}
    for files in ((COMPOSE,), (COMPOSE, COMPOSE_GPU)):
        resolved = compose_resolved(*files, cwd=ROOT, env=env)
        assert resolved["secrets"]["replica_token"]["file"] == "/srv/embedserve/replica-token"
        for name in ("replica", "gateway"):
            service = resolved["services"][name]
            assert [secret["source"] for secret in service["secrets"]] == ["replica_token"], (files, name)
            assert flag(service["command"], "replica-token-file") == "/run/secrets/replica_token", (files, name)
    # Without the variable: a file next to the compose file, which git ignores.
    default = compose_resolved(COMPOSE, cwd=ROOT)["secrets"]["replica_token"]["file"]
    assert default == str(DEPLOY / "replica-token")
    assert "/deploy/replica-token" in (ROOT / ".gitignore").read_text().split()


# -- two models: docker-compose.reranker.yml over docker-compose.yml --------------

def test_two_model_override_merges_and_passes_config() -> None:
    result = compose_config(COMPOSE, COMPOSE_RERANKER, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert compose_schema_errors(yaml.safe_load(COMPOSE_RERANKER.read_text())) == []


def test_two_model_gateway_routes_each_model_to_its_own_replicas() -> None:
    services = compose_resolved(COMPOSE, COMPOSE_RERANKER, cwd=ROOT)["services"]
    gateway = services["gateway"]
    specs = [parse_model_spec(arg.split("=", 1)[1]) for arg in gateway["command"]
             if arg.startswith("--model=")]
    assert [spec.names for spec in specs] == [("default",), ("reranker",)]
    served = []
    for spec in specs:
        assert spec.upstream is not None and spec.upstream.startswith("dns:")
        service_name, port = spec.upstream[len("dns:"):].rsplit(":", 1)
        replica = services[service_name]
        # The service behind the DNS name listens there and serves this very model.
        assert flag(replica["command"], "port") == port
        assert flag(replica["command"], "model") == str(spec.path)
        assert replica["healthcheck"]["test"][-1] == f"grpc://127.0.0.1:{port}"
        assert gateway["depends_on"][service_name]["condition"] == "service_healthy"
        assert "ports" not in replica and replica["restart"] == "unless-stopped"
        assert replica["image"] == services["replica"]["image"]
        assert replica["networks"].keys() == {"replicas"}
        served.append(service_name)
    assert sorted(served) == ["replica", "replica-reranker"]
