"""``warmth.jsonl``: per cell of the release its verdict and the ``redness`` gate's red shift.

A spec asks for it with ``release.files: {warmth.jsonl: {}}``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from counterfactory.manifests.release_files import RELEASE_FILES, ReleaseContext, ReleaseFile


class WarmthFileOptions(BaseModel):
    """``release.files."warmth.jsonl"`` in a spec."""

    model_config = ConfigDict(extra="forbid")

    accepted_only: bool = False


class WarmthFile(ReleaseFile):
    """One row per cell (or per accepted item): cell id, status and red shift."""

    description = "per cell its verdict and the redness gate's red shift (schemas/warmth.schema.json)"
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["cell_id", "status", "red_shift"],
        "additionalProperties": False,
        "properties": {
            "cell_id": {"type": "string"},
            "status": {"type": "string"},
            "red_shift": {"type": ["number", "null"]},
        },
    }

    def build(self, ctx: ReleaseContext) -> list[dict[str, Any]]:
        rows = ctx.manifest if self.options.accepted_only else ctx.items
        out = []
        for row in sorted(rows, key=lambda r: r["cell_id"]):
            metrics = ((row.get("gates") or {}).get("redness") or {}).get("metrics") or {}
            out.append({"cell_id": row["cell_id"], "status": row["status"], "red_shift": metrics.get("red_shift")})
        return out


RELEASE_FILES.register("warmth.jsonl", WarmthFileOptions, WarmthFile)
