"""A job file's section as it applies to one table: the table's own ``compactor.<action>.*``
properties over the job file's values (see :mod:`compactor.options.table_properties`).

A table may set any key of the action's section but its schedule (``every``, ``cron``) and the
run's resources: thresholds such as ``compactor.compact.min-small-files`` as well as options such
as ``compactor.compact.strategy``. A key the section does not have is an error naming the
property, as an unknown key of a job file is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from compactor.daemon.jobfiles import Schedule
from compactor.errors import ConfigError
from compactor.options.table_properties import (
    OPERATOR_OPTIONS,
    action_properties,
    enabled_setting,
    label_sources,
    property_key,
)

Section = TypeVar("Section", bound=BaseModel)


def property_action(action: str) -> str:
    """A job file's action (``rewrite_deletes``) as table properties spell it (``rewrite-deletes``)."""
    return action.replace("_", "-")


def for_table(section: Section, table: str, properties: Mapping[str, str], action: str) -> Section:
    """``section`` with the table's ``compactor.<action>.*`` properties over its values."""
    spelled = property_action(action)
    found = action_properties(properties, spelled)
    if not found:
        return section
    allowed = set(type(section).model_fields) - set(Schedule.model_fields) - OPERATOR_OPTIONS
    for name in found:
        if name not in allowed:
            raise ConfigError(
                f"table {table}: property {property_key(spelled, name)}: not a setting of "
                f"[{action}] (settings: {', '.join(sorted(allowed))})"
            )
    try:
        return type(section).model_validate({**section.model_dump(), **found})
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        name = str(error["loc"][0]) if error["loc"] else next(iter(found))
        message = error["msg"].removeprefix("Value error, ")
        key = property_key(spelled, name if name in found else next(iter(found)))
        raise ConfigError(f"table {table}: property {key}: {message}") from None


def table_settings(
    section: BaseModel, table: str, properties: Mapping[str, str], action: str
) -> dict[str, tuple[Any, str]]:
    """Every setting of a job file's ``section`` (its schedule aside) as it applies to the
    table, with where it came from (:func:`~compactor.options.table_properties.label_sources`:
    the table's property, the job file or the default), and ``enabled``: whether the table's
    properties let the action run."""
    spelled = property_action(action)
    effective = for_table(section, table, properties, action)
    values = {
        name: getattr(effective, name)
        for name in type(section).model_fields
        if name not in Schedule.model_fields
    }
    labelled = label_sources(values, properties, spelled, job_file=section.model_fields_set)
    return {**labelled, "enabled": enabled_setting(table, properties, spelled)}
