"""Build the image, start the compose cluster for real, and check it end to end.

    scripts/compose-smoke.sh [--no-cache] [--report PATH] [--keep]

Steps, in order, each a pass/fail check with its figures in the report:
build the image (time, size); `docker compose up` with 2 replicas and
Prometheus (time to healthy); embeddings equal to sentence-transformers on
the image's own model files (cosine >= 0.9999); the gateway's /metrics;
every Prometheus target up; a replica crash (SIGKILL to its process, as the
OOM killer does) under concurrent load: 0 lost, 0 wrong, back by itself; a
`docker kill` of a replica under load: 0 lost, 0 wrong, and how it comes
back; a replica refuses a call without the replica token (UNAUTHENTICATED)
and serves it with the token; scale to 3 replicas without restarting the gateway, which then sends
work to the third; `docker compose down` leaving no container, network or
volume of the project.

Owns the Docker side (compose commands, container state, a throwaway
package index); the HTTP side is smoke_http.py. Needs a Docker engine on
this machine (the crash is a signal to the replica's host PID) with the
compose plugin, and numpy + sentence-transformers for the reference.

Without Docker Hub or the public internet (see deploy/Dockerfile): set
PYTHON_IMAGE / PROMETHEUS_IMAGE to local images (scripts/build-local-images.sh)
and give --torch-wheel (and --pip-mirror): the script serves them on
127.0.0.1 for the build, which then runs on the host network.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import http.server
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from smoke_http import (
    MIN_COSINE,
    Load,
    LoadCount,
    SmokeFailure,
    cosines,
    embed,
    is_ready,
    metric_total,
    prometheus_targets,
    request,
    wait_until,
)

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "deploy" / "docker-compose.yml"

# Real text in several scripts and lengths (one of a few hundred tokens), so
# parity covers the tokenizer's paths and a packed batch, not one toy string.
PARITY_TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Die Würde des Menschen ist unantastbar.",
    "Все люди рождаются свободными и равными в своем достоинстве и правах.",
    "人人生而自由，在尊严和权利上一律平等。",
    "すべての人間は、生まれながらにして自由であり、かつ、尊厳と権利とについて平等である。",
    "كل الناس يولدون أحرارا متساوين في الكرامة والحقوق.",
    " ".join(["Tous les êtres humains naissent libres et égaux en dignité et en droits."] * 12),
]
# No text ends in whitespace: there the served tokenizer (tokenizer.json
# semantics, a final "▁" token) and sentence-transformers' (sentencepiece
# semantics, trailing space dropped) differ by design, cosine ~0.98 for one
# short sentence; that is a tokenizer-compat question, not a deployment one.
LOAD_TEXTS = PARITY_TEXTS[:4]


@dataclass(frozen=True)
class SmokeSettings:
    project: str
    no_cache: bool
    keep: bool
    load_clients: int
    torch_wheel: Path | None
    pip_mirror: Path | None
    index_port: int
    report: Path | None


class Compose:
    """`docker compose` for one project, with the environment the cluster is configured by."""

    def __init__(self, project: str, env: dict[str, str]) -> None:
        self.project = project
        self.env = env

    def run(self, *args: str, timeout_s: float = 900) -> str:
        command = ["docker", "compose", "-p", self.project, "-f", str(COMPOSE_FILE), *args]
        result = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout_s, check=False)
        if result.returncode != 0:
            raise SmokeFailure(f"{' '.join(command[3:])} failed ({result.returncode}):\n"
                               f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
        return result.stdout

    def containers(self, service: str) -> list[dict]:
        """`docker inspect` of every container of ``service`` (stopped ones too), by number."""
        ids = self.run("ps", "-a", "-q", service).split()
        found = [inspect(container_id) for container_id in ids]
        return sorted(found, key=lambda c: int(c["Config"]["Labels"]["com.docker.compose.container-number"]))


def docker(*args: str, timeout_s: float = 300) -> str:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    if result.returncode != 0:
        raise SmokeFailure(f"docker {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def inspect(container_id: str) -> dict:
    return json.loads(docker("inspect", container_id))[0]


def health(container: dict) -> str:
    return container["State"].get("Health", {}).get("Status", "none")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def local_package_index(torch_wheel: Path | None, pip_mirror: Path | None, port: int) -> Iterator[dict[str, str]]:
    """Serve a torch wheel (as a PEP 503 index) and a mirror's simple/ tree on 127.0.0.1.

    Yields the build variables that point the image build at them. The
    build then needs the host network to reach 127.0.0.1.
    """
    if torch_wheel is None and pip_mirror is None:
        yield {}
        return
    with tempfile.TemporaryDirectory(prefix="embedserve-index-") as tmp:
        root = Path(tmp)
        if torch_wheel is not None:
            (root / "torch").mkdir()
            (root / "torch" / torch_wheel.name).symlink_to(torch_wheel.resolve())
        if pip_mirror is not None:
            (root / "mirror").symlink_to(pip_mirror.resolve())
        handler = functools.partial(QuietHandler, directory=str(root))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{server.server_address[1]}"
        env = {"EMBEDSERVE_BUILD_NETWORK": "host"}
        if torch_wheel is not None:
            env["TORCH_INDEX_URL"] = f"{base}/"
        if pip_mirror is not None:
            env["PIP_EXTRA_INDEX_URL"] = f"{base}/mirror/simple"
        try:
            yield env
        finally:
            server.shutdown()
            server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def copy_model_out(image: str, destination: Path) -> Path:
    """The image's /models/default, copied to ``destination`` (the reference loads the same files)."""
    container_id = docker("create", image).strip()
    try:
        docker("cp", f"{container_id}:/models/default/.", str(destination))
    finally:
        docker("rm", container_id)
    return destination


