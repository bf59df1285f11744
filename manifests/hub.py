"""Publish a release as a Hugging Face Hub dataset, and restore a release folder from the Hub.

A pushed repository holds, in ONE commit tagged with the release version:

- ``README.md``: the dataset card (:mod:`counterfactory.manifests.hub_card`);
- ``data/<table>/train-*.parquet``: one config per table (``items``, plus ``trials`` and
  ``variants`` when the release has them), images embedded (:mod:`.hub_tables`);
- ``release/``: the release folder byte for byte, ``checksums.sha256`` included, so that
  :func:`pull_release` gives back a folder that ``counterfactory verify`` accepts.

Before anything is uploaded the release is re-hashed (``verify``), the sources' licences are
combined (a conflict or an unknown licence stops the push) and a token is looked up the way
``huggingface_hub`` does (``HF_TOKEN``, then the stored login); the endpoint is the library's
(``HF_ENDPOINT``). A version is never overwritten: when the tag exists, the tagged
``release/checksums.sha256`` is compared with the local one; equal means the push is a no-op,
different means it is refused. The commit names the branch head it builds on
(``parent_commit``), so a concurrent push fails instead of mixing files. A push stopped
half-way leaves no commit (the Hub applies a commit whole or not at all) and no tag (the tag is
made after the commit); pushing again uploads only what the Hub lacks, commits, and tags. If
it stopped between commit and tag, the retry finds nothing to commit and only tags.

The tree a version tags is exactly its export: files a previous version had and this one does
not (a table it dropped, files added by hand on the Hub) are deleted in the same commit; only
the Hub's own ``.gitattributes`` stays. Older versions keep their files under their tags.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.hub_card import card_body, card_metadata, render_card, sensitive_axes
from counterfactory.manifests.hub_tables import TableExport, release_tables, write_table
from counterfactory.manifests.licences import LicenceDecision, LicenceError, combine_licences
from counterfactory.manifests.release_folder import (
    CHECKSUMS,
    ITEMS,
    MAX_JSON_BYTES,
    RELEASE_JSON,
    SPEC_YAML,
    STATS,
    ReleaseFolder,
    refuse_inside_release,
)
from counterfactory.manifests.release_verify import ReleaseCheck, verify_release

REPO_TYPE = "dataset"
RELEASE_PREFIX = "release"
#: Files the Hub itself puts in a new repository; a push leaves them alone.
HUB_OWN_FILES = frozenset({".gitattributes"})
INSTALL_HINT = "install the hub extra: pip install 'counterfactory[hub]'"


class HubError(CounterfactoryError, RuntimeError):
    """A push or pull that must not go ahead; the message says what to fix."""


class HubTransferError(HubError):
    """The Hub refused or dropped a request part-way; running the same command again resumes."""


def _http_cause(exc: BaseException) -> BaseException | None:
    """The ``huggingface_hub`` HTTP error behind ``exc`` (it wraps LFS failures in RuntimeError)."""
    errors = _hub().errors
    seen = exc
    while seen is not None:
        if isinstance(seen, errors.HfHubHTTPError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


@dataclass(frozen=True)
class Export:
    """A release laid out as a Hub dataset repository in ``folder``."""

    folder: Path
    name: str
    version: str
    files: dict[str, Path]  # repository path -> the local file uploaded there, README.md first
    tables: tuple[TableExport, ...]
    licence: LicenceDecision
    checksums: bytes  # the release's checksums.sha256: what identifies its content
    gated: bool  # the card carries the access form


@dataclass(frozen=True)
class PushResult:
    """A pushed version: the repository, the version (= tag) and the commit it tags."""

    repo_id: str
    version: str
    commit: str
    created: bool  # False: this version was already on the Hub with the same content


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise HubError(f"huggingface_hub is not installed; {INSTALL_HINT}") from exc
    return huggingface_hub


def _require_datasets() -> None:
    try:
        import datasets  # noqa: F401  (the Parquet schema carries datasets' feature types)
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise HubError(f"datasets is not installed; {INSTALL_HINT}") from exc


def _calibration_rules() -> dict[str, str]:
    from counterfactory.assets import ASSETS_DIR

    path = ASSETS_DIR / "calibration" / "calibration.json"
    return dict(json.loads(path.read_text()).get("rules", {})) if path.exists() else {}


def _written_spec(folder: ReleaseFolder) -> dict[str, Any]:
    """The release's ``spec.yaml`` as written, parsed (bounded, regular; ``{}`` when empty).

    Raises:
        HubError: not a YAML mapping.
    """
    from counterfactory.manifests.yamlsafe import safe_load_limited

    try:
        spec = safe_load_limited(folder.read_bytes(SPEC_YAML, MAX_JSON_BYTES).decode("utf-8")) or {}
    except (UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        raise HubError(
            f"{folder.file(SPEC_YAML)}: not readable YAML ({str(exc)[:160]}); nothing was uploaded"
        ) from None
    if not isinstance(spec, dict):
        raise HubError(f"{folder.file(SPEC_YAML)}: not a mapping of spec fields; nothing was uploaded")
    return spec


def check_release(release_dir: Path, checks: Sequence[ReleaseCheck] = ()) -> None:
    """Raise :class:`HubError` unless every file of the release matches its checksum (and what
    ``verify`` re-derives, with the derived-file ``checks`` the caller passes)."""
    problems = verify_release(release_dir, checks=checks)
    if problems:
        shown = "; ".join(problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise HubError(
            f"{release_dir}: the release does not match its checksums ({shown}); nothing was uploaded. "
            "Restore the release from its source (re-run the spec or pull it again) instead of editing it"
        )


def release_licence(release_dir: Path, items: list[dict[str, Any]], spec: dict[str, Any]) -> LicenceDecision:
    """The dataset licence from the items' sources (see :mod:`.licences`); raises :class:`HubError`."""
    sources = [
        (str(row["source"].get("id")), row["source"].get("licence"))
        for row in items
        if isinstance(row.get("source"), dict)
    ]
    try:
        return combine_licences(sources, declared=(spec.get("release") or {}).get("licence"))
    except LicenceError as exc:
        raise HubError(f"{release_dir / ITEMS}: {exc}; nothing was uploaded") from exc


