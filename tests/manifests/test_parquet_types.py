"""manifest.parquet has one type per column in every version, so two versions' tables concatenate."""

from __future__ import annotations

import pyarrow as pa
import pytest

from counterfactory.manifests.release import read_jsonl
from tests.manifests.hub_release import make_release


@pytest.mark.slow
def test_unreviewed_and_reviewed_versions_concatenate_with_booleans_as_booleans(tmp_path):
    from counterfactory.flows.engine.release import manifest_table

    rows = read_jsonl(make_release(tmp_path) / "manifest.jsonl")
    assert any(r["review"] for r in rows)
    unreviewed = [{**r, "review": None, "expression": None} for r in rows]
    reviewed = manifest_table(rows, ["race", "gender"])
    before = manifest_table(unreviewed, ["race", "gender"])
    assert before.schema == reviewed.schema
    assert before.schema.field("review").type == pa.string()  # null in every row, still a string
    assert reviewed.schema.field("gate.identity.passed").type == pa.bool_()
    assert reviewed.schema.field("gender_match").type == pa.bool_()
    assert reviewed.schema.field("gate.identity.cosine").type == pa.float64()
    both = pa.concat_tables([before, reviewed])
    assert both.num_rows == 2 * len(rows)
    assert both.column("gate.identity.passed").to_pylist() == [r["gates"]["identity"]["passed"] for r in rows] * 2
