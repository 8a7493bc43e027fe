"""Maintenance set with the table, by its own ``compactor.*`` properties.

As Amoro's ``self-optimizing.*`` properties, they let a table's owner pause or tune its
maintenance with one ``ALTER TABLE ... SET TBLPROPERTIES`` from Spark or Trino:

- ``compactor.enabled = false`` pauses every action on the table, and
  ``compactor.<action>.enabled = false`` one of them (:data:`ACTIONS`);
- ``compactor.<action>.<option>`` sets an option of the action, spelled as its flag without the
  dashes in front (``compactor.compact.strategy = sort``, ``compactor.compact.sort-order = ts``,
  ``compactor.expire.retain-last = 20``), and for the daemon a threshold of the action's job-file
  section (``compactor.compact.min-small-files = 50``). The resources of a run (executor,
  parallelism, memory) are the operator's, not the table's: they are not read here.

Precedence, highest first: a command-line flag (or a library keyword), the table property, the
job file, the default.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pydantic import BaseModel

from compactor.errors import CompactorError, ConfigError, UsageError
from compactor.options.fields import parse_options

PREFIX = "compactor."
ACTIONS = ("compact", "expire", "orphans", "rewrite-deletes", "rewrite-manifests")
# Options of a run's resources, which stay the operator's to set.
OPERATOR_OPTIONS = frozenset({"executor", "ray_address", "parallelism", "memory_limit"})
FALSE, TRUE = frozenset({"false", "off", "no", "0"}), frozenset({"true", "on", "yes", "1"})


class TableDisabledError(CompactorError):
    """The table's own properties pause this action: nothing was done (not a failure)."""

    exit_code = 0

    def __init__(self, table: str, action: str, setting: str) -> None:
        super().__init__(f"table {table}: {action} is paused by its property {setting}")
        self.table, self.action, self.setting = table, action, setting


def _switch(table: str, properties: Mapping[str, str], key: str) -> bool:
    value = properties.get(key, "true").strip().lower()
    if value in FALSE | TRUE:
        return value in TRUE
    raise ConfigError(f"table {table}: property {key}={properties[key]!r} is not true or false")


def paused_by(table: str, properties: Mapping[str, str], action: str) -> str | None:
    """The property (``key=false``) that pauses ``action`` on the table, or None."""
    for key in (f"{PREFIX}enabled", f"{PREFIX}{action}.enabled"):
        if not _switch(table, properties, key):
            return f"{key}={properties[key]}"
    return None


def check_enabled(table: str, properties: Mapping[str, str], action: str) -> None:
    """Raise :class:`TableDisabledError` when the table's properties pause ``action``."""
    setting = paused_by(table, properties, action)
    if setting is not None:
        raise TableDisabledError(table, action, setting)


def action_properties(properties: Mapping[str, str], action: str) -> dict[str, str]:
    """The table's ``compactor.<action>.<name>`` properties but ``enabled``, by option name
    (``sort-order`` -> ``sort_order``)."""
    prefix = f"{PREFIX}{action}."
    return {
        key[len(prefix) :].replace("-", "_"): value
        for key, value in properties.items()
        if key.startswith(prefix) and key != f"{prefix}enabled"
    }


def property_key(action: str, name: str) -> str:
    """The table property that sets option ``name`` of ``action``."""
    return f"{PREFIX}{action}.{name.replace('_', '-')}"


def property_options(
    table: str,
    properties: Mapping[str, str],
    action: str,
    model: type[BaseModel],
    names: Collection[str] | None = None,
) -> dict[str, Any]:
    """The options of ``model`` the table's properties set for ``action`` (those in ``names``
    only, when given), parsed by the model; a bad value is a ConfigError naming the property.
    Properties that are not options of ``model`` are left to whoever knows them (the daemon's
    job-file sections)."""
    allowed = set(model.model_fields) - OPERATOR_OPTIONS
    if names is not None:
        allowed &= set(names)
    found = {n: v for n, v in action_properties(properties, action).items() if n in allowed}
    if not found:
        return {}
    try:
        parsed = parse_options(model, found)
    except UsageError as exc:
        name = exc.options[0] if exc.options else next(iter(found))
        key = property_key(action, name)
        raise ConfigError(f"table {table}: property {key}={found.get(name)!r}: {exc}") from None
    return {name: getattr(parsed, name) for name in found}


def setting_sources(
    table: str,
    properties: Mapping[str, str],
    action: str,
    model: type[BaseModel],
    given: Mapping[str, Any],
) -> dict[str, tuple[Any, str]]:
    """The options of ``action`` not left at their default, each with its value and where it
    came from: ``flag`` (or keyword) or ``table property <key>``, the first winning."""
    found = {
        name: (value, f"table property {property_key(action, name)}")
        for name, value in property_options(table, properties, action, model).items()
    }
    found |= {name: (value, "flag") for name, value in given.items()}
    return found


def paused_actions(table: str, properties: Mapping[str, str]) -> list[str]:
    """The actions the table's properties pause."""
    return [a for a in ACTIONS if paused_by(table, properties, a) is not None]
