"""The retrain hook: a training pipeline emits ``model.retrain.requested``; the retrain deployment reacts.

The event's resource is ``executorch.model.<name>``; its payload is a ``RetrainRequest``. The
``retrain/<name>`` deployment's trigger matches the resource and templates the payload's fields
into the flow's parameters (see ``deployments/prefect.yaml`` and ``docs/fleet.md``).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator

from prefect_executorch.artifacts.manifest import BundleKey, user_at_host
from prefect_executorch.errors import SpecError
from prefect_executorch.spec.base import is_safe_name
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.fields import NAME_RULE

EVENT = "model.retrain.requested"
RESOURCE_PREFIX = "executorch.model."
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class RetrainRequest(BaseModel):
    """Payload of ``model.retrain.requested``: which model, which new weights, which version."""

    name: str = Field(description="Model name; must equal the spec's name in the retrain deployment.")
    weights_uri: str = Field(description="New state dict: s3://bucket/key or a path the workers can read.")
    weights_sha256: str | None = Field(None, description="Expected sha256 of the weights; the fetch refuses other bytes.")
    version: str | None = Field(None, description="Version to publish; default '<spec version>-<sha256[:12]>'.")
    reason: str = Field("", description="Free text for humans, e.g. why the model was retrained.")
    training_run: str | None = Field(None, description="Id of the training run that produced the weights (the bundle's lineage).")
    requested_by: str = Field(default_factory=user_at_host, description="user@host that emitted the request.")

    @field_validator("name", "version")
    @classmethod
    def _segment(cls, value: str | None) -> str | None:
        if value is not None and not is_safe_name(value):
            raise ValueError(f"{value!r} {NAME_RULE}")
        return value

    @field_validator("weights_sha256")
    @classmethod
    def _sha(cls, value: str | None) -> str | None:
        if value is not None and not _SHA256_RE.match(value.lower()):
            raise ValueError(f"{value!r} is not 64 hex digits; pass the file's sha256 or leave it out")
        return None if value is None else value.lower()

    @field_validator("weights_uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("empty; pass s3://bucket/path/weights.pt or a file path")
        return value

    def check_spec(self, spec: BuildSpec) -> None:
        """The request must be for the model the deployment builds."""
        if spec.name != self.name:
            raise SpecError(
                f"name: the request is for {self.name!r} but the spec builds {spec.name!r}; "
                f"emit the event for {spec.name!r} or add a retrain deployment for {self.name!r}"
            )

    @property
    def resource_id(self) -> str:
        """The event's ``prefect.resource.id``, which a model's retrain trigger matches."""
        return f"{RESOURCE_PREFIX}{self.name}"


def promotion_aliases(alias: str, keys: list[BundleKey]) -> list[tuple[str, BundleKey]]:
    """The alias each bundle of a retrain moves: ``<alias>-<compat>``, as the staging automation names it.

    An alias points at one bundle, and the bundles of one version differ by compat key; naming the
    compat key whatever the matrix's size keeps one name per target when cells are added or skipped.
    """
    return [(f"{alias}-{key.compat}", key) for key in keys]


def parse_request(data: dict[str, Any]) -> RetrainRequest:
    """Validate a retrain request; ``SpecError`` names every bad field."""
    try:
        return RetrainRequest.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc']))}: {err['msg'].removeprefix('Value error, ')}" for err in exc.errors()
        )
        raise SpecError(f"invalid retrain request: {problems}") from None


def emit_retrain(request: RetrainRequest) -> str | None:
    """Emit ``model.retrain.requested`` for ``request``; return the event id (None when events are off)."""
    from prefect.events import emit_event

    event = emit_event(
        EVENT,
        resource={"prefect.resource.id": request.resource_id, "prefect.resource.name": request.name},
        payload=request.model_dump(mode="json"),
    )
    return None if event is None else str(event.id)
