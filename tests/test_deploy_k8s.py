"""deploy/k8s/*.yaml: schema validation and the wiring between the manifests.

Every document validates with ``kubernetes-validate --strict`` against the
oldest supported and the newest Kubernetes API schemas, and a broken copy is
rejected; then selectors, ports, probes and ConfigMap references are checked
against each other. The two-model manifests (``two-models/``, applied over
the base) get the same checks, and each model the gateway serves must reach
replicas serving that model.
"""

from __future__ import annotations

import copy
import re

import yaml

from deploy_validators import K8S, flag, k8s_documents, k8s_errors
from embedserve.defaults.model_args import parse_model_spec


def test_k8s_manifests_validate_against_the_api_schemas() -> None:
    documents = k8s_documents()
    kinds = sorted(doc["kind"] for _, doc in documents)
    assert kinds == ["ConfigMap", "Deployment", "Deployment", "HorizontalPodAutoscaler", "NetworkPolicy",
                     "PodDisruptionBudget", "PodDisruptionBudget", "Secret", "Service", "Service"]
    for name, document in documents:
        assert k8s_errors(document) == [], name


def test_k8s_validation_rejects_a_broken_manifest() -> None:
    _, replica = _k8s("Deployment", "embedserve-replica")
    probe = replica["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["grpc"]["port"] = "grpc"  # gRPC probes take a number, not a port name
    assert any("not of type 'integer'" in error for error in k8s_errors(replica))
    _, hpa = _k8s("HorizontalPodAutoscaler", "embedserve-replica")
    hpa["spec"]["maxReplica"] = hpa["spec"].pop("maxReplicas")
    assert k8s_errors(hpa)
    _, policy = _k8s("NetworkPolicy", "embedserve-replica")
    policy["spec"]["ingress"][0]["ports"][0]["port"] = {"number": 50051}  # a port is a number or a name
    assert k8s_errors(policy)


def _k8s(kind: str, name: str) -> tuple[str, dict]:
    matches = [(f, d) for f, d in k8s_documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, (kind, name)
    return matches[0]


def _container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_k8s_services_and_policies_select_the_right_pods() -> None:
    for component in ("replica", "gateway"):
        _, deployment = _k8s("Deployment", f"embedserve-{component}")
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        _, service = _k8s("Service", f"embedserve-{component}")
        assert service["spec"]["selector"].items() <= pod_labels.items()
        _, pdb = _k8s("PodDisruptionBudget", f"embedserve-{component}")
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in {p["name"] for p in _container(deployment)["ports"]}
    _, hpa = _k8s("HorizontalPodAutoscaler", "embedserve-replica")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "embedserve-replica"}


def test_k8s_gateway_discovers_replicas_through_the_headless_service() -> None:
    _, config = _k8s("ConfigMap", "embedserve-config")
    _, service = _k8s("Service", "embedserve-replica")
    assert service["spec"]["clusterIP"] == "None"
    assert not service["spec"].get("publishNotReadyAddresses", False)
    grpc_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert config["data"]["UPSTREAM"] == f"dns:{service['metadata']['name']}:{grpc_port}"


def test_k8s_probes_match_what_each_container_listens_on() -> None:
    _, replica = _k8s("Deployment", "embedserve-replica")
    container = _container(replica)
    grpc_port = int(flag(container["args"], "port"))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == grpc_port, probe
    assert container["resources"]["requests"] and container["resources"]["limits"]
    _, gateway = _k8s("Deployment", "embedserve-gateway")
    container = _container(gateway)
    http = next(p for p in container["ports"] if p["name"] == "http")
    assert http["containerPort"] == int(flag(container["args"], "port"))
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["resources"]["requests"] and container["resources"]["limits"]


def test_k8s_gateway_serves_and_exposes_the_grpc_api() -> None:
    _, gateway = _k8s("Deployment", "embedserve-gateway")
    container = _container(gateway)
    grpc = next(p for p in container["ports"] if p["name"] == "grpc")
    assert grpc["containerPort"] == int(flag(container["args"], "grpc-port"))
    _, service = _k8s("Service", "embedserve-gateway")
    exposed = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert exposed["targetPort"] == "grpc" and exposed["appProtocol"] == "grpc"
    overlay = _container(_overlay("Deployment", "embedserve-gateway"))
    assert flag(overlay["args"], "grpc-port") == flag(container["args"], "grpc-port")


def test_k8s_args_only_reference_configmap_keys() -> None:
    _, config = _k8s("ConfigMap", "embedserve-config")
    for component in ("replica", "gateway"):
        _, deployment = _k8s("Deployment", f"embedserve-{component}")
        container = _container(deployment)
        assert container["envFrom"] == [{"configMapRef": {"name": "embedserve-config"}}]
        for arg in container["args"]:
            if "$(" in arg:
                name = arg.split("$(", 1)[1].split(")", 1)[0]
                assert name in config["data"], (component, arg)


def _pod_labels(component: str) -> dict:
    _, deployment = _k8s("Deployment", f"embedserve-{component}")
    return deployment["spec"]["template"]["metadata"]["labels"]


def _container_port(component: str, name: str) -> int:
    _, deployment = _k8s("Deployment", f"embedserve-{component}")
    return next(p["containerPort"] for p in _container(deployment)["ports"] if p["name"] == name)


def test_k8s_network_policy_admits_only_the_gateway_and_prometheus() -> None:
    _, policy = _k8s("NetworkPolicy", "embedserve-replica")
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= _pod_labels("replica").items()
    assert spec["policyTypes"] == ["Ingress"]
    admitted = {}
    for rule in spec["ingress"]:
        (source,) = rule["from"]
        ports = tuple(p["port"] for p in rule["ports"])
        admitted[ports] = source
    # Exactly two doors: gRPC and frames for the gateway pods, metrics for Prometheus.
    gateway_ports = (_container_port("replica", "grpc"), _container_port("replica", "frames"))
    assert set(admitted) == {gateway_ports, (_container_port("replica", "metrics"),)}
    gateway_source = admitted[gateway_ports]
    assert set(gateway_source) == {"podSelector"}   # same namespace, gateway pods only
    assert gateway_source["podSelector"]["matchLabels"].items() <= _pod_labels("gateway").items()
    assert not gateway_source["podSelector"]["matchLabels"].items() <= _pod_labels("replica").items()
    prometheus = admitted[(_container_port("replica", "metrics"),)]
    assert prometheus["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}


def test_k8s_replicas_listen_for_frames_on_the_port_they_declare() -> None:
    """A frame port the gateway cannot reach costs nothing but speed (its calls stay on
    gRPC), so nothing else would notice these three disagreeing."""
    replicas = [_container(_k8s("Deployment", "embedserve-replica")[1]),
                _container(_overlay("Deployment", "embedserve-replica-reranker"))]
    for container in replicas:
        frames = next(p["containerPort"] for p in container["ports"] if p["name"] == "frames")
        assert int(flag(container["args"], "frame-port")) == frames
        assert frames != int(flag(container["args"], "port"))


def test_k8s_gateway_and_replicas_mount_the_same_token() -> None:
    _, secret = _k8s("Secret", "embedserve-replica-token")
    # Shipped empty: both programs refuse an empty token file, so nobody runs with a known token.
    assert secret["stringData"] == {"token": ""}
    for component in ("replica", "gateway"):
        _, deployment = _k8s("Deployment", f"embedserve-{component}")
        pod = deployment["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if "secret" in v]
        assert volume["secret"]["secretName"] == secret["metadata"]["name"]
        assert volume["secret"]["defaultMode"] & 0o007 == 0, "not world-readable"
        # The non-root user reads it through the group the pod's fsGroup gives the files.
        assert volume["secret"]["defaultMode"] & 0o040 and pod["securityContext"]["fsGroup"] == \
            pod["securityContext"]["runAsGroup"]
        container = _container(deployment)
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["readOnly"] is True
        token_file = flag(container["args"], "replica-token-file")
        assert token_file == f"{mount['mountPath']}/token" and "token" in secret["stringData"]


# -- two models: deploy/k8s/two-models/ applied over the base ---------------------

TWO_MODELS = K8S / "two-models"


def _two_model_documents() -> list[tuple[str, dict]]:
    documents = []
    for path in sorted(TWO_MODELS.glob("*.yaml")):
        documents += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return documents


def _overlay(kind: str, name: str) -> dict:
    (document,) = [d for _, d in _two_model_documents()
                   if d["kind"] == kind and d["metadata"]["name"] == name]
    return document


def _selects(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


def test_two_model_manifests_validate_against_the_api_schemas() -> None:
    documents = _two_model_documents()
    assert {d["kind"] for _, d in documents} >= {"Deployment", "Service", "ConfigMap"}
    for name, document in documents:
        assert k8s_errors(document) == [], name


def test_two_model_gateway_differs_from_the_base_only_in_its_models() -> None:
    _, base = _k8s("Deployment", "embedserve-gateway")
    overlay = _overlay("Deployment", "embedserve-gateway")
    base_container, overlay_container = _container(copy.deepcopy(base)), _container(copy.deepcopy(overlay))
    (base_init,), (overlay_init,) = (copy.deepcopy(d["spec"]["template"]["spec"]["initContainers"])
                                     for d in (base, overlay))
    # The init container differs as the server does: the models it pulls and where they are named.
    for container in (base_container, overlay_container, base_init, overlay_init):
        container.pop("args")
        container.pop("envFrom")
    assert overlay_container == base_container and overlay_init == base_init
    without_container = lambda d: {**d, "spec": {**d["spec"], "template": {  # noqa: E731
        **d["spec"]["template"], "spec": {**d["spec"]["template"]["spec"], "containers": [],
                                          "initContainers": []}}}}
    assert without_container(overlay) == without_container(base)


def test_each_model_of_the_gateway_reaches_replicas_serving_that_model() -> None:
    _, config = _k8s("ConfigMap", "embedserve-config")
    variables = {**config["data"], **_overlay("ConfigMap", "embedserve-reranker-config")["data"]}
    expand = lambda text: re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], text)  # noqa: E731
    gateway = _container(_overlay("Deployment", "embedserve-gateway"))
    assert {"configMapRef": {"name": "embedserve-reranker-config"}} in gateway["envFrom"]
    specs = [parse_model_spec(expand(arg.split("=", 1)[1])) for arg in gateway["args"]
             if arg.startswith("--model=")]
    assert [spec.names for spec in specs] == [("default",), ("reranker",)]
    deployments = {"embedserve-replica": _k8s("Deployment", "embedserve-replica")[1],
                   "embedserve-replica-reranker": _overlay("Deployment", "embedserve-replica-reranker")}
    services = {"embedserve-replica": _k8s("Service", "embedserve-replica")[1],
                "embedserve-replica-reranker": _overlay("Service", "embedserve-replica-reranker")}
    served = []
    for spec in specs:
        assert spec.upstream is not None and spec.upstream.startswith("dns:")
        host, port = spec.upstream[len("dns:"):].rsplit(":", 1)
        service = services[host]
        assert service["spec"]["clusterIP"] == "None"
        assert int(port) == next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
        # Exactly one Deployment's pods sit behind the Service, and they serve this model.
        behind = [name for name, d in deployments.items()
                  if _selects(service["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])]
        assert len(behind) == 1, (host, behind)
        replica = _container(deployments[behind[0]])
        assert expand(flag(replica["args"], "model")) == str(spec.path)
        served.append(behind[0])
    assert sorted(served) == sorted(deployments)


def test_reranker_pods_have_their_own_disruption_budget_and_network_policy() -> None:
    reranker = _overlay("Deployment", "embedserve-replica-reranker")
    labels = reranker["spec"]["template"]["metadata"]["labels"]
    assert not _selects(_k8s("Service", "embedserve-replica")[1]["spec"]["selector"], labels)
    assert not _selects(_k8s("PodDisruptionBudget", "embedserve-replica")[1]["spec"]["selector"]["matchLabels"],
                        labels)
    pdb = _overlay("PodDisruptionBudget", "embedserve-replica-reranker")
    assert _selects(pdb["spec"]["selector"]["matchLabels"], labels)
    assert pdb["spec"]["minAvailable"] < reranker["spec"]["replicas"]
    policy = _overlay("NetworkPolicy", "embedserve-replica-reranker")
    assert _selects(policy["spec"]["podSelector"]["matchLabels"], labels)
    _, base_policy = _k8s("NetworkPolicy", "embedserve-replica")
    assert policy["spec"]["ingress"] == base_policy["spec"]["ingress"]


# -- models from the Hugging Face Hub ----------------------------------------------


def _variables() -> dict[str, str]:
    _, config = _k8s("ConfigMap", "embedserve-config")
    return {**config["data"], **_overlay("ConfigMap", "embedserve-reranker-config")["data"]}


def _expand(text: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], text)


def _embedserve_deployments() -> dict[str, dict]:
    return {"embedserve-replica": _k8s("Deployment", "embedserve-replica")[1],
            "embedserve-gateway": _k8s("Deployment", "embedserve-gateway")[1],
            "two-models/embedserve-gateway": _overlay("Deployment", "embedserve-gateway"),
            "embedserve-replica-reranker": _overlay("Deployment", "embedserve-replica-reranker")}


def test_k8s_every_pod_pulls_the_models_it_serves_before_it_starts() -> None:
    # With MODEL a Hub id, the server reads it offline (the image sets HF_HUB_OFFLINE=1)
    # from hf-cache, which the init container filled; a directory passes through `pull`.
    hub_ids = {"MODEL": "BAAI/bge-small-en-v1.5", "RERANKER_MODEL": "BAAI/bge-reranker-base@main"}
    for variables in (_variables(), {**_variables(), **hub_ids}):
        pulls = {}
        for name, deployment in _embedserve_deployments().items():
            pod = deployment["spec"]["template"]["spec"]
            (init,) = pod["initContainers"]
            server = _container(deployment)
            assert init["image"] == server["image"] and init["envFrom"] == server["envFrom"], name
            pull = [_expand(arg, variables) for arg in init["args"]]
            assert pull[:2] == ["model", "pull"], name
            served = [parse_model_spec(_expand(arg.split("=", 1)[1], variables))
                      for arg in server["args"] if arg.startswith("--model=")]
            assert pull[2:] == [str(spec.hub or spec.path) for spec in served], name
            pulls[name] = pull[2:]
            env = {e["name"]: e for e in init["env"]}
            assert env["HF_HUB_OFFLINE"]["value"] == "0", name
            token = env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert token["optional"] is True, "a public model needs no token Secret"
            (volume,) = [v for v in pod["volumes"] if v["name"] == "hf-cache"]
            assert "emptyDir" in volume or "persistentVolumeClaim" in volume
            (init_mount,) = [m for m in init["volumeMounts"] if m["name"] == "hf-cache"]
            (server_mount,) = [m for m in server["volumeMounts"] if m["name"] == "hf-cache"]
            assert init_mount["mountPath"] == server_mount["mountPath"] == HF_HOME, name
            assert not init_mount.get("readOnly") and server_mount["readOnly"] is True, name
        if variables["MODEL"] == hub_ids["MODEL"]:
            assert pulls["two-models/embedserve-gateway"] == ["BAAI/bge-small-en-v1.5",
                                                              "BAAI/bge-reranker-base@main"]
            assert pulls["embedserve-replica"] == ["BAAI/bge-small-en-v1.5"]


def _image_env() -> dict[str, str]:
    from deploy_validators import DOCKERFILE, instructions

    return dict(pair.split("=", 1) for kind, rest in instructions(DOCKERFILE.read_text())
                if kind == "ENV" for pair in rest.split() if "=" in pair)


HF_HOME = _image_env()["HF_HOME"]
