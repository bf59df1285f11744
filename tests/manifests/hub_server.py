"""A local stand-in for the Hugging Face Hub's HTTP API, for the push and pull tests.

It answers, on 127.0.0.1 only, the calls ``huggingface_hub`` makes to create a dataset repo,
commit files to it, tag the commit and download it again (read from the installed
``huggingface_hub`` source: ``hf_api.py``, ``_commit_api.py``, ``lfs.py``, ``file_download.py``):

- ``POST /api/repos/create`` -> ``{"url"}`` and an initial commit holding ``.gitattributes``;
  409 (with the url) when the repo exists.
- ``POST /api/validate-yaml`` -> ``{"errors", "warnings"}``; 400 when the card's YAML header
  does not parse or is not a mapping.
- ``PUT /api/datasets/<repo>/settings`` -> gated / visibility.
- ``POST /api/datasets/<repo>/preupload/<rev>`` -> per file ``uploadMode`` ("lfs" for binary
  content, as the Hub decides from the sample, else "regular") and the ``oid`` the file has at
  ``rev`` (sha256 for LFS files, git blob id otherwise) so that unchanged files are skipped.
- ``POST /datasets/<repo>.git/info/lfs/objects/batch`` -> the git-lfs batch answer with
  ``"transfer": "basic"``: an upload and a verify action per object the store lacks, none for
  the ones it has. The server never offers Xet; a client with ``hf_xet`` installed must be run
  with ``HF_HUB_DISABLE_XET`` (Xet is chosen on the client side, before any negotiation).
- ``PUT /_lfs/<oid>`` (basic transfer: body = the file) and ``POST /_lfs/verify``; the object
  is stored only if its sha256 and size match.
- ``POST /api/datasets/<repo>/commit/<branch>`` (NDJSON: header, file, lfsFile, deletedFile)
  -> ``{"commitUrl", "commitOid"}``. A commit is all or nothing: every LFS object it names
  must be in the store, ``parentCommit`` must be the branch head, or nothing changes.
- ``POST /api/datasets/<repo>/tag/<rev>`` -> 409 when the tag exists.
- ``GET /api/datasets/<repo>/refs``, ``GET /api/datasets/<repo>[/revision/<rev>]`` (with
  ``sha`` and ``siblings``), ``GET /api/datasets/<repo>/tree/<rev>[/<path>]`` (recursive).
- ``HEAD|GET /datasets/<repo>/resolve/<rev>/<path>`` with ``X-Repo-Commit``, ``ETag`` (and
  ``X-Linked-Etag``/``X-Linked-Size`` for LFS files), as the Hub's download path sends them.

Every write needs ``Authorization: Bearer <token>`` with the server's token (401 otherwise);
reads of a private repo too (404 otherwise, as the Hub hides private repos). ``before_commit``
lets a test move a branch between a client's read and its commit. ``fail`` injects
an HTTP 500 at a named step (``lfs_upload`` after N good uploads, ``commit``, ``tag``), once or
always, so a test can stop a push half-way. ``calls`` counts requests by step.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

GITATTRIBUTES = b"*.parquet filter=lfs diff=lfs merge=lfs -text\n*.png filter=lfs diff=lfs merge=lfs -text\n"
LFS_SUFFIXES = (".parquet", ".arrow", ".png", ".jpg", ".jpeg", ".webp", ".tif", ".tiff")


def git_blob_id(data: bytes) -> str:
    """The git object id of a blob holding ``data`` (sha1 of ``"blob <size>\\0" + data``)."""
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class Entry:
    """A file in a commit: regular (``content``) or LFS (``sha256``, content in the store)."""

    size: int
    content: bytes | None = None
    sha256: str | None = None

    @property
    def oid(self) -> str:
        if self.sha256 is None:
            return git_blob_id(self.content or b"")
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n"
        return git_blob_id(pointer.encode())


@dataclass
class Repo:
    repo_id: str
    private: bool = False
    gated: str | bool = False
    commits: dict[str, tuple[str | None, dict[str, Entry], str]] = field(
        default_factory=dict
    )  # oid -> parent, files, summary
    branches: dict[str, str | None] = field(default_factory=lambda: {"main": None})
    tags: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> str | None:
        """Commit id for a branch, a tag or a commit id; None for an empty branch or unknown."""
        if revision in self.branches:
            return self.branches[revision]
        if revision in self.tags:
            return self.tags[revision]
        return revision if revision in self.commits else None

    def files(self, revision: str) -> dict[str, Entry] | None:
        if revision in self.branches and self.branches[revision] is None:
            return {}
        oid = self.resolve(revision)
        return None if oid is None else self.commits[oid][1]


@dataclass
class Failure:
    step: str  # "lfs_upload" | "commit" | "tag"
    after: int = 0  # good calls of that step before the failure
    times: int = 1  # how many calls fail (a large number = always)
    status: int = 500  # huggingface_hub retries 408/429/5xx LFS uploads with backoff; 507 it does not


class HubServer:
    """The fake Hub, run by uvicorn in a daemon thread on 127.0.0.1 (plain HTTP)."""

    def __init__(self, token: str = "hf_test_token") -> None:
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.calls: Counter[str] = Counter()
        self.failures: list[Failure] = []
        #: called with the repo just before a commit is applied: lets a test commit "from
        #: elsewhere" between a client's read of the branch head and its commit
        self.before_commit: Callable[[Repo], None] | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._server: Any = None
        self.port = 0

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> HubServer:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self._app(), log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake Hub server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail(self, step: str, *, after: int = 0, times: int = 1, status: int = 500) -> None:
        """Answer ``status`` to ``times`` calls of ``step`` once ``after`` calls of it have succeeded."""
        self.failures.append(Failure(step, after, times, status))

    def _should_fail(self, step: str) -> int | None:
        """The status to fail this call of ``step`` with, or None to serve it."""
        with self._lock:
            self.calls[step] += 1
            for failure in self.failures:
                if failure.step == step:
                    if failure.after > 0:
                        failure.after -= 1
                        return None
                    if failure.times > 0:
                        failure.times -= 1
                        return failure.status
        return None

    # -- helpers for tests --------------------------------------------------------------

    def file_bytes(self, repo_id: str, revision: str, path: str) -> bytes:
        entry = self.repos[repo_id].files(revision)[path]
        return entry.content if entry.sha256 is None else self.lfs[entry.sha256]

    # -- the API ------------------------------------------------------------------------

    def _app(self) -> FastAPI:
        app = FastAPI()
        server = self

        def error(status: int, message: str, code: str | None = None) -> JSONResponse:
            headers = {"X-Error-Message": message}
            if code:
                headers["X-Error-Code"] = code
            return JSONResponse({"error": message}, status_code=status, headers=headers)

        def authorised(request: Request) -> bool:
            return request.headers.get("authorization") == f"Bearer {server.token}"

        def repo_for(request: Request, ns: str, name: str, *, write: bool) -> Repo | JSONResponse:
            if write and not authorised(request):
                return error(401, "Invalid credentials in Authorization header")
            repo = server.repos.get(f"{ns}/{name}")
            if repo is None or (repo.private and not authorised(request)):
                return error(404, "Repository not found", "RepoNotFound")
            return repo

        @app.post("/api/repos/create")
        async def create_repo(request: Request) -> Response:
            if not authorised(request):
                return error(401, "Invalid credentials in Authorization header")
            body = await request.json()
            if body.get("type") != "dataset":
                return error(400, "this server only hosts datasets")
            repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
            with server._lock:
                if repo_id in server.repos:
                    # the Hub's 409 carries the url too; create_repo(exist_ok=True) reads it
                    return JSONResponse(
                        {
                            "error": "You already created this dataset repo",
                            "url": f"{server.endpoint}/datasets/{repo_id}",
                        },
                        status_code=409,
                        headers={"X-Error-Message": "You already created this dataset repo"},
                    )
                repo = server.repos[repo_id] = Repo(repo_id, private=bool(body.get("private")))
                # like the Hub, a new repo starts with one commit holding .gitattributes
                initial = hashlib.sha1(f"initial {repo_id}".encode()).hexdigest()
                repo.commits[initial] = (
                    None,
                    {".gitattributes": Entry(len(GITATTRIBUTES), content=GITATTRIBUTES)},
                    "initial commit",
                )
                repo.branches["main"] = initial
            return JSONResponse({"url": f"{server.endpoint}/datasets/{repo_id}", "name": repo_id})

        @app.post("/api/validate-yaml")
        async def validate_yaml(request: Request) -> Response:
            body = await request.json()
            content = body.get("content", "")
            errors = []
            if content.startswith("---\n"):
                header = content[4:].split("\n---\n", 1)
                try:
                    data = yaml.safe_load(header[0]) if len(header) == 2 else None
                    if len(header) != 2:
                        errors.append({"message": "YAML header is not closed by ---"})
                    elif not isinstance(data, dict):
                        errors.append({"message": "YAML header is not a mapping"})
                except yaml.YAMLError as exc:
                    errors.append({"message": f"YAML does not parse: {exc}"})
            if errors:
                return JSONResponse({"errors": errors, "warnings": []}, status_code=400)
            return JSONResponse({"errors": [], "warnings": []})

        @app.put("/api/datasets/{ns}/{name}/settings")
        async def settings(ns: str, name: str, request: Request) -> Response:
            repo = repo_for(request, ns, name, write=True)
            if isinstance(repo, Response):
                return repo
            body = await request.json()
            if "gated" in body:
                repo.gated = body["gated"]
            if "visibility" in body:
                repo.private = body["visibility"] == "private"
            return JSONResponse({})

        @app.post("/api/datasets/{ns}/{name}/preupload/{revision}")
        async def preupload(ns: str, name: str, revision: str, request: Request) -> Response:
            repo = repo_for(request, ns, name, write=True)
            if isinstance(repo, Response):
                return repo
            server.calls["preupload"] += 1
            current = repo.files(revision) or {}
            answer = []
            for f in (await request.json())["files"]:
                sample = base64.b64decode(f["sample"])
                lfs = f["path"].endswith(LFS_SUFFIXES) or b"\x00" in sample
                existing = current.get(f["path"])
                oid = None
                if existing is not None:
                    oid = existing.sha256 if existing.sha256 is not None else existing.oid
                answer.append(
                    {"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid}
                )
            return JSONResponse({"files": answer, "commitOid": repo.resolve(revision)})

        @app.post("/datasets/{ns}/{name}.git/info/lfs/objects/batch")
        async def lfs_batch(ns: str, name: str, request: Request) -> Response:
            repo = repo_for(request, ns, name, write=True)
            if isinstance(repo, Response):
                return repo
            body = await request.json()
            if body.get("operation") != "upload" or "basic" not in body.get("transfers", ["basic"]):
                return error(400, "only basic LFS uploads are served here")
            objects = []
            for obj in body["objects"]:
                answer = {"oid": obj["oid"], "size": obj["size"]}
                if obj["oid"] not in server.lfs:
                    answer["actions"] = {
                        "upload": {"href": f"{server.endpoint}/_lfs/{obj['oid']}?size={obj['size']}"},
                        "verify": {"href": f"{server.endpoint}/_lfs/verify"},
                    }
                objects.append(answer)
            return JSONResponse({"transfer": "basic", "objects": objects, "hash_algo": "sha256"})

        @app.put("/_lfs/{oid}")
        async def lfs_upload(oid: str, size: int, request: Request) -> Response:
            data = await request.body()
            if (status := server._should_fail("lfs_upload")) is not None:
                return error(status, "injected failure during an LFS upload")
            if hashlib.sha256(data).hexdigest() != oid or len(data) != size:
                return error(400, "uploaded bytes do not match the announced sha256 and size")
            server.lfs[oid] = data
            return Response(status_code=200)

        @app.post("/_lfs/verify")
        async def lfs_verify(request: Request) -> Response:
            body = await request.json()
            data = server.lfs.get(body["oid"])
            if data is None or len(data) != body["size"]:
                return error(404, f"LFS object {body['oid']} was not uploaded")
            return JSONResponse({})

        @app.post("/api/datasets/{ns}/{name}/commit/{revision}")
        async def commit(ns: str, name: str, revision: str, request: Request) -> Response:
            repo = repo_for(request, ns, name, write=True)
            if isinstance(repo, Response):
                return repo
            lines = [json.loads(line) for line in (await request.body()).splitlines() if line.strip()]
            if (status := server._should_fail("commit")) is not None:
                return error(status, "injected failure during the commit")
            if revision not in repo.branches:
                return error(400, f"commits go to a branch; {revision!r} is not one")
            if server.before_commit is not None:
                hook, server.before_commit = server.before_commit, None
                hook(repo)
            with server._lock:
                head = repo.branches[revision]
                files = dict(repo.commits[head][1]) if head else {}
                header = next(item["value"] for item in lines if item["key"] == "header")
                if header.get("parentCommit") not in (None, head):
                    return error(412, "A commit has happened since. Please refresh and try again.")
                for item in lines:
                    key, value = item["key"], item["value"]
                    if key == "file":
                        content = base64.b64decode(value["content"])
                        files[value["path"]] = Entry(len(content), content=content)
                    elif key == "lfsFile":
                        data = server.lfs.get(value["oid"])
                        if data is None:
                            return error(400, f"LFS object {value['oid']} for {value['path']} was never uploaded")
                        files[value["path"]] = Entry(len(data), sha256=value["oid"])
                    elif key == "deletedFile":
                        files.pop(value["path"], None)
                    elif key == "deletedFolder":
                        prefix = value["path"].rstrip("/") + "/"
                        files = {p: e for p, e in files.items() if not p.startswith(prefix)}
                    elif key != "header":
                        return error(400, f"unknown commit operation {key}")
                oid = hashlib.sha1(
                    json.dumps([head, header, sorted((p, e.oid) for p, e in files.items())]).encode()
                ).hexdigest()
                repo.commits[oid] = (head, files, header.get("summary", ""))
                repo.branches[revision] = oid
            server.calls["commit_ok"] += 1
            return JSONResponse(
                {"commitUrl": f"{server.endpoint}/datasets/{repo.repo_id}/commit/{oid}", "commitOid": oid}
            )

        @app.post("/api/datasets/{ns}/{name}/tag/{revision}")
        async def tag(ns: str, name: str, revision: str, request: Request) -> Response:
            repo = repo_for(request, ns, name, write=True)
            if isinstance(repo, Response):
                return repo
            body = await request.json()
            if (status := server._should_fail("tag")) is not None:
                return error(status, "injected failure while tagging")
            with server._lock:
                if body["tag"] in repo.tags:
                    return error(409, f"Tag {body['tag']} already exists")
                oid = repo.resolve(revision)
                if oid is None:
                    return error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
                repo.tags[body["tag"]] = oid
            return JSONResponse({})

        @app.get("/api/datasets/{ns}/{name}/refs")
        async def refs(ns: str, name: str, request: Request) -> Response:
            repo = repo_for(request, ns, name, write=False)
            if isinstance(repo, Response):
                return repo

            def ref(kind: str, name: str, oid: str | None) -> dict[str, Any]:
                return {"name": name, "ref": f"refs/{kind}/{name}", "targetCommit": oid}

            return JSONResponse(
                {
                    "branches": [ref("heads", b, o) for b, o in repo.branches.items() if o],
                    "tags": [ref("tags", t, o) for t, o in repo.tags.items()],
                    "converts": [],
                }
            )

        def info(repo: Repo, revision: str) -> Response:
            files = repo.files(revision)
            if files is None:
                return error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
            return JSONResponse(
                {
                    "id": repo.repo_id,
                    "sha": repo.resolve(revision),
                    "private": repo.private,
                    "gated": repo.gated,
                    "siblings": [{"rfilename": p} for p in sorted(files)],
                }
            )

        @app.get("/api/datasets/{ns}/{name}")
        async def dataset_info(ns: str, name: str, request: Request) -> Response:
            repo = repo_for(request, ns, name, write=False)
            return repo if isinstance(repo, Response) else info(repo, "main")

        @app.get("/api/datasets/{ns}/{name}/revision/{revision}")
        async def dataset_info_at(ns: str, name: str, revision: str, request: Request) -> Response:
            repo = repo_for(request, ns, name, write=False)
            return repo if isinstance(repo, Response) else info(repo, revision)

        @app.get("/api/datasets/{ns}/{name}/tree/{revision}")
        @app.get("/api/datasets/{ns}/{name}/tree/{revision}/{path:path}")
        async def tree(ns: str, name: str, revision: str, request: Request, path: str = "") -> Response:
            repo = repo_for(request, ns, name, write=False)
            if isinstance(repo, Response):
                return repo
            files = repo.files(revision)
            if files is None:
                return error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
            recursive = request.query_params.get("recursive", "false").lower() == "true"
            prefix = path.strip("/") + "/" if path.strip("/") else ""
            entries: dict[str, dict[str, Any]] = {}
            for p, entry in sorted(files.items()):
                if not p.startswith(prefix):
                    continue
                parts = p[len(prefix) :].split("/")
                for depth in range(1, len(parts)):
                    folder = prefix + "/".join(parts[:depth])
                    if recursive or depth == 1:
                        entries.setdefault(folder, {"type": "directory", "oid": "0" * 40, "size": 0, "path": folder})
                if recursive or len(parts) == 1:
                    item: dict[str, Any] = {"type": "file", "oid": entry.oid, "size": entry.size, "path": p}
                    if entry.sha256 is not None:
                        item["lfs"] = {"oid": entry.sha256, "size": entry.size, "pointerSize": 134}
                    entries[p] = item
            return JSONResponse(list(entries.values()))

        @app.api_route("/datasets/{ns}/{name}/resolve/{revision}/{path:path}", methods=["GET", "HEAD"])
        async def resolve(ns: str, name: str, revision: str, path: str, request: Request) -> Response:
            repo = repo_for(request, ns, name, write=False)
            if isinstance(repo, Response):
                return repo
            files = repo.files(revision)
            if files is None:
                return error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
            entry = files.get(path)
            if entry is None:
                return error(404, "Entry not found", "EntryNotFound")
            server.calls["download"] += request.method == "GET"
            data = entry.content if entry.sha256 is None else server.lfs[entry.sha256]
            headers = {"X-Repo-Commit": repo.resolve(revision) or "", "ETag": f'"{entry.oid}"'}
            if entry.sha256 is not None:
                headers |= {"X-Linked-Etag": f'"{entry.sha256}"', "X-Linked-Size": str(entry.size)}
            if request.method == "HEAD":
                headers["Content-Length"] = str(len(data))
                return Response(status_code=200, headers=headers)
            return Response(content=data, headers=headers, media_type="application/octet-stream")

        return app