def reference_embeddings(model_dir: Path, texts: Sequence[str]) -> np.ndarray:
    """sentence-transformers on ``model_dir``: the independent in-process reference."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    return model.encode(list(texts), batch_size=8, convert_to_numpy=True)


def wait_healthy(compose: Compose, service: str, count: int, timeout_s: float) -> float:
    def healthy() -> bool:
        states = [health(c) for c in compose.containers(service)]
        return len(states) >= count and states.count("healthy") >= count
    return wait_until(healthy, timeout_s, f"{count} healthy {service} container(s)", interval_s=1)


# Run inside a replica container: Info on its own port, with the token given
# as argv[1] (or none), prints the status code name.
_INFO_CALL = """
import sys, grpc
from embedserve.protos import inference_pb2, inference_pb2_grpc
metadata = (("authorization", "Bearer " + sys.argv[1]),) if len(sys.argv) > 1 else None
with grpc.insecure_channel("127.0.0.1:50051") as channel:
    try:
        inference_pb2_grpc.InferenceStub(channel).Info(inference_pb2.InfoRequest(), metadata=metadata, timeout=30)
        print("OK")
    except grpc.RpcError as error:
        print(error.code().name)
"""


def replica_info_status(container: dict, token: str | None) -> str:
    """The status of an Info call made inside ``container`` to its own gRPC port."""
    return docker("exec", container["Id"], "python", "-c", _INFO_CALL, *([token] if token else [])).strip()


@contextlib.contextmanager
def replica_token_file() -> Iterator[Path]:
    """A fresh token for the cluster's replica_token secret.

    Mode 0644 in a 0700 directory: the secret is a bind mount that keeps host
    permissions and the containers run as uid 10001; the directory keeps
    other local users out.
    """
    with tempfile.TemporaryDirectory(prefix="embedserve-smoke-token-") as directory:
        path = Path(directory) / "replica-token"
        path.write_text(secrets.token_urlsafe(32) + "\n")
        path.chmod(0o644)
        yield path


def replica_transports(gateway: str) -> list[str]:
    """How the gateway calls each replica it knows ("frames" or "grpc"), from its /info."""
    status, body = request(f"{gateway}/info")
    if status != 200:
        raise SmokeFailure(f"gateway /info answered {status}")
    return [replica["calls"] for replica in json.loads(body)["replicas"]]


def replica_calls(container: dict) -> float:
    """The replica's served-call counter, read from its metrics port inside the container."""
    script = ("import urllib.request; "
              "print(urllib.request.urlopen('http://127.0.0.1:9100/metrics', timeout=5).read().decode())")
    text = docker("exec", container["Id"], "python", "-c", script)
    return metric_total(text, "embedserve_scheduler_calls_total")


