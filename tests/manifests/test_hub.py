"""Hub export: Parquet that ``datasets`` decodes to the release's pixels, a card the Hub parses,
and push / pull with the real ``huggingface_hub`` client against a local Hub (``hub_server``)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from counterfactory.manifests.hub import HubError, HubTransferError, export_release, pull_release, push_release
from counterfactory.manifests.release_verify import verify_release
from tests.manifests.hub_release import make_release
from tests.manifests.hub_server import HubServer

hf = pytest.importorskip("huggingface_hub")
datasets = pytest.importorskip("datasets")

pytestmark = pytest.mark.slow  # a Hub server on 127.0.0.1 and `datasets` loads: ~9 s in all
hf_constants = importlib.import_module("huggingface_hub.constants")
hf_utils = importlib.import_module("huggingface_hub.utils")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    return make_release(tmp_path_factory.mktemp("rel"))


@pytest.fixture(scope="module")
def exported(release, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "repo"
    return export_release(release, out, repo_id="lab/study")


@pytest.fixture(scope="module")
def server():
    with HubServer() as hub:
        yield hub


@pytest.fixture
def hub(server, monkeypatch):
    """The local Hub, empty, with the client's Xet upload path off (the server speaks LFS only)."""
    server.repos.clear()
    server.lfs.clear()
    server.calls.clear()
    server.failures.clear()
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    hf_utils.disable_progress_bars()
    yield server
    hf_utils.enable_progress_bars()


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im)