def export_release(
    release_dir: str | Path,
    out_dir: str | Path,
    *,
    repo_id: str,
    gated: bool | None = None,
    copy_release: bool = True,
    check: bool = True,
    checks: Sequence[ReleaseCheck] = (),
    caveat_of: Callable[[str], str | None] | None = None,
) -> Export:
    """Lay a release out in ``out_dir`` exactly as it is uploaded.

    Args:
        release_dir: a sealed release folder (``releases/<name>/<version>``).
        out_dir: an empty or missing folder; receives ``README.md``, ``data/`` and (with
            ``copy_release``) a copy of the release under ``release/``.
        repo_id: ``ORG/NAME`` the card points at.
        gated: put the access form in the card; None gates sets that vary a protected attribute.
        copy_release: copy the release's files into ``out_dir/release/``; without it,
            :attr:`Export.files` points at the release's own files (what a push uploads).
        check: verify the release first (a caller that just did may skip the second pass).
        checks: what ``verify`` re-derives beyond the release's tables (``stats.json``,
            ``report.html``: :data:`counterfactory.flows.engine.verify.DERIVED_CHECKS`).
        caveat_of: an editor backend's ``release_caveat`` by name, for the card.

    Raises:
        HubError: the release fails ``verify`` or its licences conflict or are unknown.
    """
    release_dir, out_dir = Path(release_dir), Path(out_dir)
    refuse_inside_release(out_dir, "OUT_DIR")
    _require_datasets()
    if check:
        check_release(release_dir, checks)
    folder = ReleaseFolder(release_dir, need=())
    spec = _written_spec(folder)
    info = folder.info if folder.has(RELEASE_JSON) else dict(spec.get("release") or {})
    # an empty table (a spec without trials or variants) gets no config: the Hub has nothing to show
    tables = {name: rows for name, rows in release_tables(release_dir).items() if rows}
    items = tables.get("items")
    if not items:
        raise HubError(f"{release_dir / ITEMS}: the release has no items; there is nothing to publish")
    licence = release_licence(release_dir, items, spec)
    stats = folder.json(STATS) if folder.has(STATS) else {}
    if gated is None:
        gated = bool(sensitive_axes(spec))

    out_dir.mkdir(parents=True, exist_ok=True)
    exports = tuple(write_table(name, rows, release_dir, out_dir) for name, rows in tables.items())
    # The release's own files go up as they are; a copy (never a link: a release owns its
    # bytes, and the export folder is the user's to change) only when asked for a full folder.
    release_files = {
        f"{RELEASE_PREFIX}/{path.relative_to(release_dir).as_posix()}": path
        for path in sorted(release_dir.rglob("*"))
        if path.is_file()
    }
    if copy_release:
        for rel, path in release_files.items():
            (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out_dir / rel)
            release_files[rel] = out_dir / rel
    backends = sorted({row["editor"]["backend"] for row in items if row.get("editor")})
    meta = card_metadata(release=info, spec=spec, tables=exports, licence=licence, gated=gated, backends=backends)
    body = card_body(
        release=info,
        spec=spec,
        stats=stats,
        items=items,
        tables=exports,
        licence=licence,
        repo_id=repo_id,
        calibration_rules=_calibration_rules(),
        caveat_of=caveat_of,
    )
    (out_dir / "README.md").write_text(render_card(meta, body), encoding="utf-8")
    files = {"README.md": out_dir / "README.md"} | {f: out_dir / f for t in exports for f in t.files} | release_files
    return Export(
        out_dir,
        str(info["name"]),
        str(info["version"]),
        files,
        exports,
        licence,
        (release_dir / CHECKSUMS).read_bytes(),
        gated,
    )