def run_load(gateway: str, reference: np.ndarray, clients: int, during: Callable[[], object]) -> LoadCount:
    """Concurrent load while ``during()`` runs, plus 3 s either side; the count of answers."""
    with Load(gateway, LOAD_TEXTS, reference[:len(LOAD_TEXTS)], clients) as load:
        time.sleep(3)
        during()
        time.sleep(3)
        return load.stop()


def check_load(count: LoadCount, what: str) -> None:
    if count.lost or count.wrong or count.ok == 0:
        raise SmokeFailure(f"{what}: {count.ok} ok, {count.lost} lost, {count.wrong} wrong; {count.samples}")


def smoke(settings: SmokeSettings, compose: Compose, figures: dict) -> None:
    image = compose.env.get("EMBEDSERVE_IMAGE", "embedserve:cpu")
    gateway = f"http://127.0.0.1:{compose.env['EMBEDSERVE_PORT']}"
    prometheus = f"http://127.0.0.1:{compose.env['PROMETHEUS_PORT']}"

    start = time.monotonic()
    compose.run("build", *(["--no-cache"] if settings.no_cache else []), timeout_s=3600)
    figures["build_s"] = round(time.monotonic() - start, 1)
    figures["build_no_cache"] = settings.no_cache
    figures["image_bytes"] = int(docker("image", "inspect", "-f", "{{.Size}}", image))
    step("build", f"{figures['build_s']} s, image {figures['image_bytes'] / 1e9:.2f} GB")

    with tempfile.TemporaryDirectory(prefix="embedserve-model-") as model_dir:
        reference = reference_embeddings(copy_model_out(image, Path(model_dir)), PARITY_TEXTS)
    figures["load_average_before_up"] = [round(x, 2) for x in os.getloadavg()]

    start = time.monotonic()
    compose.run("up", "-d", timeout_s=600)
    wait_healthy(compose, "replica", 2, 300)
    figures["replicas_healthy_s"] = round(time.monotonic() - start, 1)
    wait_until(lambda: is_ready(gateway), 300, "gateway /ready")
    figures["gateway_ready_s"] = round(time.monotonic() - start, 1)
    step("up", f"2 replicas healthy {figures['replicas_healthy_s']} s, gateway ready {figures['gateway_ready_s']} s")

    got = embed(gateway, PARITY_TEXTS)
    figures["parity_min_cosine"] = round(float(cosines(got, reference).min()), 7)
    if figures["parity_min_cosine"] < MIN_COSINE:
        raise SmokeFailure(f"embeddings differ from sentence-transformers: {figures['parity_min_cosine']}")
    step("parity", f"{len(PARITY_TEXTS)} texts, min cosine {figures['parity_min_cosine']}")
    figures["replica_transports"] = replica_transports(gateway)
    if figures["replica_transports"] != ["frames", "frames"]:
        raise SmokeFailure(f"the gateway calls its replicas over {figures['replica_transports']}, "
                           f"not frames on their --frame-port")
    step("frames", "the gateway calls both replicas as frames on their TCP frame port")

    status, body = request(f"{gateway}/metrics")
    if status != 200 or b"embedserve_gateway_requests" not in body:
        raise SmokeFailure(f"gateway /metrics answered {status} without embedserve_gateway_requests")
    step("metrics", "gateway /metrics has embedserve_gateway_requests")

    token = Path(compose.env["EMBEDSERVE_REPLICA_TOKEN_FILE"]).read_text().strip()
    replica = compose.containers("replica")[0]
    refusals = {"none": replica_info_status(replica, None), "wrong": replica_info_status(replica, "wrong-token"),
                "right": replica_info_status(replica, token)}
    figures["replica_token_checks"] = refusals
    if refusals != {"none": "UNAUTHENTICATED", "wrong": "UNAUTHENTICATED", "right": "OK"}:
        raise SmokeFailure(f"replica token: {refusals}")
    step("replica token", "no token and a wrong one: UNAUTHENTICATED; the right one: served")

    def all_targets_up() -> bool:
        targets = prometheus_targets(prometheus)
        jobs = sorted(t["job"] for t in targets)
        return jobs == ["gateway", "prometheus", "replica", "replica"] and all(t["health"] == "up" for t in targets)
    figures["prometheus_targets_up_s"] = round(wait_until(all_targets_up, 120, "all 4 Prometheus targets up", 2), 1)
    step("prometheus", f"4 targets up after {figures['prometheus_targets_up_s']} s more")

    # A crash: the replica's process dies outside the Docker API, as with the
    # OOM killer; the restart policy brings it back.
    victim = compose.containers("replica")[0]
    restarts_before = victim["RestartCount"]

    def crash() -> None:
        os.kill(victim["State"]["Pid"], signal.SIGKILL)
        back = wait_until(lambda: inspect(victim["Id"])["RestartCount"] > restarts_before
                          and health(inspect(victim["Id"])) == "healthy", 300, "crashed replica back and healthy", 1)
        figures["crash_back_healthy_s"] = round(back, 1)
    count = run_load(gateway, reference, settings.load_clients, crash)
    figures["crash_load"] = vars(count) | {"sent": count.sent}
    check_load(count, "replica crash under load")
    step("crash", f"{count.sent} requests: {count.ok} ok, {count.lost} lost, {count.wrong} wrong; "
                  f"back healthy by itself in {figures['crash_back_healthy_s']} s")

    # `docker kill`: the Docker API records a stop by hand, so no restart
    # policy applies (recorded); `docker compose up -d` brings it back.
    victim = compose.containers("replica")[1]
    count = run_load(gateway, reference, settings.load_clients, lambda: docker("kill", victim["Id"]))
    figures["docker_kill_load"] = vars(count) | {"sent": count.sent}
    check_load(count, "docker kill under load")
    time.sleep(5)
    figures["docker_kill_restarted_by_policy"] = inspect(victim["Id"])["State"]["Running"]
    start = time.monotonic()
    compose.run("up", "-d", "--no-recreate", timeout_s=600)
    wait_healthy(compose, "replica", 2, 300)
    figures["docker_kill_back_healthy_s"] = round(time.monotonic() - start, 1)
    step("docker kill", f"{count.sent} requests: {count.ok} ok, {count.lost} lost, {count.wrong} wrong; "
                        f"restarted by policy: {figures['docker_kill_restarted_by_policy']}; "
                        f"back via compose up in {figures['docker_kill_back_healthy_s']} s")

    gateway_before = compose.containers("gateway")[0]
    start = time.monotonic()
    compose.run("up", "-d", "--no-recreate", "--scale", "replica=3", timeout_s=600)
    wait_healthy(compose, "replica", 3, 300)
    wait_until(lambda: metric_total(request(f"{gateway}/metrics")[1].decode(),
                                    "embedserve_gateway_replicas_healthy") == 3, 120,
               "gateway sees 3 healthy replicas")
    figures["scale_to_3_s"] = round(time.monotonic() - start, 1)
    wait_until(lambda: replica_transports(gateway) == ["frames"] * 3, 60,
               "the gateway calls the third replica as frames too")
    third = compose.containers("replica")[2]
    calls_before = replica_calls(third)
    count = run_load(gateway, reference, settings.load_clients, lambda: None)
    check_load(count, "load after scaling to 3")
    figures["third_replica_calls"] = replica_calls(third) - calls_before
    gateway_after = compose.containers("gateway")[0]
    if (gateway_after["Id"], gateway_after["State"]["StartedAt"]) != (gateway_before["Id"],
                                                                      gateway_before["State"]["StartedAt"]):
        raise SmokeFailure("scaling the replicas restarted or recreated the gateway")
    if figures["third_replica_calls"] <= 0:
        raise SmokeFailure("the gateway sent nothing to the third replica")
    # One request at a time finds every replica idle: ties must be taken in turn.
    replicas = compose.containers("replica")
    before = [replica_calls(r) for r in replicas]
    for text in PARITY_TEXTS[:6]:
        embed(gateway, [text])
    figures["sequential_calls_per_replica"] = [replica_calls(r) - b for r, b in zip(replicas, before, strict=True)]
    if min(figures["sequential_calls_per_replica"]) <= 0:
        raise SmokeFailure(f"6 requests one at a time left a replica idle: {figures['sequential_calls_per_replica']}")
    step("scale", f"3 replicas in {figures['scale_to_3_s']} s, gateway not restarted, "
                  f"third replica served {figures['third_replica_calls']:.0f} calls of {count.sent}; "
                  f"6 sequential requests per replica: {figures['sequential_calls_per_replica']}")

    start = time.monotonic()
    compose.run("down", "-v", "--remove-orphans", "--timeout", "60", timeout_s=600)
    figures["down_s"] = round(time.monotonic() - start, 1)
    label = f"label=com.docker.compose.project={compose.project}"
    left = {kind: docker(kind, "ls", "-q", "--filter", label).split() for kind in ("network", "volume")}
    left["container"] = docker("ps", "-a", "-q", "--filter", label).split()
    if any(left.values()):
        raise SmokeFailure(f"left behind after down: {left}")
    step("down", f"{figures['down_s']} s, no container, network or volume left")


