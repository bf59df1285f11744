"""Verifying a release: what ``counterfactory verify`` checks, apart from sealing one.

:func:`verify_release` trusts no file the release could regenerate: besides the checksums it
refuses anything but regular files and non-empty folders (:func:`check_entries`), checks the
schemas against the package's, and re-derives the manifest, the trials, ``stats.json``'s
counts and ``report.html`` from the release's own tables (:func:`check_meaning`). With
``expect`` the release's digest (:func:`~counterfactory.manifests.release.release_digest`)
must be the one recorded elsewhere. Sealing lives in :mod:`counterfactory.manifests.release`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.release import FILE_SHA256, UNRECORDED, _default, release_digest
from counterfactory.manifests.release_folder import (
    ATTRITION_PNG,
    CHECKSUMS,
    CONTACT_SHEETS_DIR,
    DERIVED,
    DIFF_JSON,
    ITEMS,
    LEFT_OUT,
    MANIFEST,
    MANIFEST_PARQUET,
    RELEASE_JSON,
    RELEASE_NAME,
    RELEASE_VERSION,
    REPORT,
    SCHEMAS_DIR,
    SKIN_TONE_PNG,
    SPEC_YAML,
    STATS,
    TRIALS,
)
from counterfactory.manifests.safefiles import sha256_file
from counterfactory.manifests.vocabulary import ACCEPTED

_CHECKSUM_LINE = re.compile(r"([0-9a-f]{64})  (.+)")


def _inside(root: Path, relative: str) -> bool:
    if relative.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", relative):
        return False
    parts = relative.replace("\\", "/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        return False
    return (root / relative).resolve().is_relative_to(root.resolve())


def read_checksums(path: Path) -> tuple[dict[str, str], list[str]]:
    """``({relative path: sha256}, problems)`` from a release's ``checksums.sha256``.

    Every line must be ``<64 lowercase hex>  <relative path inside the release>``, UTF-8.
    """
    listing = Path(path) / CHECKSUMS
    if not listing.is_file():
        return {}, [f"{CHECKSUMS}: missing; a release lists every file's sha256 in it"]
    data = listing.read_bytes()
    if not data.strip():
        return {}, [f"{CHECKSUMS}: empty; it must list every file of the release"]
    listed: dict[str, str] = {}
    problems = []
    for n, raw in enumerate(data.split(b"\n"), start=1):
        if not raw:
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(f"{CHECKSUMS} line {n}: not UTF-8")
            continue
        match = _CHECKSUM_LINE.fullmatch(line)
        if not match:
            shown = line if len(line) <= 80 else line[:77] + "..."
            problems.append(f"{CHECKSUMS} line {n}: expected '<sha256>  <path>', got {shown!r}")
            continue
        digest, relative = match.groups()
        if not _inside(Path(path), relative):
            problems.append(f"{CHECKSUMS} line {n}: {relative!r} is not a path inside the release")
            continue
        if relative in listed:
            problems.append(f"{CHECKSUMS} line {n}: {relative} is listed twice")
            continue
        listed[relative] = digest
    return listed, problems


#: a check of what a release's files derive, beyond its own tables: ``check(release folder,
#: release.json, the written spec) -> problems`` (``stats.json`` and ``report.html`` are checked
#: by the code that wrote them, above this layer, which the caller passes in)
ReleaseCheck = Callable[[Path, dict[str, Any], dict[str, Any]], list[str]]


def verify_release(
    path: str | Path, *, check_schemas: bool = True, expect: str | None = None, checks: Sequence[ReleaseCheck] = ()
) -> list[str]:
    """Check a release folder; returns the problems (empty = valid).

    Refuses anything but regular files and folders (symlinks, hard links, FIFOs, sockets,
    devices, empty folders: :func:`check_entries`), re-hashes every file listed in
    ``checksums.sha256`` (whose lines must be well formed and stay inside the release), finds
    unlisted files, requires ``manifest.jsonl``, checks every manifest and derived row's image
    (and source) against the sha256 the row names, checks what the files mean and re-derives
    what is derived (:func:`check_meaning`, and each of ``checks``), and validates every JSON/JSONL file against the
    schema this package ships. With ``expect``, the release's digest (:func:`release_digest`)
    must be that sha256.
    """
    path = Path(path)
    problems = check_entries(path)
    if expect is not None:
        problems += _check_digest(path, expect)
    listed, listing_problems = read_checksums(path)
    problems += listing_problems
    if CHECKSUMS in listed:
        problems.append(f"{CHECKSUMS}: lists itself")
    for required in (MANIFEST,):
        if required not in listed:
            problems.append(f"{required}: not listed in {CHECKSUMS}; every release has one")
    for relative, digest in listed.items():
        file = path / relative
        if not file.is_file():
            problems.append(f"{relative}: listed but missing")
        elif sha256_file(file) != digest:
            problems.append(f"{relative}: checksum mismatch")
    for p in sorted(path.rglob("*")):
        if p.is_symlink():
            continue  # reported by check_entries
        elif p.is_file() and p.name != CHECKSUMS and p.relative_to(path).as_posix() not in listed:
            problems.append(f"{p.relative_to(path).as_posix()}: not listed in {CHECKSUMS}")
    if not (path / MANIFEST).is_file():
        problems.append(f"{MANIFEST}: missing")
        return problems
    problems += _check_rows(path)
    problems += check_meaning(path, checks=checks)
    if check_schemas:
        from counterfactory.manifests.release_schema import validate_release_files

        problems += validate_release_files(path)
    return problems


def check_entries(path: Path) -> list[str]:
    """What a release folder holds besides regular files with one link and non-empty folders.

    A release owns its bytes: a symlink or a hard link (``st_nlink`` > 1) lets another path
    change them, a FIFO blocks whoever reads it, and a socket, a device or an empty folder is
    nothing a release writes. Nothing is followed or opened.
    """
    problems = []
    for dirpath, dirnames, filenames in os.walk(path):
        here = Path(dirpath)
        if here != Path(path) and not dirnames and not filenames:
            problems.append(f"{here.relative_to(path).as_posix()}: an empty folder; a release holds only its files")
        for name in sorted(dirnames + filenames):
            entry = here / name
            relative = entry.relative_to(path).as_posix()
            st = entry.lstat()
            if stat.S_ISLNK(st.st_mode):
                problems.append(f"{relative}: a symlink; a release owns its bytes (replace it with the file itself)")
            elif stat.S_ISDIR(st.st_mode):
                continue
            elif not stat.S_ISREG(st.st_mode):
                kind = (
                    "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
                )
                problems.append(f"{relative}: {kind}, not a regular file; a release holds only regular files")
            elif st.st_nlink > 1:
                problems.append(
                    f"{relative}: hard-linked ({st.st_nlink} links); a release owns its bytes, and another path "
                    "can change these (copy the file: cp --preserve=all, not cp -l)"
                )
        dirnames[:] = [d for d in dirnames if not (here / d).is_symlink()]
    return problems


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _check_digest(path: Path, expect: str) -> list[str]:
    expect = expect.strip().lower()
    if not _SHA256.fullmatch(expect):
        return [f"--expect {expect!r}: not a sha256 (64 hex digits); give the digest publish printed"]
    if not (path / RELEASE_JSON).is_file() or (path / RELEASE_JSON).is_symlink():
        return [f"{RELEASE_JSON}: missing; a release's digest is its sha256"]
    actual = release_digest(path)
    if actual != expect:
        return [
            f"{RELEASE_JSON}: the release's digest (sha256 of {RELEASE_JSON}) is {actual}, not the expected "
            f"{expect}; this is not the release that was recorded"
        ]
    return []


def _check_rows(path: Path) -> list[str]:
    """Every image a manifest or derived row names exists and hashes to its address."""
    problems = []
    hashed: dict[str, str] = {}

    def check(where: str, ref: Any, what: str) -> None:
        if not isinstance(ref, dict) or not isinstance(ref.get("path"), str) or not isinstance(ref.get("sha256"), str):
            problems.append(f"{where}: no {what} path and sha256")
            return
        relative = ref["path"]
        if not _inside(path, relative):
            problems.append(f"{where}: {what} path {relative!r} is not inside the release")
            return
        file = path / relative
        if not file.is_file():
            problems.append(f"{where}: {what} {relative} is missing")
            return
        if relative not in hashed:
            hashed[relative] = sha256_file(file)
        if hashed[relative] != ref["sha256"]:
            problems.append(f"{where}: {what} {relative} does not hash to the sha256 the row names")

    for name, fields in ((MANIFEST, ("image", "source")), (DERIVED, ("image",))):
        file = path / name
        if not file.is_file():
            continue
        for n, raw in enumerate(file.read_bytes().split(b"\n"), start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                problems.append(f"{name} line {n}: not a JSON object ({exc})")
                continue
            if not isinstance(row, dict):
                problems.append(f"{name} line {n}: not a JSON object")
                continue
            for what in fields:
                # a row without a source is a schema problem, reported by the schema check
                if what == "image" or row.get(what) is not None:
                    check(f"{name} line {n}", row.get(what), what)
    return problems


#: top-level files a release may hold besides those ``release.json`` lists
KNOWN_FILES = {
    MANIFEST,
    MANIFEST_PARQUET,
    ITEMS,
    LEFT_OUT,
    TRIALS,
    DERIVED,
    SPEC_YAML,
    STATS,
    RELEASE_JSON,
    REPORT,
    ATTRITION_PNG,
    SKIN_TONE_PNG,
    DIFF_JSON,
    CHECKSUMS,
}
#: what every release ``publish`` seals holds (``release.json`` naming the version that wrote it)
PUBLISHED_FILES = (MANIFEST, MANIFEST_PARQUET, ITEMS, LEFT_OUT, TRIALS, DERIVED, SPEC_YAML, STATS, REPORT)
#: the id column of each table, unique within it
TABLE_KEYS = {MANIFEST: "item_id", ITEMS: "cell_id", DERIVED: "item_id", TRIALS: "trial_id"}
#: folders whose files are named by their content's sha256
CONTENT_ADDRESSED = ("images", "sources", "inputs")
_SEMVER = re.compile(r"\d+\.\d+\.\d+")
_ADDRESSED = re.compile(r"([0-9a-f]{64})(\.[A-Za-z0-9]+)?")


def _rows(path: Path, name: str, problems: list[str]) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` of a JSON-lines table; unreadable lines are left to the row checks."""
    file = path / name
    if not file.is_file():
        return []
    out = []
    for n, raw in enumerate(file.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            if name not in (MANIFEST, DERIVED):  # those two are reported by _check_rows
                problems.append(f"{name} line {n}: not a JSON object")
            continue
        if isinstance(row, dict):
            out.append((n, row))
    return out


def table_record(path: Path, name: str) -> dict[str, Any]:
    """``{"rows", "sha256"}`` of one JSON-lines table, as ``release.json``'s ``tables`` records it."""
    data = (Path(path) / name).read_bytes()
    return {"rows": sum(1 for line in data.split(b"\n") if line.strip()), "sha256": hashlib.sha256(data).hexdigest()}


def check_meaning(path: str | Path, *, checks: Sequence[ReleaseCheck] = ()) -> list[str]:
    """What a release's files say about each other; returns the problems (empty = consistent).

    Checksums prove bytes are unchanged since sealing; these checks hold even when someone
    regenerated ``checksums.sha256`` after an edit:

    - every table's id column (:data:`TABLE_KEYS`) is unique;
    - every trial's images are manifest items, derived variants or a manifest row's source
      (``source:<sha256>``), ``image_paths`` are those images' paths, and each ``trial_id``
      is the hash of its row's content (:func:`counterfactory.manifests.trials.trial_id_of`;
      checked in releases whose ``release.json`` records ``tables``, i.e. sealed since ids
      became content hashes);
    - ``release.json`` names this folder (``<name>/<version>``, when the folder is so named),
      its ``spec_sha256`` is ``spec.yaml``'s, every file it lists exists and every table it
      records (``tables``: rows and sha256) has those rows and bytes;
    - ``manifest.parquet`` holds the manifest's rows, in order, with the same values;
    - every file under ``images/``, ``sources/`` and ``inputs/`` is named by its sha256;
    - every file is accounted for: a known release file, one ``release.json`` lists, a shipped
      schema, a contact sheet of a template, or an image or source a row names.
    """
    path = Path(path)
    problems: list[str] = []
    tables = {name: _rows(path, name, problems) for name in (MANIFEST, ITEMS, DERIVED, TRIALS)}
    for name, key in TABLE_KEYS.items():
        first: dict[Any, int] = {}
        for n, row in tables[name]:
            value = row.get(key)
            if value is None:
                continue
            if value in first:
                problems.append(f"{name} line {n}: {key} {value} repeats line {first[value]}")
            else:
                first[value] = n
    info = _check_release_json(path, problems)
    # releases sealed before trial ids were content hashes (no ``tables`` record) keep the other checks
    problems += _check_trials(path, tables, hashed_ids=bool((info or {}).get("tables")))
    problems += _check_manifest_is_accepted_items(path, tables)
    written = _written_spec(path, problems)
    if written is not None:
        problems += _check_schemas(path, info or {}, written)
        problems += _check_trials_derived(path, info or {}, written, tables)
        if info is not None:
            # stats.json and report.html are re-derived by the code that wrote them, above this
            # layer: the caller passes its checks in
            for check in checks:
                problems += check(path, info, written)
    problems += _check_parquet(path, tables[MANIFEST])
    referenced: set[str] = set()
    for name in (MANIFEST, ITEMS, DERIVED):
        for _, row in tables[name]:
            for what in ("image", "source"):
                ref = row.get(what)
                if isinstance(ref, dict) and isinstance(ref.get("path"), str):
                    referenced.add(ref["path"])
    listed = set((info or {}).get("files") or {}) | set(((info or {}).get("inputs") or {}).values())
    templates = {row.get("template_id") for _, row in tables[ITEMS]} | {
        row.get("template_id") for _, row in tables[MANIFEST]
    }
    from counterfactory.manifests.release_schema import SCHEMA_FOR, schema_files, schema_name_for

    schemas = {f"{SCHEMAS_DIR}/{p.name}" for p in schema_files()}
    for file in sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink()):
        relative = file.relative_to(path).as_posix()
        top = relative.split("/", 1)[0]
        if top in CONTENT_ADDRESSED and "/" in relative:
            match = _ADDRESSED.fullmatch(relative.rsplit("/", 1)[1])
            if not match:
                problems.append(f"{relative}: a file under {top}/ is named <sha256>.<ext>")
            elif sha256_file(file) != match.group(1):
                problems.append(
                    f"{relative}: named by sha256 {match.group(1)[:12]}... but its content hashes to another"
                )
        if relative in KNOWN_FILES or relative in listed or relative in referenced or relative in schemas:
            continue
        if top == CONTACT_SHEETS_DIR and relative.count("/") == 1 and Path(relative).stem in templates:
            continue
        if relative in SCHEMA_FOR or schema_name_for(relative) is not None:
            continue
        problems.append(
            f"{relative}: not accounted for (no row or release.json entry names it); a release holds only its own files"
        )
    return problems