def _token(token: str | None) -> str:
    token = token or _hub().get_token()
    if not token:
        raise HubError(
            "no Hugging Face token: set HF_TOKEN to a token with write access "
            "(https://huggingface.co/settings/tokens) or run `hf auth login`; nothing was uploaded"
        )
    return token


def _remote_checksums(api: Any, repo_id: str, revision: str, scratch: Path) -> bytes | None:
    errors = _hub().errors
    try:
        path = api.hf_hub_download(
            repo_id,
            f"{RELEASE_PREFIX}/{CHECKSUMS}",
            repo_type=REPO_TYPE,
            revision=revision,
            cache_dir=scratch / "cache",
        )
    except errors.EntryNotFoundError:
        return None
    return Path(path).read_bytes()


def push_release(
    release_dir: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    gated: bool | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    checks: Sequence[ReleaseCheck] = (),
    caveat_of: Callable[[str], str | None] | None = None,
) -> PushResult:
    """Upload a release to ``repo_id`` as one commit tagged with its version.

    Args:
        release_dir: a sealed release folder.
        repo_id: ``ORG/NAME`` of the dataset repository (created when missing).
        private: create the repository private (and make an existing one private).
        gated: require an access request (manual approval) and put the intended-use form in the
            card; None gates sets whose design varies a protected attribute (race, gender, ...).
        token: a Hub token; default: ``HF_TOKEN`` or the stored login, as ``huggingface_hub``
            reads them.
        endpoint: the Hub's URL; default: ``HF_ENDPOINT`` or https://huggingface.co.
        checks, caveat_of: as :func:`export_release` takes them.

    Returns:
        The tagged commit, and ``created=False`` when the same version was already there.

    Raises:
        HubError: the release fails ``verify``; its licences conflict or are unknown; there is
            no token; the version exists on the Hub with other content. Nothing is uploaded.
    """
    release_dir = Path(release_dir)
    if "/" not in repo_id:
        raise HubError(f"--repo {repo_id!r}: give the repository as ORG/NAME (e.g. my-lab/{repo_id})")
    # cheap refusals first, in the order a user fixes them: damaged files, licences, token
    check_release(release_dir, checks)
    spec = _written_spec(ReleaseFolder(release_dir, need=()))
    release_licence(release_dir, release_tables(release_dir)["items"], spec)
    hub = _hub()
    token = _token(token)
    with tempfile.TemporaryDirectory(prefix="cf-hub-push-") as scratch:
        scratch = Path(scratch)
        export = export_release(
            release_dir,
            scratch / "repo",
            repo_id=repo_id,
            gated=gated,
            copy_release=False,
            check=False,
            caveat_of=caveat_of,
        )
        api = hub.HfApi(endpoint=endpoint, token=token)
        try:
            return _upload(api, export, release_dir, repo_id, private=private, scratch=scratch)
        except HubError:
            raise
        except Exception as exc:
            cause = _http_cause(exc)
            if cause is None:
                raise
            raise HubTransferError(
                f"pushing {release_dir} to {repo_id} stopped: {cause}\nVersion {export.version} is not tagged "
                "and no partial commit exists (the Hub applies a commit whole or not at all). Check HF_TOKEN "
                "(write access) and HF_ENDPOINT, then run the same command again: files already uploaded are "
                "not sent twice, and a commit that was made is only tagged"
            ) from exc


