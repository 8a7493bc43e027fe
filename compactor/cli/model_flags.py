"""Command-line flags made from an option model: one flag per field, with the field's default
and help, so that an option is declared once (in :mod:`compactor.options`) and every command
taking it shows the same flag."""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Collection
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from compactor.options.fields import Flag

Command = TypeVar("Command", bound=Callable[..., None])
# The name of the parameter that receives the command's context.
CONTEXT = "model_flags_context"


def _cli_type(annotation: Any) -> Any:
    """The type typer parses a field as: Annotated unwrapped, a Literal as ``str`` (the model
    checks the value and names the choices), an Optional kept."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _cli_type(get_args(annotation)[0])
    if origin is Literal:
        return str
    if origin in (Union, types.UnionType):
        members = [_cli_type(a) for a in get_args(annotation) if a is not type(None)]
        return members[0] | None if len(members) == 1 else str | None
    return annotation


def _flag_decls(field: FieldInfo) -> tuple[str, ...]:
    """The flag names a field's :class:`Flag` gives, or () for typer's own (``--field-name``)."""
    found = [m for m in field.metadata if isinstance(m, Flag)]
    annotation = field.annotation
    if get_origin(annotation) is Annotated:
        found += [m for m in get_args(annotation)[1:] if isinstance(m, Flag)]
    return found[0].decls if found else ()


def model_parameters(
    model: type[BaseModel], only: Collection[str] | None = None
) -> list[inspect.Parameter]:
    """One keyword-only command parameter per field of ``model`` (those in ``only``, if given)."""
    parameters = []
    for name, field in model.model_fields.items():
        if only is not None and name not in only:
            continue
        option = typer.Option(*_flag_decls(field), help=field.description)
        parameters.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=field.default,
                annotation=Annotated[_cli_type(field.annotation), option],
            )
        )
    return parameters


def with_model_flags(
    model: type[BaseModel], only: Collection[str] | None = None
) -> Callable[[Command], Command]:
    """Give a command one flag per field of ``model``, shown where its ``options`` parameter
    is; the command receives their values in ``options`` (a dict by field name)."""

    def decorate(command: Command) -> Command:
        own = inspect.signature(command, eval_str=True)
        added = model_parameters(model, only)
        names = [p.name for p in added]
        parameters = []
        for name, parameter in own.parameters.items():
            if name == "options":
                parameters += added
            else:
                parameters.append(parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY))

        # typer passes the command's context to a parameter of this type: it tells which
        # flags were given.
        parameters.append(
            inspect.Parameter(CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
        )

        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> None:
            # Only the flags given: a table property, then the model's default, fills the rest.
            context = kwargs.pop(CONTEXT, None)
            values = {name: kwargs.pop(name) for name in names if name in kwargs}
            options = {
                name: value
                for name, value in values.items()
                if context is None or context.get_parameter_source(name).name != "DEFAULT"
            }
            command(*args, options=options, **kwargs)

        run.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
        return run  # type: ignore[return-value]

    return decorate
