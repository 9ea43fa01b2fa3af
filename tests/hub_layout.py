"""A Hugging Face Hub cache laid out by hand, and a Hub served from this process (test helpers).

``write_snapshot`` writes what ``huggingface_hub`` writes when it downloads a
repo (its file_download.py): ``models--ORG--NAME/blobs/<etag>`` holding each
file once (etag: the git blob sha1, or the sha256 of an LFS file such as the
weights), ``snapshots/<commit>/<path>`` a relative symlink to its blob, and
``refs/<ref>`` the commit, without a newline. tests/test_hub_models.py checks
this layout against one the library itself writes from ``FakeHub``.

``FakeHub`` answers the few routes ``snapshot_download`` calls (repo info, the
recursive tree listing, HEAD/GET of /resolve/), with the headers and error
codes (X-Error-Code) the real Hub sends, on 127.0.0.1 port 0: point HF_ENDPOINT
at ``url``. Nothing here reaches the network.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def is_lfs(path: str) -> bool:
    """The files the Hub keeps in LFS (and names by sha256 in the cache): the weights here."""
    return path.endswith((".safetensors", ".bin", ".onnx"))


def etag(path: str, data: bytes) -> str:
    if is_lfs(path):
        return hashlib.sha256(data).hexdigest()
    return git_blob_sha1(data)


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def directory_files(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` by its repo path (``1_Pooling/config.json``)."""
    return {p.relative_to(directory).as_posix(): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def repo_folder(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def write_snapshot(cache: Path, repo_id: str, files: Mapping[str, bytes], commit: str,
                   refs: tuple[str, ...] = ("main",)) -> Path:
    """``files`` as the snapshot ``commit`` of ``repo_id`` in the Hub cache ``cache``; its path."""
    repo = repo_folder(cache, repo_id)
    snapshot = repo / "snapshots" / commit
    for path, data in files.items():
        blob = repo / "blobs" / etag(path, data)
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(data)
        link = snapshot / path
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def cache_tree(cache: Path) -> dict[str, str]:
    """Every entry under ``cache`` -> what it is ('dir', 'link:TARGET', 'file:SHA1'), for
    comparing two caches. Left out: what the library writes beside the snapshots (its tree
    listing cache trees/, lock files, the cache root's CACHEDIR.TAG)."""
    tree = {}
    for path in sorted(cache.rglob("*")):
        name = path.relative_to(cache).as_posix()
        if name == "CACHEDIR.TAG" or name.startswith(".locks") or "/trees" in name:
            continue
        if path.is_symlink():
            tree[name] = "link:" + os.readlink(path)
        elif path.is_dir():
            tree[name] = "dir"
        else:
            tree[name] = "file:" + hashlib.sha1(path.read_bytes()).hexdigest()
    return tree


@dataclass
class FakeRepo:
    commit: str
    files: dict[str, bytes]
    refs: dict[str, str] = field(default_factory=dict)   # other branches/tags -> commit
    error: tuple[int, str] | None = None                 # every call answers (status, X-Error-Code)

    def resolve(self, revision: str) -> str | None:
        if revision in ("main", self.commit):
            return self.commit
        return self.refs.get(revision)


class FakeHub:
    """The Hub's download routes over ``repos`` (repo id -> FakeRepo); ``requests`` logs paths."""

    def __init__(self, repos: Mapping[str, FakeRepo]) -> None:
        self.repos = dict(repos)
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hub._answer(self, body=True)

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    @contextlib.contextmanager
    def running(self) -> Iterator[FakeHub]:
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join()

    def _answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = urlsplit(handler.path).path
        self.requests.append(f"{handler.command} {path}")
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            repo_id, route, revision = "/".join(parts[2:4]), parts[4], parts[5]
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo_id, route, revision = "/".join(parts[:2]), "resolve", parts[3]
        else:
            return self._send(handler, 404, b"", {"X-Error-Code": "EntryNotFound"}, body)
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._send(handler, 401, b"", {"X-Error-Code": "RepoNotFound",
                                                  "X-Error-Message": "Repository not found"}, body)
        if repo.error is not None:
            status, code = repo.error
            return self._send(handler, status, b"", {"X-Error-Code": code, "X-Error-Message": code}, body)
        commit = repo.resolve(revision)
        if commit is None:
            return self._send(handler, 404, b"", {"X-Error-Code": "RevisionNotFound",
                                                  "X-Error-Message": "Invalid rev id"}, body)
        if route == "revision":
            info = {"id": repo_id, "sha": commit, "siblings": [{"rfilename": f} for f in repo.files]}
            return self._send(handler, 200, json.dumps(info).encode(),
                              {"Content-Type": "application/json"}, body)
        if route == "tree":
            tree = []
            for name, data in repo.files.items():
                entry: dict = {"type": "file", "oid": git_blob_sha1(data), "size": len(data), "path": name}
                if is_lfs(name):
                    entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                    "pointerSize": 134}
                tree.append(entry)
            return self._send(handler, 200, json.dumps(tree).encode(),
                              {"Content-Type": "application/json"}, body)
        name = "/".join(parts[4:])
        if name not in repo.files:
            return self._send(handler, 404, b"", {"X-Error-Code": "EntryNotFound"}, body)
        data = repo.files[name]
        tag = etag(name, data)
        headers = {"ETag": f'"{tag}"', "X-Repo-Commit": commit,
                   "Content-Type": "application/octet-stream"}
        if is_lfs(name):
            headers["X-Linked-Etag"] = f'"{tag}"'
            headers["X-Linked-Size"] = str(len(data))
        return self._send(handler, 200, data, headers, body)

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, data: bytes, headers: Mapping[str, str],
              body: bool) -> None:
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)
