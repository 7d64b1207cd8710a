"""Apply the automations of ``deployments/automations.yaml`` to a Prefect server (``prefect-executorch deploy``).

Each entry is a Prefect automation; a ``send-notification`` action names its block by
``<block-type-slug>/<block-name>`` (resolved to the block document's id here), and ``{{ $VAR }}``
reads the environment. Applying replaces the automations of the same name, so a second deploy
leaves one of each.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError

from prefect_executorch.errors import DeployFailed, SpecError
from prefect_executorch.spec.yamlfile import load_yaml

_ENV = re.compile(r"\{\{\s*\$(\w+)\s*\}\}")


class AutomationsFile(BaseModel):
    """The file's top level."""

    automations: list[dict[str, Any]] = Field(default_factory=list)


def _expand(value: Any) -> Any:
    """``{{ $VAR }}`` from the environment, everywhere in the tree (unset: empty)."""
    if isinstance(value, str):
        # Any variable the file names, as prefect.yaml's templates do: not only our settings.
        return _ENV.sub(lambda match: os.environ.get(match.group(1), ""), value)
    if isinstance(value, list):
        return [_expand(item) for item in value]
    if isinstance(value, dict):
        return {key: _expand(item) for key, item in value.items()}
    return value


def load_automations(path: Path) -> list[dict[str, Any]]:
    """The automations of ``path`` with the environment filled in; ``SpecError`` for an unreadable file."""
    try:
        data = load_yaml(path.read_text()) or {}
        return [_expand(entry) for entry in AutomationsFile.model_validate(data).automations]
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise SpecError(f"automations file: cannot read {str(path)!r}: {exc}") from None


async def _resolve_action(client: Any, action: dict[str, Any], where: str) -> dict[str, Any] | None:
    """``block: type/name`` -> ``block_document_id``; None when the block is unset (the automation is skipped)."""
    from prefect.exceptions import ObjectNotFound

    if "block" not in action:
        return action
    slug = action["block"].strip()
    if not slug:
        return None
    block_type, _, name = slug.partition("/")
    if not block_type or not name:
        raise SpecError(f"{where}.block: {slug!r} must be '<block-type-slug>/<block-name>', e.g. 'slack-webhook/ml-alerts'")
    try:
        document = await client.read_block_document_by_name(name=name, block_type_slug=block_type)
    except ObjectNotFound:
        raise SpecError(f"{where}.block: no {block_type!r} block named {name!r} on the server; create it "
                        "(UI: Blocks, or `Block.save`) before deploying") from None
    rest = {key: value for key, value in action.items() if key != "block"}
    return {**rest, "block_document_id": str(document.id)}


async def apply_automations(entries: list[dict[str, Any]]) -> list[str]:
    """Create each automation (replacing one of the same name); return one line per automation, applied or skipped."""
    from prefect import get_client
    from prefect.events.schemas.automations import AutomationCore

    done: list[str] = []
    async with get_client() as client:
        for index, entry in enumerate(entries):
            name = entry.get("name") or f"automations[{index}]"
            actions = [await _resolve_action(client, action, f"{name}.actions[{i}]")
                       for i, action in enumerate(entry.get("actions") or [])]
            if any(action is None for action in actions):
                done.append(f"skipped automation {name}: its notification block is not set")
                continue
            try:
                automation = AutomationCore.model_validate({**entry, "actions": actions})
            except ValidationError as exc:
                raise SpecError(f"automation {name}: {exc}") from None
            for existing in await client.read_automations_by_name(automation.name):
                await client.delete_automation(existing.id)
            await client.create_automation(automation)
            done.append(f"automation {automation.name}")
    return done


def apply_automations_file(path: Path) -> list[str]:
    """``apply_automations`` of ``path`` from sync code; an unreachable API is a ``DeployFailed``."""
    import asyncio

    import httpx
    from prefect.settings import PREFECT_API_URL

    entries = load_automations(path)
    try:
        return asyncio.run(apply_automations(entries))
    except httpx.HTTPError as exc:
        raise DeployFailed(f"cannot create automations at {PREFECT_API_URL.value() or 'the ephemeral API'}: {exc}; "
                           "start a server (`prefect server start`) and set PREFECT_API_URL") from None