def step(name: str, detail: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] ok {name}: {detail}", flush=True)


def parse_settings(argv: Sequence[str]) -> SmokeSettings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", default="embedserve-smoke", help="compose project name (default: %(default)s)")
    parser.add_argument("--no-cache", action="store_true", help="build the image from scratch (cold build time)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running when a check fails")
    parser.add_argument("--load-clients", type=int, default=4, help="concurrent clients (default: %(default)s)")
    parser.add_argument("--torch-wheel", type=Path, help="serve this torch wheel as the build's TORCH_INDEX_URL")
    parser.add_argument("--pip-mirror", type=Path,
                        help="serve DIR/simple (a PEP 503 tree) as the build's PIP_EXTRA_INDEX_URL")
    parser.add_argument("--index-port", type=int, default=38471,
                        help="127.0.0.1 port of the served index; a fixed one keeps the build cache valid, since "
                             "its URL is a build argument (default: %(default)s)")
    parser.add_argument("--report", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    return SmokeSettings(args.project, args.no_cache, args.keep, args.load_clients, args.torch_wheel,
                         args.pip_mirror, args.index_port, args.report)


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(sys.argv[1:] if argv is None else argv)
    if shutil.which("docker") is None:
        print("compose smoke: no docker command", file=sys.stderr)
        return 2
    figures: dict = {"date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                     "load_average_start": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
    env = {**os.environ, "EMBEDSERVE_PORT": str(free_port()), "PROMETHEUS_PORT": str(free_port())}
    passed = False
    with local_package_index(settings.torch_wheel, settings.pip_mirror, settings.index_port) as index_env, \
            replica_token_file() as token_file:
        compose = Compose(settings.project, {**env, **index_env, "EMBEDSERVE_REPLICA_TOKEN_FILE": str(token_file)})
        try:
            smoke(settings, compose, figures)
            passed = True
        except SmokeFailure as exc:
            print(f"compose smoke FAILED: {exc}", file=sys.stderr)
        finally:
            figures["passed"] = passed
            figures["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
            if not passed and not settings.keep:
                with contextlib.suppress(SmokeFailure, subprocess.TimeoutExpired):
                    compose.run("down", "-v", "--remove-orphans", "--timeout", "30")
    text = json.dumps(figures, indent=2)
    print(text)
    if settings.report is not None:
        settings.report.write_text(text + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
