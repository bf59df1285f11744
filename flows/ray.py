"""The same flow on a Ray cluster, through prefect-ray's ``RayTaskRunner``.

``counterfactory run SPEC --ray ADDRESS`` (or ``run.ray.address`` in the spec) runs every
template's attempts as two kinds of Prefect tasks on the cluster:

- an **edit** task per batch of attempts, asking Ray for ``num_gpus`` (what the backend declares
  at registration, ``EditorCapabilities.resources``: by default 1 on CUDA, 0 otherwise): it
  runs the editor and commits each result to the ledger and the image store as it returns, exactly as :func:`~counterfactory.flows.engine.execute.run_edits`
  does on one machine;
- a **judge** task per batch, asking for ``num_cpus``: alignment and every gate
  (:func:`~counterfactory.flows.engine.execute.judge_attempts`).

The flow's own process (the driver) keeps the plan: it renders prompts, derives attempt ids
and decides which cells need another seed, through the one
:func:`~counterfactory.flows.engine.template.process_template` the local run uses, with these two tasks
in place of the local calls. Each Ray worker process loads its editor, gates and ledger
connection once and keeps them for the run (:func:`_worker_state`).

Everything that would make the run fail is checked before any work (:func:`check_ray_target`):
the ``ray`` extra installed; a cluster on other machines has its ledger on PostgreSQL (a SQLite
file cannot be shared between machines) and a Prefect API its workers can reach; the address
answers within ``connect_timeout_s``; and once connected, a cluster with more than one node is
held to the same ledger rule. Workers on other machines must also see ``--out`` (the image
store) at the same path: a shared filesystem; the first task on each node checks a marker the
driver wrote and stops the run with that message if the folder is not there.
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import os
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prefect import task
from prefect.cache_policies import NONE

from counterfactory.flows.engine import execute, run_folder, template
from counterfactory.flows.engine.executors import OnOutput
from counterfactory.flows.engine.run_folder import RunFolder
from counterfactory.flows.engine.spec import RayConfig, Spec
from counterfactory.flows.limits import limited_editor, limited_gates
from counterfactory.generation.attempts import PlannedAttempt, editor_inputs
from counterfactory.generation.editors.base import EditRequest, EditResult
from counterfactory.generation.editors.registry import EDITORS
from counterfactory.generation.sources import PreparedSource
from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.lifecycle import TemplateOutcome

_INSTALL_HINT = "pip install 'counterfactory[ray]'"


class RayTargetError(SetupError):
    """The Ray cluster cannot run this spec (does not answer, or cannot share its ledger)."""


@dataclass(frozen=True)
class RayTarget:
    """Where and how the run's tasks go on Ray.

    Attributes:
        address: ``"local"`` (a Ray instance started for this run), ``"auto"``, ``HOST:PORT``
            (a head node's GCS) or ``ray://HOST:PORT`` (Ray Client).
        remote: workers may run on other machines (Ray Client, or a head that is not this machine).
        num_gpus: GPUs per edit task.
        num_cpus: CPUs per judge task.
        connect_timeout_s: seconds the head has to answer.
    """

    address: str
    remote: bool
    num_gpus: float
    num_cpus: float
    connect_timeout_s: float


def ray_target(spec: Spec, address: str | None = None) -> RayTarget | None:
    """The spec's ``run.ray`` with ``address`` (the ``--ray`` option) taking precedence; None
    when neither asks for Ray (the run stays on this machine's threads)."""
    config = spec.run.ray
    if address is None and config is None:
        return None
    config = config or RayConfig()
    address = (address or config.address).strip()
    num_gpus = config.num_gpus
    if num_gpus is None:  # what the backend declared it needs (by default: a GPU on cuda)
        resources = EDITORS.capabilities(spec.editor.backend).resources(spec.editor.options())
        num_gpus = resources.get("num_gpus", 0.0)
    return RayTarget(
        address=address,
        remote=is_remote_address(address),
        num_gpus=float(num_gpus),
        num_cpus=float(config.num_cpus),
        connect_timeout_s=float(config.connect_timeout_s),
    )


def _is_this_machine(host: str) -> bool:
    """True when ``host`` resolves to an address of one of this machine's interfaces: binding a
    socket to it succeeds only then (nothing is sent)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        ip = sockaddr[0]
        if ipaddress.ip_address(ip).is_loopback:
            return True
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((ip, 0))
            except OSError:
                continue
            return True
    return False


def _host_port(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` or ``ray://HOST:PORT``; ValueError naming the form otherwise."""
    parts = urlsplit(address if "://" in address else f"gcs://{address}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        raise ValueError(
            f"the Ray address {address!r} is not HOST:PORT, ray://HOST:PORT, 'local' or 'auto' "
            "(e.g. --ray 10.0.0.5:6379 for a head node, --ray ray://10.0.0.5:10001 for Ray Client)"
        )
    return parts.hostname, port


def is_remote_address(address: str) -> bool:
    """True when workers may sit on other machines: Ray Client (``ray://``) or a head node
    that is not this machine. ``local`` and ``auto`` (a cluster started here) are local."""
    if address in ("local", "auto"):
        return False
    if address.startswith("ray://"):
        return True
    try:
        host, _ = _host_port(address)
    except ValueError:
        return False  # reported by check_ray_target with the accepted forms
    return not _is_this_machine(host)


def _resolve_auto() -> str:
    """The address ``auto`` means, found as Ray finds it (``RAY_ADDRESS``, then the cluster the
    last ``ray start`` on this machine recorded, then any running one)."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        found = canonicalize_bootstrap_address("auto")
    except (ConnectionError, ValueError) as exc:
        raise RayTargetError(
            f"--ray auto found no running Ray instance on this machine ({exc}); start one with "
            "`ray start --head`, give its address (--ray HOST:PORT), or use --ray local"
        ) from None
    if not found:
        raise RayTargetError("--ray auto found no running Ray instance; start one with `ray start --head`")
    return found


def _probe(address: str, timeout_s: float) -> None:
    """A TCP connection to the head within ``timeout_s``: ``ray.init`` on an address that does
    not answer waits for minutes before it gives up."""
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
        raise RayTargetError(
            f"the Ray address {address} does not answer ({why} within {timeout_s:g} s); nothing was run. "
            "Start the cluster (`ray start --head` on the head node), check the address and port "
            "(GCS 6379, Ray Client 10001), or raise run.ray.connect_timeout_s"
        ) from None


def _is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _loopback_url(url: str | None) -> bool:
    if not url:
        return True
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_ray_target(target: RayTarget, spec: Spec, *, prefect_api_url: str | None) -> str | None:
    """Everything about the cluster that would make the run fail, before any work.

    Returns the address to hand ``ray.init`` (None: start a local instance).

    Raises:
        RayTargetError: the ``ray`` extra is missing; a remote cluster with a SQLite ledger or
            with no Prefect API its workers can reach; an address that is malformed or does
            not answer within ``connect_timeout_s``.
    """
    try:
        import prefect_ray  # noqa: F401
        import ray  # noqa: F401
    except ImportError as exc:
        raise RayTargetError(f"--ray needs ray and prefect-ray ({exc.name} is missing): {_INSTALL_HINT}") from None
    if target.remote:
        if spec.ledger_url is None or _is_sqlite(spec.ledger_url):
            raise RayTargetError(
                f"the Ray cluster at {target.address} runs tasks on other machines, which cannot share a "
                "SQLite ledger file; put the ledger on PostgreSQL (ledger_url: "
                "'postgresql+psycopg://user@host/db' in the spec, `postgres` extra), or run on one "
                "machine with --ray local. Nothing was run"
            )
        if _loopback_url(prefect_api_url):
            raise RayTargetError(
                f"the Ray cluster at {target.address} runs tasks on other machines, which cannot reach "
                "a Prefect API on this machine's loopback; start a Prefect server they can reach "
                "(`prefect server start --host 0.0.0.0`) and set PREFECT_API_URL to its address. Nothing was run"
            )
    if target.address == "local":
        return None
    address = _resolve_auto() if target.address == "auto" else target.address
    try:
        _host_port(address)
    except ValueError as exc:
        raise RayTargetError(str(exc)) from None
    _probe(address, target.connect_timeout_s)
    return address


@contextlib.contextmanager
def ray_cluster(
    target: RayTarget, address: str | None, spec: Spec, out: Path, *, prefect_api_url: str | None
) -> Iterator[Any]:
    """Connect to (or start) the cluster for one run and yield prefect-ray's ``RayTaskRunner``.

    ``address`` is what :func:`check_ray_target` returned for ``target`` (None: start a local
    instance). After connecting, a cluster with more than one live node is held to the remote
    rules too (ledger on PostgreSQL). A Ray instance this function started is shut down when the
    block ends, with its raylet and workers; an instance that was already running (a cluster, or
    one the caller started) is left as it was.
    """
    import ray
    from prefect_ray import RayTaskRunner

    started = False
    if not ray.is_initialized():
        if address is None:
            ray.init(include_dashboard=False, namespace="counterfactory")
        else:
            ray.init(address=address, namespace="counterfactory")
        started = True
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if len(nodes) > 1 and not target.remote:
            multi = RayTarget(**{**target.__dict__, "remote": True})
            check_ray_target(multi, spec, prefect_api_url=prefect_api_url)
        RunFolder(out).ray_marker.write_text(os.urandom(16).hex())
        yield RayTaskRunner(address=address, init_kwargs={"namespace": "counterfactory"})
    finally:
        if started:
            ray.shutdown()


# --------------------------------------------------------------------------- the driver side


@dataclass(frozen=True)
class WorkerTarget:
    """What a worker needs to open the run's state: picklable, small."""

    spec: Spec
    out: str
    run_id: str
    marker: str


@dataclass(frozen=True)
class EditorFacts:
    """What the driver needs of an editor that runs on the cluster: its name, lineage after
    ``prepare()`` there, the inputs it consumes per kind, and its batch size."""

    name: str
    lineage: Mapping[str, Any]
    consumes: Mapping[str, frozenset[str]]
    batch_size: int


class ClusterEditor:
    """The driver's stand-in for an editor whose work runs in edit tasks on the cluster.

    Planning (attempt ids, which inputs are hashed) reads only :class:`EditorFacts`; asking it
    to edit here is a programming error, since edits go through :func:`edit_task`.
    """

    def __init__(self, facts: EditorFacts) -> None:
        self.facts = facts
        self.name = facts.name
        self.batch_size = facts.batch_size

    def lineage(self) -> dict[str, Any]:
        return dict(self.facts.lineage)

    def consumes(self, kind: str) -> frozenset[str]:
        return self.facts.consumes[kind]

    def prepare(self) -> None:
        return None

    def edit(self, request: EditRequest) -> EditResult:
        raise RuntimeError("a ClusterEditor edits through edit tasks on the Ray cluster, not in the driver")

    def edit_many(self, requests: Sequence[EditRequest], journal: Any = None) -> list[EditResult]:
        raise RuntimeError("a ClusterEditor edits through edit tasks on the Ray cluster, not in the driver")


def task_resources(target: RayTarget) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``ray.remote`` options (prefect-ray's ``remote_options``) of edit and judge tasks.

    Edit tasks ask for ``num_gpus``; a GPU task also sets ``max_calls=0``, since Ray otherwise
    gives every GPU task a fresh worker process (``max_calls`` defaults to 1 for them) and the
    editor's loaded pipeline must stay for the run. Judge tasks ask for ``num_cpus``.
    """
    edit: dict[str, Any] = {"num_gpus": target.num_gpus}
    if target.num_gpus > 0:
        edit["max_calls"] = 0
    return edit, {"num_cpus": target.num_cpus}


class RayExecutor:
    """Edits and judgements as Ray tasks (an :class:`~counterfactory.flows.engine.executors.Executor`):
    each batch of attempts goes to an edit task asking for the edit resources, each judgement to
    a judge task. Outputs stay on the worker that made them (in the store), so ``on_output`` is
    never called and every attempt is judged by a judge task. Used inside the flow only."""

    def __init__(self, target: WorkerTarget, edit_options: dict[str, Any], judge_options: dict[str, Any]) -> None:
        self.target, self.edit_options, self.judge_options = target, edit_options, judge_options

    def edit(
        self,
        ws: run_folder.Workspace,
        editor: Any,
        plans: Sequence[PlannedAttempt],
        lineage: dict,
        *,
        on_output: OnOutput | None = None,
    ) -> int:
        from prefect_ray.context import remote_options

        with remote_options(**self.edit_options):
            return edit_task.submit(self.target, list(plans), lineage).result()

    def judge(self, spec, ws, prepared, plans, stack, jkey, floor=None, as_floor=False) -> list[tuple[str, list[str]]]:
        from prefect_ray.context import remote_options

        with remote_options(**self.judge_options):
            return judge_task.submit(self.target, prepared, list(plans), jkey, floor, as_floor).result()


def process_templates_on_ray(
    spec: Spec,
    ws: run_folder.Workspace,
    templates: Sequence[tuple[PreparedSource, Sequence[Any]]],
    target: RayTarget,
    *,
    workers: int,
) -> Iterator[TemplateOutcome]:
    """Run :func:`~counterfactory.flows.engine.template.process_template` for every template, ``workers``
    at a time, with edits and judgements as Ray tasks; yields outcomes as templates finish.

    Must run inside the flow (a ``RayTaskRunner`` flow run): the tasks are Prefect tasks.
    """
    from prefect_ray.context import remote_options

    marker = ws.folder.ray_marker.read_text()
    wt = WorkerTarget(spec=spec, out=str(ws.out), run_id=ws.run_id or "", marker=marker)
    edit_options, judge_options = task_resources(target)
    with remote_options(**edit_options):
        facts = editor_facts_task.submit(wt).result()
    editor = ClusterEditor(facts)

    executor = RayExecutor(wt, edit_options, judge_options)

    def one(prepared: PreparedSource, cells: Sequence[Any]) -> TemplateOutcome:
        return template.process_template(spec, ws, prepared, cells, editor, None, executor=executor)

    # each template's plan-edit-judge loop waits on its tasks in a driver thread; the copied
    # context carries the flow run (and its task runner) into the thread
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="ray-template") as pool:
        futures = [pool.submit(contextvars.copy_context().run, one, p, cells) for p, cells in templates]
        for future in as_completed(futures):
            yield future.result()


def templates_on_ray(target: RayTarget, *, workers: int):
    """The flow's templates run on the cluster (:func:`process_templates_on_ray`), ``workers`` at a
    time: what :func:`counterfactory.flows.run.where_templates_run` returns on Ray."""

    def run(ws: run_folder.Workspace, work: Sequence[tuple[Spec, Sequence[tuple[PreparedSource, Sequence[Any]]]]]):
        # a spec with `editors` is refused on Ray before the run starts (run_spec): one view here
        ((view, templates),) = work
        return process_templates_on_ray(view, ws, templates, target, workers=workers)

    return run


# --------------------------------------------------------------------------- the worker side


@dataclass
class _WorkerState:
    ws: run_folder.Workspace
    editor: Any = None
    stack: Any = None


_STATE: dict[tuple[str, str], _WorkerState] = {}
_STATE_LOCK = threading.Lock()


def _worker_state(target: WorkerTarget) -> _WorkerState:
    """This worker process's workspace for the run (opened once); state of an earlier run on a
    long-lived cluster is closed first, so a worker holds one run's ledger connection at most."""
    key = (target.run_id, target.out)
    with _STATE_LOCK:
        state = _STATE.get(key)
        if state is not None:
            return state
        for old in _STATE.values():
            old.ws.ledger.close()
        _STATE.clear()
        marker = RunFolder(target.out).ray_marker
        try:
            seen = marker.read_text()
        except OSError:
            seen = None
        if seen != target.marker:
            raise RayTargetError(
                f"the run's folder {target.out} is not visible on Ray node {socket.gethostname()} "
                f"({marker} is missing or from another run): every node must mount --out at the same "
                "path (a shared filesystem), since edit and judge tasks write the image store there"
            )
        ws = run_folder.open_workspace(target.spec, target.out)
        ws.run_id = target.run_id
        state = _STATE[key] = _WorkerState(ws=ws)
        return state


def _worker_editor(target: WorkerTarget) -> tuple[_WorkerState, Any]:
    state = _worker_state(target)
    if state.editor is None:
        # the spec's GPU / fal limits hold here too: they are global on the Prefect server
        state.editor = limited_editor(execute.build_editor(target.spec), target.spec)
    return state, state.editor


@task(name="prepare-editor", cache_policy=NONE)
def editor_facts_task(target: WorkerTarget) -> EditorFacts:
    """Load the editor on a worker with the edit tasks' resources; its lineage there (the model
    revision actually loaded) is what the driver hashes into attempt ids."""
    _, editor = _worker_editor(target)
    return EditorFacts(
        name=editor.name,
        lineage=editor.lineage(),
        consumes={kind: editor_inputs(editor, kind) for kind in ("face", "limb")},
        batch_size=execute.editor_batch_size(editor),
    )


@task(name="edit", cache_policy=NONE)
def edit_task(target: WorkerTarget, plans: list[PlannedAttempt], lineage: dict[str, Any]) -> int:
    """:func:`~counterfactory.flows.engine.execute.run_edits` on a worker; the number of editor calls."""
    state, editor = _worker_editor(target)
    here = editor.lineage()
    if here != lineage:
        changed = sorted(k for k in set(here) | set(lineage) if here.get(k) != lineage.get(k))
        raise RayTargetError(
            f"the editor on Ray node {socket.gethostname()} differs from the one the run planned with "
            f"({', '.join(changed)}): every GPU node must hold the same model files and revision"
        )
    return execute.run_edits(state.ws, editor, plans, lineage)


@task(name="judge", cache_policy=NONE)
def judge_task(
    target: WorkerTarget,
    prepared: PreparedSource,
    plans: list[PlannedAttempt],
    jkey: str,
    floor: dict | None = None,
    as_floor: bool = False,
) -> list[tuple[str, list[str]]]:
    """:func:`~counterfactory.flows.engine.execute.judge_attempts` on a worker: align, measure, judge."""
    state = _worker_state(target)
    if state.stack is None:
        stack = execute.build_gate_stack(target.spec, journal=state.ws.ledger.journal("fal_vlm"))
        state.stack = limited_gates(stack, target.spec)
    return execute.judge_attempts(target.spec, state.ws, prepared, plans, state.stack, jkey, floor, as_floor)


__all__ = [
    "ClusterEditor",
    "EditorFacts",
    "RayTarget",
    "RayTargetError",
    "check_ray_target",
    "is_remote_address",
    "process_templates_on_ray",
    "ray_cluster",
    "ray_target",
    "task_resources",
    "templates_on_ray",
]