def test_load_dataset_decodes_images_equal_to_the_release(release, exported, tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    items = datasets.load_dataset(str(exported.folder), "items", split="test", cache_dir=str(tmp_path))
    rows = [json.loads(line) for line in (release / "items.jsonl").read_text().splitlines()]
    assert len(items) == len(rows) == 6
    assert isinstance(items.features["counterfactual"], datasets.Image)
    assert isinstance(items.features["source"], datasets.Image)
    for got, want in zip(items, rows, strict=True):
        assert (got["status"], got["condition_race"], got["template_id"]) == (
            want["status"],
            want["condition"]["race"],
            want["template_id"],
        )
        assert got["source_licence"] == want["source"]["licence"]
        assert np.array_equal(np.asarray(got["source"]), _pixels(release / want["source"]["path"]))
        if want["image"] is None:
            assert got["counterfactual"] is None and got["gate_identity_passed"] is None
        else:
            assert isinstance(got["counterfactual"], Image.Image)
            assert np.array_equal(np.asarray(got["counterfactual"]), _pixels(release / want["image"]["path"]))
            assert got["gate_identity_passed"] == want["gates"]["identity"]["passed"]
            assert got["gate_identity_cosine"] == pytest.approx(want["gates"]["identity"]["metrics"]["cosine"])
    accepted = items.filter(lambda row: row["status"] == "accepted")
    assert len(accepted) == len((release / "manifest.jsonl").read_text().splitlines())

    trials = datasets.load_dataset(str(exported.folder), "trials", split="test", cache_dir=str(tmp_path))
    trial_rows = [json.loads(line) for line in (release / "trials.jsonl").read_text().splitlines()]
    # MCQ (salary, education) on the two accepted items and on their mirrored variants
    assert len(trials) == len(trial_rows) == 2 * 2 * 2
    for got, want in zip(trials, trial_rows, strict=True):
        assert got["protocol"] == "mcq" and got["group_template_id"] == want["group"]["template_id"]
        assert got["trial_id"] == want["trial_id"] and got["images"] == want["images"]
        assert got["gender_match"] == [want["gender_match"]]  # one type for every trial: a list of booleans
        assert len(got["image_paths"]) == len(want["image_paths"]) == 1
        for image, path in zip(got["image_paths"], want["image_paths"], strict=True):
            assert np.array_equal(np.asarray(image), _pixels(release / path))

    variants = datasets.load_dataset(str(exported.folder), "variants", split="test", cache_dir=str(tmp_path))
    derived = [json.loads(line) for line in (release / "derived.jsonl").read_text().splitlines()]
    assert len(variants) == len(derived) == 2
    for got, want in zip(variants, derived, strict=True):
        assert got["parent_item_id"] == want["parent_item_id"] and got["transform_kind"] == "mirror"
        parent = next(r for r in rows if r["item_id"] == want["parent_item_id"])
        assert np.array_equal(np.asarray(got["image"]), _pixels(release / parent["image"]["path"])[:, ::-1])


def test_large_tables_are_split_into_shards_that_load_in_order(release, tmp_path, monkeypatch):
    from counterfactory.manifests import hub_tables

    monkeypatch.setattr(hub_tables, "SHARD_BYTES", 1)  # every row with an image starts a new shard
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    export = export_release(release, tmp_path / "repo", repo_id="lab/study")
    items = next(t for t in export.tables if t.name == "items")
    assert len(items.files) > 1 and items.files[-1].endswith(f"-of-{len(items.files):05d}.parquet")
    loaded = datasets.load_dataset(str(export.folder), "items", split="test", cache_dir=str(tmp_path / "c"))
    rows = [json.loads(line) for line in (release / "items.jsonl").read_text().splitlines()]
    assert [r["cell_id"] for r in loaded] == [r["cell_id"] for r in rows]


def test_cli_export_writes_what_push_uploads(release, tmp_path):
    from click.testing import CliRunner

    from counterfactory.flows.cli import main

    result = CliRunner().invoke(main, ["release", "export", str(release), str(tmp_path / "out"), "--repo", "lab/x"])
    assert result.exit_code == 0, result.output
    assert "items: 6 rows in 1 shard(s)" in result.output and "trials: 8 rows" in result.output
    assert (tmp_path / "out" / "release" / "checksums.sha256").read_bytes() == (
        release / "checksums.sha256"
    ).read_bytes()
    assert verify_release(tmp_path / "out" / "release") == []
    again = CliRunner().invoke(main, ["release", "export", str(release), str(tmp_path / "out")])
    assert again.exit_code == 2 and "not empty" in again.output


def test_empty_tables_get_no_config(tmp_path):
    release = make_release(tmp_path, trials=False)
    export = export_release(release, tmp_path / "repo", repo_id="lab/study")
    assert [t.name for t in export.tables] == ["items"]
    assert not (tmp_path / "repo" / "data" / "trials").exists()


def test_card_metadata_parses_with_huggingface_hub(exported, release):
    card = hf.DatasetCard((exported.folder / "README.md").read_text(encoding="utf-8"))
    data = card.data.to_dict()
    # U.S.-government photos are public domain by statute: the Public Domain Mark, not a CC0 dedication
    assert (data["license"], data["license_name"]) == ("other", "public-domain")
    assert data["license_link"] == "https://creativecommons.org/publicdomain/mark/1.0/"
    assert "Public Domain Mark, not released under CC0" in card.text
    assert data["size_categories"] == ["n<1K"]
    assert "image-to-image" in data["task_categories"] and "counterfactual" in data["tags"]
    # no task that infers the varied attributes (the terms forbid it); the trials are VQA queries
    assert "zero-shot-image-classification" not in data["task_categories"]
    assert "visual-question-answering" in data["task_categories"]
    assert [c["config_name"] for c in data["configs"]] == ["items", "trials", "variants"]
    assert data["configs"][0]["data_files"] == [{"split": "test", "path": "data/items/test-*.parquet"}]
    # a race x gender face set is gated by default, with the intended use stated
    assert "bias" in data["extra_gated_prompt"] and "race and gender" in data["extra_gated_prompt"]
    assert data["extra_gated_fields"]["Affiliation"] == "text"
    for heading in ("## Trials", "## How it was made", "## Attrition per group", "## Review", "## How to cite"):
        assert heading in card.text
    # every protocol of the release with its counts, from trials.jsonl itself
    rows = [json.loads(line) for line in (release / "trials.jsonl").read_text().splitlines()]
    per_protocol = Counter(t["protocol"] for t in rows)
    for protocol, n in per_protocol.items():
        line = next(ln for ln in card.text.splitlines() if ln.startswith(f"| {protocol} | "))
        assert f"| {protocol} | {n} |" in line
        for question, k in Counter(t["question"] for t in rows if t["protocol"] == protocol).items():
            assert f"{question} {k}" in line
    # the papers it follows are cited, and the bank says it follows them
    assert "arXiv:2601.06931" in card.text and "FOCUS" in card.text
    assert "`trial_prompts_v3.yaml`" in card.text and "uses the papers' groups, options" in card.text
    assert "- `mcq.salary`: not given: A.3 shows the prompt in Figure 9" in card.text
    # attrition numbers are the release's own (Wilson interval of 2 accepted of 6)
    assert "| all | 6 | 33% [10%, 70%] (n=6)" in card.text
    assert "min_cosine=0.25" in card.text
    assert "items with a review record: 1: resolved (accepted) 1" in card.text
    # skin-tone and label checks, from the fixture's metrics: medians of (-5, -3) and (-15, -9)
    assert "| race=Black x gender=female | 2 | -4.0 | [-4.5, -3.5] |" in card.text
    assert "| -12.0 |" in card.text and "source group White: 50% [" in card.text
    assert "(2/2) | 100% [34%, 100%] (2/2) |" in card.text  # joint label match for the accepted condition
    assert "review queue: 1 candidates (0 flagged by gates, 1 audit sample): 1 decided" in card.text


def test_push_then_pull_restores_a_release_that_verifies(release, hub, tmp_path):
    result = push_release(release, "lab/study", token=hub.token, endpoint=hub.endpoint)
    repo = hub.repos["lab/study"]
    assert result.created and repo.tags == {"1.0.0": result.commit} and repo.branches["main"] == result.commit
    assert len(repo.commits) == 2 and repo.gated == "manual"  # the Hub's initial commit, then the release
    assert repo.commits[result.commit][0] in repo.commits  # built on the initial commit
    files = repo.files("1.0.0")
    assert "README.md" in files and "data/items/test-00000-of-00001.parquet" in files
    assert files["data/items/test-00000-of-00001.parquet"].sha256 is not None  # went through LFS
    assert hub.file_bytes("lab/study", "1.0.0", "release/items.jsonl") == (release / "items.jsonl").read_bytes()

    out = pull_release("lab/study@1.0.0", tmp_path / "pulled", endpoint=hub.endpoint)
    assert verify_release(out) == []
    local = sorted(p.relative_to(release).as_posix() for p in release.rglob("*") if p.is_file())
    pulled = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert pulled == local
    assert all((out / rel).read_bytes() == (release / rel).read_bytes() for rel in local)

    uploads = hub.calls["lfs_upload"]
    again = push_release(release, "lab/study", token=hub.token, endpoint=hub.endpoint)
    assert not again.created and again.commit == result.commit
    assert len(repo.commits) == 2 and hub.calls["lfs_upload"] == uploads and hub.calls["preupload"] == 1


def test_load_dataset_in_one_line_from_the_hub(release, hub, tmp_path, monkeypatch):
    """What a user runs: ``load_dataset(ORG/NAME, config, revision=VERSION)``, through datasets' Hub path."""
    push_release(release, "lab/study", token=hub.token, endpoint=hub.endpoint)
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", hub.endpoint)
    monkeypatch.setattr(hf_constants, "ENDPOINT", hub.endpoint)
    monkeypatch.setattr(
        hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    )
    items = datasets.load_dataset(
        "lab/study", "items", split="test", revision="1.0.0", token=hub.token, cache_dir=str(tmp_path)
    )
    rows = [json.loads(line) for line in (release / "items.jsonl").read_text().splitlines()]
    assert [r["status"] for r in items] == [r["status"] for r in rows]
    accepted = next(i for i, r in enumerate(rows) if r["status"] == "accepted")
    want = _pixels(release / rows[accepted]["image"]["path"])
    assert np.array_equal(np.asarray(items[accepted]["counterfactual"]), want)


def test_a_second_version_is_a_second_tagged_commit(release, hub, tmp_path):
    push_release(release, "lab/study", token=hub.token, endpoint=hub.endpoint)
    newer = make_release(tmp_path, version="1.1.0", trials=False, tint=90)
    push_release(newer, "lab/study", token=hub.token, endpoint=hub.endpoint)
    repo = hub.repos["lab/study"]
    assert set(repo.tags) == {"1.0.0", "1.1.0"} and len(repo.commits) == 3
    # the trials table is gone from the new version, and still in the old one; nothing else is left over
    assert set(repo.files("1.1.0")) - {"README.md", ".gitattributes"} == {
        *(f"release/{p.relative_to(newer).as_posix()}" for p in newer.rglob("*") if p.is_file()),
        "data/items/test-00000-of-00001.parquet",
    }
    assert not any(p.startswith("data/trials/") for p in repo.files("1.1.0"))
    assert any(p.startswith("data/trials/") for p in repo.files("1.0.0"))
    out = pull_release("lab/study@1.0.0", tmp_path / "old", endpoint=hub.endpoint)
    assert (out / "items.jsonl").read_bytes() == (release / "items.jsonl").read_bytes()


def test_failure_half_way_leaves_no_commit_and_no_tag_and_a_retry_succeeds(release, hub, tmp_path):
    hub.fail("lfs_upload", after=2, times=1, status=507)
    with pytest.raises(HubTransferError, match="(?s)507.*is not tagged.*run the same command again"):
        push_release(release, "lab/study", token=hub.token, endpoint=hub.endpoint)
    repo = hub.repos["lab/study"]
    initial = repo.branches["main"]
    assert list(repo.commits) == [initial] and repo.tags == {}  # only the Hub's initial commit
    stored = len(hub.lfs)
    assert stored >= 2  # some objects did arrive before the failure

    result = push_release(release, "lab/study", token=hub.token, endpoint=hub.endpoint)
    assert result.created and repo.tags == {"1.0.0": result.commit} and len(repo.commits) == 2
    assert hub.calls["commit_ok"] == 1
    out = pull_release("lab/study@1.0.0", tmp_path / "pulled", endpoint=hub.endpoint)
    assert verify_release(out) == []


def test_failure_between_commit_and_tag_is_finished_by_the_retry(release, hub):
    hub.fail("tag", times=1)
    with pytest.raises(HubTransferError, match="injected failure while tagging"):
        push_release(release, "lab/study", token=hub.token, endpoint=hub.endpoint)
    repo = hub.repos["lab/study"]
    assert repo.tags == {}
    result = push_release(release, "lab/study", token=hub.token, endpoint=hub.endpoint)
    assert repo.tags == {"1.0.0": result.commit} and len(repo.commits) == 2


def test_a_concurrent_commit_makes_the_push_fail_whole_and_the_retry_builds_on_it(release, hub):
    from tests.manifests.hub_server import Entry

    def someone_else_commits(repo):
        files = {"NOTES.md": Entry(5, content=b"notes")}
        repo.commits["f" * 40] = (repo.branches["main"], files, "elsewhere")
        repo.branches["main"] = "f" * 40

    hub.before_commit = someone_else_commits
    with pytest.raises(HubTransferError, match="(?s)412.*run the same command again"):
        push_release(release, "lab/study", token=hub.token, endpoint=hub.endpoint)
    repo = hub.repos["lab/study"]
    assert repo.tags == {} and len(repo.commits) == 2 and repo.branches["main"] == "f" * 40
    result = push_release(release, "lab/study", token=hub.token, endpoint=hub.endpoint)
    # the retry builds on the other commit, and the tagged tree is exactly the release's export
    assert repo.commits[result.commit][0] == "f" * 40 and "NOTES.md" not in repo.files("1.0.0")


def test_a_private_repo_is_not_readable_without_the_token(release, hub, tmp_path, monkeypatch):
    push_release(release, "lab/private", private=True, token=hub.token, endpoint=hub.endpoint)
    assert hub.repos["lab/private"].private
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with pytest.raises(HubTransferError, match="(?s)cannot read lab/private.*HF_TOKEN"):
        pull_release("lab/private@1.0.0", tmp_path / "out", endpoint=hub.endpoint)
    out = pull_release("lab/private@1.0.0", tmp_path / "out", token=hub.token, endpoint=hub.endpoint)
    assert verify_release(out) == []


@pytest.mark.slow
def test_same_version_with_other_content_is_refused(release, hub, tmp_path):
    push_release(release, "lab/study", token=hub.token, endpoint=hub.endpoint)
    before = (dict(hub.repos["lab/study"].commits), dict(hub.lfs), hub.calls["preupload"])
    other = make_release(tmp_path, version="1.0.0", tint=120)
    with pytest.raises(HubError, match="already has version 1.0.0 with different content.*raise release.version"):
        push_release(other, "lab/study", token=hub.token, endpoint=hub.endpoint)
    assert (dict(hub.repos["lab/study"].commits), dict(hub.lfs), hub.calls["preupload"]) == before


@pytest.mark.parametrize("damage", ["missing", "altered"])
def test_damaged_release_is_refused_before_any_upload(release, hub, tmp_path, damage):
    copy = tmp_path / "copy"
    shutil.copytree(release, copy)
    image = next((copy / "images").iterdir())
    if damage == "missing":
        image.unlink()
    else:
        image.write_bytes(image.read_bytes()[:-1] + b"\x00")
    with pytest.raises(HubError, match=f"images/{image.name}: .*nothing was uploaded"):
        push_release(copy, "lab/study", token=hub.token, endpoint=hub.endpoint)
    assert hub.repos == {} and sum(hub.calls.values()) == 0


def test_unknown_licence_is_refused_naming_the_source(hub, tmp_path):
    bad = make_release(tmp_path, licences={"astronaut": "public domain (NASA)", "grace_hopper": "Getty editorial"})
    with pytest.raises(HubError, match="grace_hopper \\('Getty editorial'\\)") as info:
        push_release(bad, "lab/study", token=hub.token, endpoint=hub.endpoint)
    with pytest.raises(HubError, match="Getty editorial"):  # before the token is even looked at
        push_release(bad, "lab/study", token="", endpoint=hub.endpoint)
    assert "items.jsonl" in str(info.value) and "nothing was uploaded" in str(info.value)
    assert hub.repos == {} and sum(hub.calls.values()) == 0


def test_missing_token_is_refused_before_any_upload(release, hub, tmp_path, monkeypatch):
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(hf_constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    with pytest.raises(HubError, match="no Hugging Face token: set HF_TOKEN"):
        push_release(release, "lab/study", endpoint=hub.endpoint)
    assert hub.repos == {} and sum(hub.calls.values()) == 0


def test_wrong_token_is_refused_by_the_hub(release, hub):
    with pytest.raises(HubTransferError, match="(?s)401.*HF_TOKEN"):
        push_release(release, "lab/study", token="hf_wrong", endpoint=hub.endpoint)
    assert hub.repos == {}


def test_pull_of_a_missing_version_lists_the_ones_there(release, hub, tmp_path):
    push_release(release, "lab/study", token=hub.token, endpoint=hub.endpoint)
    with pytest.raises(HubError, match="has no version 9.9.9; versions there: 1.0.0"):
        pull_release("lab/study@9.9.9", tmp_path / "out", endpoint=hub.endpoint)
    with pytest.raises(HubError, match="ORG/NAME@VERSION"):
        pull_release("lab/study", tmp_path / "out", endpoint=hub.endpoint)
    assert not (tmp_path / "out").exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("keep")
    with pytest.raises(HubError, match="busy: not empty"):
        pull_release("lab/study@1.0.0", tmp_path / "busy", endpoint=hub.endpoint)
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["mine.txt"]


@pytest.mark.slow  # three command-line processes, each importing datasets: ~15 s
def test_cli_push_and_pull_read_hf_endpoint_and_hf_token(release, hub, tmp_path):
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.endpoint,
        "HF_TOKEN": hub.token,
        "HF_HUB_DISABLE_XET": "1",
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_OFFLINE": "0",
    }
    cli = [sys.executable, "-m", "counterfactory"]
    push = subprocess.run(
        [*cli, "release", "push", str(release), "--repo", "lab/cli", "--private"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert push.returncode == 0, push.stderr
    assert "pushed lab/cli@1.0.0" in push.stdout
    assert hub.repos["lab/cli"].private and "1.0.0" in hub.repos["lab/cli"].tags
    out = tmp_path / "pulled"
    pull = subprocess.run(
        [*cli, "release", "pull", "lab/cli@1.0.0", str(out)], env=env, capture_output=True, text=True, timeout=120
    )
    assert pull.returncode == 0, pull.stderr
    assert verify_release(out) == []
    no_token = {k: v for k, v in env.items() if k != "HF_TOKEN"}
    refused = subprocess.run(
        [*cli, "release", "push", str(release), "--repo", "lab/other"],
        env=no_token,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "no Hugging Face token" in refused.stderr
    assert "lab/other" not in hub.repos


def test_disability_sets_are_gated_by_default_and_the_card_names_limb_difference():
    from counterfactory.manifests.hub_card import INTENDED_USE, sensitive_axes

    limb = {"design": {"kind": "limb", "axes": {"cue": ["removed", "kept"]}}}
    assert sensitive_axes(limb) == ["limb difference"]
    assert sensitive_axes({"design": {"kind": "face", "axes": {"race": ["A"], "gender": ["f"]}}}) == ["race", "gender"]
    assert "limb difference" in INTENDED_USE.format(axes=" and ".join(sensitive_axes(limb)))


def test_every_config_loads_with_its_declared_types(exported, tmp_path):
    import datasets
    import pyarrow.parquet as pq

    for config in ("items", "trials", "variants"):
        loaded = datasets.load_dataset(str(exported.folder), config, split="test", cache_dir=str(tmp_path))
        shard = exported.folder / next(t for t in exported.tables if t.name == config).files[0]
        assert loaded.features == datasets.Features.from_arrow_schema(pq.read_schema(shard)), config
    trials = datasets.load_dataset(str(exported.folder), "trials", split="test", cache_dir=str(tmp_path))
    assert trials.features["gender_match"] == datasets.List(datasets.Value("bool"))
    items = datasets.load_dataset(str(exported.folder), "items", split="test", cache_dir=str(tmp_path))
    assert items.features["gate_identity_passed"] == datasets.Value("bool")
