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
# Where a setting came from, highest first (a table property's source names the property).
FLAG, TABLE_PROPERTY, JOB_FILE, DEFAULT = "flag", "table property", "job file", "default"


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


def _switches(action: str) -> tuple[str, str]:
    """The properties that pause ``action``: every action's, then its own."""
    return f"{PREFIX}enabled", f"{PREFIX}{action}.enabled"


def paused_by(table: str, properties: Mapping[str, str], action: str) -> str | None:
    """The property (``key=false``) that pauses ``action`` on the table, or None."""
    for key in _switches(action):
        if not _switch(table, properties, key):
            return f"{key}={properties[key]}"
    return None


def enabled_setting(table: str, properties: Mapping[str, str], action: str) -> tuple[bool, str]:
    """Whether the table's properties let ``action`` run, and where that came from: the property
    that pauses it, else the most specific one set, else the default."""
    paused = paused_by(table, properties, action)
    if paused is not None:
        return False, f"{TABLE_PROPERTY} {paused.partition('=')[0]}"
    set_keys = [key for key in _switches(action) if key in properties]
    return True, f"{TABLE_PROPERTY} {set_keys[-1]}" if set_keys else DEFAULT


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
    came from (:func:`label_sources`)."""
    values = {**property_options(table, properties, action, model), **given}
    return label_sources(values, properties, action, flags=given)


def label_sources(
    values: Mapping[str, Any],
    properties: Mapping[str, str],
    action: str,
    *,
    flags: Collection[str] = (),
    job_file: Collection[str] = (),
) -> dict[str, tuple[Any, str]]:
    """``values`` (settings of ``action`` by option name), each with where it came from, the
    first that applies: ``flag`` (or keyword) for ``flags``, ``table property <key>`` for the
    table's ``compactor.<action>.*`` properties, ``job file`` for ``job_file``, else
    ``default``."""
    set_by_table = action_properties(properties, action)

    def source(name: str) -> str:
        if name in flags:
            return FLAG
        if name in set_by_table:
            return f"{TABLE_PROPERTY} {property_key(action, name)}"
        return JOB_FILE if name in job_file else DEFAULT

    return {name: (value, source(name)) for name, value in values.items()}


def settings_list(settings: Mapping[str, tuple[Any, str]]) -> list[dict[str, Any]]:
    """Settings with their sources as ``--json`` lists them: ``option``, ``value`` (a string,
    null when unset), ``source``; by option."""
    return [
        {"option": name, "value": None if value is None else str(value), "source": source}
        for name, (value, source) in sorted(settings.items())
    ]


def paused_actions(table: str, properties: Mapping[str, str]) -> list[str]:
    """The actions the table's properties pause."""
    return [a for a in ACTIONS if paused_by(table, properties, a) is not None]