def _written_spec(path: Path, problems: list[str]) -> dict[str, Any] | None:
    """The release's ``spec.yaml`` parsed as written (None when it has none)."""
    file = path / SPEC_YAML
    if not file.is_file() or file.is_symlink():
        return None
    from counterfactory.manifests.yamlsafe import safe_load_limited

    try:
        data = safe_load_limited(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        problems.append(f"spec.yaml: not readable YAML ({str(exc)[:160]}); derived files cannot be checked")
        return None
    if not isinstance(data, dict):
        problems.append("spec.yaml: not a mapping of spec fields; derived files cannot be checked")
        return None
    return data


def _canonical(value: Any) -> Any:
    """``value`` as a JSON file holds it (so rows built in memory compare with rows read back)."""
    return json.loads(json.dumps(value, sort_keys=True, default=_default))


def _check_manifest_is_accepted_items(path: Path, tables: dict[str, list[tuple[int, dict[str, Any]]]]) -> list[str]:
    """``manifest.jsonl`` is exactly ``items.jsonl``'s accepted rows, in order."""
    if not (path / ITEMS).is_file():
        return []
    manifest = [row for _, row in tables[MANIFEST]]
    accepted = [row for _, row in tables[ITEMS] if row.get("status") == ACCEPTED]
    if manifest == accepted:
        return []
    in_items = {row.get("item_id") for row in accepted}
    in_manifest = {row.get("item_id") for row in manifest}
    problems = [
        f"{ITEMS}: no accepted row for manifest item {item} (a row was dropped or its status edited)"
        for item in sorted(map(str, in_manifest - in_items))[:10]
    ]
    problems += [
        f"{MANIFEST}: no row for accepted item {item} of {ITEMS} (a row was dropped)"
        for item in sorted(map(str, in_items - in_manifest))[:10]
    ]
    return problems or [f"{MANIFEST}: its rows are not {ITEMS}' accepted rows as they are (a row was edited)"]


def _check_schemas(path: Path, info: dict[str, Any], written: dict[str, Any]) -> list[str]:
    """Every file under ``schemas/`` is the schema this package ships (or, for a plug-in's
    protocols and release files, builds): a release cannot loosen its own rules."""
    folder = path / SCHEMAS_DIR
    if not folder.is_dir():
        return []
    from counterfactory import __version__
    from counterfactory.manifests.release_files import registered_schema, schema_file_name
    from counterfactory.manifests.release_schema import load_schema, schema_files, trial_schema

    expected: dict[str, Any] = {p.name: load_schema(p.name) for p in schema_files()}
    trials = written.get("trials") if isinstance(written.get("trials"), dict) else {}
    protocols = [str(p) for p in trials.get("protocols") or [] if isinstance(p, str)]
    expected["trial.schema.json"] = trial_schema(protocols)
    for name in info.get("tables") or {}:
        schema = registered_schema(name) if name not in TABLE_KEYS and name != LEFT_OUT else None
        if schema is not None:
            expected[schema_file_name(name)] = schema
    problems = []
    for file in sorted(folder.iterdir()):
        if file.is_symlink() or not file.is_file():
            continue
        relative = f"{SCHEMAS_DIR}/{file.name}"
        if file.name not in expected:
            problems.append(f"{relative}: not a schema counterfactory {__version__} ships for this release")
            continue
        try:
            held = json.loads(file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError):
            held = None
        if held != expected[file.name]:
            problems.append(
                f"{relative}: not the schema counterfactory {__version__} ships (edited, e.g. loosened, after "
                f"sealing; release.json says it was made by {info.get('counterfactory_version')}); a release "
                "cannot change its own rules"
            )
    return problems


def _check_trials_derived(
    path: Path, info: dict[str, Any], written: dict[str, Any], tables: dict[str, list[tuple[int, dict[str, Any]]]]
) -> list[str]:
    """``trials.jsonl`` is the bank the spec's ``trials`` builds from the manifest and derived
    rows (:func:`~counterfactory.manifests.trials.release_trials`): a dropped trial or 2AFC group
    shows even when ``release.json``'s table records were rewritten."""
    if not (path / TRIALS).is_file() or not (path / ITEMS).is_file():
        return []
    from pydantic import ValidationError

    from counterfactory.manifests.trials import TrialsConfig, load_biographies, release_trials

    section = dict(written.get("trials") or {}) if isinstance(written.get("trials"), dict) else {}
    bios_file = (info.get("inputs") or {}).get("trials.biographies")
    section.pop("biographies", None)
    try:
        config = TrialsConfig.model_validate(section)
        biographies = load_biographies(path / bios_file) if bios_file else None
    except (ValidationError, CounterfactoryError, OSError, ValueError) as exc:
        return [f"trials.jsonl: cannot be re-derived: spec.yaml's trials section ({str(exc)[:200]})"]
    bank = (info.get("trial_bank") or {}).get("sha256")
    from counterfactory.manifests.trials import bank_record

    if bank is not None and bank_record(config)["sha256"] != bank:
        return [
            f"trials.jsonl: cannot be re-derived: release.json's trial bank {config.prompts} is not the file this "
            "package ships (a release made by another counterfactory version)"
        ]
    items = [row for _, row in tables[ITEMS]]
    templates = {row.get("template_id") for row in items}
    editors = written.get("editors")
    if isinstance(editors, list):
        names = [str(e.get("name")) for e in editors if isinstance(e, dict)]
    else:
        names = list(dict.fromkeys(str(row.get("editor_name")) for row in items))[:1]
    manifest = [row for _, row in tables[MANIFEST]]
    try:
        expected = release_trials(
            manifest,
            config,
            biographies=biographies,
            derived=[row for _, row in tables[DERIVED]],
            cells_per_template=len(items) // len(templates) if templates else None,
            editor_names=names,
        )
    except (CounterfactoryError, KeyError, TypeError, ValueError) as exc:
        return [f"trials.jsonl: cannot be re-derived from {MANIFEST} ({type(exc).__name__}: {str(exc)[:160]})"]
    held = [row for _, row in tables[TRIALS]]
    expected = _canonical(expected)
    if held == expected:
        return []
    held_ids = {row.get("trial_id") for row in held}
    missing = [row for row in expected if row.get("trial_id") not in held_ids]
    extra = len(held_ids - {row.get("trial_id") for row in expected})
    if missing:
        shown = ", ".join(f"{r.get('protocol')} {r.get('trial_id')}" for r in missing[:5])
        return [
            f"trials.jsonl: {len(missing)} trial(s) the manifest gives are missing (first: {shown}); "
            "a trial or a group was dropped after sealing"
        ]
    if extra:
        return [f"trials.jsonl: {extra} trial(s) that the manifest does not give"]
    return ["trials.jsonl: not the trial bank the manifest and spec.yaml's trials give (rows edited or reordered)"]


def _check_trials(
    path: Path, tables: dict[str, list[tuple[int, dict[str, Any]]]], *, hashed_ids: bool = True
) -> list[str]:
    from counterfactory.manifests.trials import SOURCE_PREFIX, trial_id_of

    problems = []
    known: dict[str, str | None] = {}
    for _, row in tables[MANIFEST]:
        if row.get("item_id") is not None:
            known[row["item_id"]] = (row.get("image") or {}).get("path")
        source = row.get("source") or {}
        if source.get("sha256"):
            known[f"{SOURCE_PREFIX}{source['sha256']}"] = source.get("path")
    for _, row in tables[DERIVED]:
        if row.get("item_id") is not None:
            known[row["item_id"]] = (row.get("image") or {}).get("path")
    for n, trial in tables[TRIALS]:
        where = f"trials.jsonl line {n}"
        images = trial.get("images")
        if not isinstance(images, list):
            continue  # the schema check reports it
        for image in images:
            if image not in known:
                problems.append(f"{where}: image {image} is not an item of {MANIFEST} or derived.jsonl")
        paths = trial.get("image_paths")
        if paths is not None:
            expected = [known.get(i) for i in images]
            if paths != expected:
                problems.append(f"{where}: image_paths {paths} are not the paths of its images {expected}")
        if hashed_ids and isinstance(trial.get("trial_id"), str) and trial_id_of(trial) != trial["trial_id"]:
            problems.append(f"{where}: trial_id {trial['trial_id']} is not the hash of the row's query (edited?)")
    return problems


def _check_release_json(path: Path, problems: list[str]) -> dict[str, Any] | None:
    file = path / RELEASE_JSON
    if not file.is_file():
        return None
    try:
        info = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError):
        problems.append(f"{RELEASE_JSON}: not JSON")
        return None
    if not isinstance(info, dict):
        return None
    # matched whole: a name or version with a newline (or anything) after it is not one
    if not isinstance(info.get("name"), str) or not RELEASE_NAME.fullmatch(info["name"]):
        problems.append(f"{RELEASE_JSON}: name {info.get('name')!r} is not a release name (letters, digits, '_-.')")
    if not isinstance(info.get("version"), str) or not RELEASE_VERSION.fullmatch(info["version"]):
        problems.append(f"{RELEASE_JSON}: version {info.get('version')!r} is not a semantic version X.Y.Z")
    if _SEMVER.match(path.name):
        if info.get("version") != path.name:
            problems.append(f"{RELEASE_JSON}: version {info.get('version')!r} but the folder is {path.name}")
        if info.get("name") != path.parent.name:
            problems.append(f"{RELEASE_JSON}: name {info.get('name')!r} but the folder is in {path.parent.name}")
    if info.get("counterfactory_version") is not None:
        # a published release: what verify re-derives from cannot simply be left out
        for name in PUBLISHED_FILES:
            if not (path / name).is_file():
                problems.append(f"{name}: missing; every published release holds it (see release.json's files)")
    spec = path / SPEC_YAML
    if "spec_sha256" in info and spec.is_file() and sha256_file(spec) != info["spec_sha256"]:
        problems.append(f"{RELEASE_JSON}: spec_sha256 {str(info['spec_sha256'])[:12]}... is not spec.yaml's sha256")
    for name in info.get("files") or {}:
        if not (path / name).is_file():
            problems.append(f"{RELEASE_JSON}: files lists {name}, which the release does not hold")
    for name, record in (info.get("tables") or {}).items():
        if not (path / name).is_file():
            problems.append(f"{RELEASE_JSON}: tables records {name}, which the release does not hold")
            continue
        actual = table_record(path, name)
        if isinstance(record, dict) and record.get("rows") != actual["rows"]:
            problems.append(
                f"{RELEASE_JSON}: tables.{name}.rows is {record.get('rows')} but {name} has {actual['rows']} rows"
            )
        elif isinstance(record, dict) and record.get("sha256") != actual["sha256"]:
            problems.append(f"{RELEASE_JSON}: tables.{name}.sha256 is not {name}'s sha256 (a row was edited)")
    for name, relative in (info.get("inputs") or {}).items():
        if not (path / relative).is_file():
            problems.append(f"{RELEASE_JSON}: inputs.{name} is {relative}, which the release does not hold")
    recorded = info.get(FILE_SHA256)
    if not isinstance(recorded, dict):
        problems.append(
            f"{RELEASE_JSON}: no {FILE_SHA256}; a release records every file's sha256 in it when sealed "
            "(re-publish a release sealed before it did)"
        )
        return info
    for p in sorted(path.rglob("*")):
        relative = p.relative_to(path).as_posix()
        if p.is_symlink() or not p.is_file() or relative in UNRECORDED:
            continue
        if relative not in recorded:
            problems.append(f"{relative}: not recorded in {RELEASE_JSON}'s {FILE_SHA256} (added after sealing?)")
        elif sha256_file(p) != recorded[relative]:
            problems.append(f"{relative}: its sha256 is not the one {RELEASE_JSON} records (changed after sealing)")
    for relative in recorded:
        if not _inside(path, relative) or not (path / relative).is_file():
            problems.append(f"{RELEASE_JSON}: {FILE_SHA256} records {relative}, which the release does not hold")
    return info