def _upload(api: Any, export: Export, release_dir: Path, repo_id: str, *, private: bool, scratch: Path) -> PushResult:
    """The network half of :func:`push_release`: repo, version check, one commit, one tag."""
    hub = _hub()
    api.create_repo(repo_id, repo_type=REPO_TYPE, private=private, exist_ok=True)
    refs = api.list_repo_refs(repo_id, repo_type=REPO_TYPE)
    tags = {ref.name: ref.target_commit for ref in refs.tags}
    if export.version in tags:
        remote = _remote_checksums(api, repo_id, export.version, scratch)
        if remote == export.checksums:
            return PushResult(repo_id, export.version, tags[export.version], created=False)
        raise HubError(
            f"{repo_id} already has version {export.version} with different content "
            f"(its release/{CHECKSUMS} differs from {release_dir / CHECKSUMS}); a published version "
            "is never replaced: raise release.version in the spec, run it, and push the new version"
        )
    if private or export.gated:
        # before any data arrives, so the files are never readable without the gate
        api.update_repo_settings(
            repo_id, repo_type=REPO_TYPE, private=True if private else None, gated="manual" if export.gated else None
        )
    head = next((ref.target_commit for ref in refs.branches if ref.name == "main"), None)
    existing = api.list_repo_files(repo_id, repo_type=REPO_TYPE, revision=head) if head else []
    keep = set(export.files) | HUB_OWN_FILES
    operations = [hub.CommitOperationAdd(path, str(local)) for path, local in export.files.items()]
    operations += [hub.CommitOperationDelete(path) for path in existing if path not in keep]
    commit = api.create_commit(
        repo_id,
        operations,
        commit_message=f"Release {export.name} {export.version}",
        commit_description=f"counterfactory release {export.name} {export.version} (licence {export.licence.hub_id})",
        repo_type=REPO_TYPE,
        revision="main",
        parent_commit=head,
    )
    api.create_tag(
        repo_id,
        tag=export.version,
        revision=commit.oid,
        repo_type=REPO_TYPE,
        tag_message=f"{export.name} {export.version}",
    )
    return PushResult(repo_id, export.version, commit.oid, created=True)


def _download(api: Any, repo_id: str, commit: str, staging: Path) -> None:
    try:
        api.snapshot_download(
            repo_id,
            repo_type=REPO_TYPE,
            revision=commit,
            allow_patterns=[f"{RELEASE_PREFIX}/**"],
            local_dir=staging / "repo",
            cache_dir=staging / "cache",
        )
    except Exception as exc:
        cause = _http_cause(exc)
        if cause is None:
            raise
        raise HubTransferError(f"downloading {repo_id} stopped: {cause}; run the same command again") from exc


def parse_ref(ref: str) -> tuple[str, str]:
    """``ORG/NAME@VERSION`` -> ``(ORG/NAME, VERSION)``; raises :class:`HubError` otherwise."""
    repo_id, sep, version = ref.partition("@")
    if not sep or not version or repo_id.count("/") != 1:
        raise HubError(f"{ref!r}: give the release as ORG/NAME@VERSION (e.g. my-lab/faces@1.0.0)")
    return repo_id, version


def pull_release(
    ref: str,
    out_dir: str | Path,
    *,
    token: str | None = None,
    endpoint: str | None = None,
    checks: Sequence[ReleaseCheck] = (),
) -> Path:
    """Download the release tagged ``VERSION`` in ``ORG/NAME`` into ``out_dir`` and verify it.

    Args:
        ref: ``ORG/NAME@VERSION``.
        out_dir: the release folder to create (missing or empty); it appears whole or not at all.
        token: for private or gated repositories; default as ``huggingface_hub`` reads it.
        endpoint: the Hub's URL; default: ``HF_ENDPOINT`` or https://huggingface.co.

    Returns:
        ``out_dir``, holding the release with its ``checksums.sha256`` verified.

    Raises:
        HubError: no such version (the message lists the ones there are), ``out_dir`` is not
            empty, or the downloaded files fail ``verify``.
    """
    repo_id, version = parse_ref(ref)
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise HubError(f"{out_dir}: not empty; pull into a new folder")
    hub = _hub()
    api = hub.HfApi(endpoint=endpoint, token=token)
    try:
        refs = api.list_repo_refs(repo_id, repo_type=REPO_TYPE)
    except Exception as exc:
        cause = _http_cause(exc)
        if cause is None:
            raise
        raise HubTransferError(
            f"cannot read {repo_id} on the Hub: {cause}. Check the name, HF_ENDPOINT, and HF_TOKEN for a "
            "private or gated repository"
        ) from exc
    tags = {r.name: r.target_commit for r in refs.tags}
    if version not in tags:
        raise HubError(f"{repo_id} has no version {version}; versions there: {', '.join(sorted(tags)) or 'none'}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.pull-", dir=out_dir.parent))
    try:
        _download(api, repo_id, tags[version], staging)
        folder = staging / "repo" / RELEASE_PREFIX
        problems = verify_release(folder, checks=checks)
        if problems:
            raise HubError(f"{repo_id}@{version}: the downloaded release fails verify: {'; '.join(problems[:10])}")
        if out_dir.exists():
            out_dir.rmdir()
        os.replace(folder, out_dir)
        return out_dir
    finally:
        shutil.rmtree(staging, ignore_errors=True)
