"""Settings of the geometry family (docs/workflow.md, "Families"): ``geometry`` config section."""

from __future__ import annotations

from dataclasses import dataclass

from posmech.settings.schema_fields import GeometryFields


@dataclass(frozen=True)
class GeometrySettings(GeometryFields):
    """The ``geometry`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md)."""