#: manifest.parquet columns and the manifest row field each holds
_PARQUET_FIELDS = {
    "item_id": ("item_id",),
    "cell_id": ("cell_id",),
    "template_id": ("template_id",),
    "status": ("status",),
    "gender_match": ("gender_match",),
    "image_path": ("image", "path"),
    "image_sha256": ("image", "sha256"),
    "source_id": ("source", "id"),
    "source_sha256": ("source", "sha256"),
    "source_path": ("source", "path"),
    "source_licence": ("source", "licence"),
}


def _field(row: dict[str, Any], keys: tuple[str, ...]) -> Any:
    value: Any = row
    for k in keys:
        value = value.get(k) if isinstance(value, dict) else None
    return value


def _check_parquet(path: Path, manifest: list[tuple[int, dict[str, Any]]]) -> list[str]:
    file = path / MANIFEST_PARQUET
    if not file.is_file():
        return []
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(file)
    except Exception as exc:  # noqa: BLE001 - any failure means "not a readable Parquet file"
        return [f"{MANIFEST_PARQUET}: unreadable ({str(exc)[:200]})"]
    if table.num_rows != len(manifest):
        return [f"{MANIFEST_PARQUET}: {table.num_rows} rows but {MANIFEST} has {len(manifest)}"]
    problems = []
    columns = {c: table.column(c).to_pylist() for c in table.column_names}
    for i, (n, row) in enumerate(manifest):
        for column, values in columns.items():
            if column in _PARQUET_FIELDS:
                expected = _field(row, _PARQUET_FIELDS[column])
            elif column.startswith("condition."):
                expected = (row.get("condition") or {}).get(column.split(".", 1)[1])
            elif column.startswith("gate.") and column.endswith(".passed") and column.count(".") == 2:
                result = (row.get("gates") or {}).get(column.split(".")[1])
                expected = None if result is None else bool(result.get("passed"))
                values_i = values[i]
                if values_i is not None and expected is not None and bool(values_i) != expected:
                    problems.append(f"{MANIFEST_PARQUET} row {i + 1}: {column} differs from {MANIFEST} line {n}")
                continue
            else:
                continue
            if values[i] != expected:
                problems.append(
                    f"{MANIFEST_PARQUET} row {i + 1}: {column} is {values[i]!r}, {MANIFEST} line {n} has {expected!r}"
                )
    return problems[:20]
