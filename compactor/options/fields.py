"""What option models are made of: checked field types, command-line flag hints, and one way
of turning a model's validation error into a one-line UsageError naming the option."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, get_args

from pydantic import AfterValidator, BaseModel, ValidationError, ValidationInfo

from compactor.durations import parse_cutoff, parse_duration_ms
from compactor.errors import UsageError
from compactor.sizes import parse_size

FILTER_EXAMPLE = "region = 'eu' and event_id >= 100"

Model = TypeVar("Model", bound=BaseModel)


@dataclass(frozen=True)
class Flag:
    """How a field appears on the command line when not as ``--field-name`` with ``--no-``
    for booleans: ``decls`` replace the flag names (``("--rewrite-all",)``)."""

    decls: tuple[str, ...]


class OptionValueError(ValueError):
    """A shared parser's UsageError, carried through pydantic so callers get it back whole."""

    def __init__(self, usage: UsageError, *, names_itself: bool = False) -> None:
        # A field's error drops its "option: " prefix: pydantic reports where the value was.
        super().__init__(str(usage) if names_itself else str(usage).split(": ", 1)[-1])
        self.usage = usage


def checked(check: Callable[[Any, str], object]) -> AfterValidator:
    """A pydantic validator running ``check(value, option_name)``, a parser raising UsageError."""

    def run(value: Any, info: ValidationInfo) -> Any:
        try:
            check(value, info.field_name or "value")
        except UsageError as exc:
            raise OptionValueError(exc) from None
        return value

    return AfterValidator(run)


def at_least(minimum: int, meaning: str = "") -> AfterValidator:
    """An integer field's lower bound, in its error's words (``meaning``) if given."""

    def check(value: int, option: str) -> None:
        if value < minimum:
            raise UsageError(
                f"{option}: must be {meaning or f'at least {minimum}'}, got {value}", option
            )

    return checked(check)


def _ratio(value: float, option: str) -> None:
    if not 0 < value <= 1:
        raise UsageError(f"{option}: must be above 0 and at most 1, got {value}", option)


def check_filter_syntax(where: str) -> None:
    """Fail with one line when ``where`` is not a filter expression pyiceberg can parse.

    Columns are checked later, against the table's schema, by the planner.
    """
    from pyiceberg.expressions.parser import parse

    try:
        parse(where)
    except Exception as exc:  # pyparsing's ParseException, or a literal that does not convert
        column = getattr(exc, "col", None)
        at = f" at column {column}" if isinstance(column, int) and column > 1 else ""
        raise UsageError(
            f'where {where!r}: not a valid filter{at} (example: "{FILTER_EXAMPLE}")', "where"
        ) from None


def _branch_name(value: str, option: str) -> None:
    if not value.strip():
        raise UsageError(f"{option}: must name a branch, got {value!r}", option)


Size = Annotated[str, checked(parse_size)]
Filter = Annotated[str, checked(lambda value, _: check_filter_syntax(value))]
Ratio = Annotated[float, checked(_ratio)]
Duration = Annotated[str, checked(parse_duration_ms)]
# A duration before now (5d) or an ISO timestamp: the cut-off of expiry and orphan removal.
Cutoff = Annotated[str, checked(lambda value, option: parse_cutoff(value, option, 0))]
BranchName = Annotated[str, checked(_branch_name)]


def choices(annotation: Any) -> tuple[str, ...]:
    """The names a Literal field (possibly Optional or Annotated) allows; () for other fields."""
    for arg in (annotation, *get_args(annotation)):
        found = tuple(a for a in get_args(arg) if isinstance(a, str))
        if found and all(isinstance(a, str) for a in get_args(arg)):
            return found
    return ()


def parse_options(model: type[Model], options: dict[str, Any]) -> Model:
    """``model`` from option keywords; the first problem is a UsageError naming the option."""
    try:
        return model(**options)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        cause = (error.get("ctx") or {}).get("error")
        name = str(error["loc"][0]) if error["loc"] else "options"
        if isinstance(cause, OptionValueError):
            usage = cause.usage
            raise (usage if usage.options else UsageError(str(usage), name)) from None
        if error["type"] == "extra_forbidden":
            known = ", ".join(model.model_fields)
            raise UsageError(f"{name}: unknown option (options: {known})", name) from None
        field = model.model_fields.get(name)
        allowed = choices(field.annotation) if field is not None else ()
        if error["type"] == "literal_error" and allowed:
            listed = ", ".join(map(repr, allowed))
            raise UsageError(f"{name} {options[name]!r}: must be one of {listed}", name) from None
        message = error["msg"].removeprefix("Value error, ")
        raise UsageError(f"{name}: {message}", name) from None
