"""Random table histories for the differential fuzzer (fuzz.py): generation and replay.

A *history* is a JSON document, reproducible from its seed and ``GENERATOR_VERSION``::

    {"version": 1, "seed": 1234, "format_version": 2 | 3,
     "properties": {"write.metadata.metrics.default": "truncate(4)", ...},
     "schema": [{"column": "c0", "type": "double"}, ...],     # every column optional
     "spec": [{"column": "c0", "transform": "identity", "name": "p_c0_identity"}, ...],
     "ops": [...], "actions": [...]}

Columns are named by stable ids (``c0``, ``c1``, ...): a column is created under its id as
name and ``rename_column`` gives it another, so removing operations (shrinking) never makes a
later one name the wrong column. Operations:

``append``
    ``files``: each ``{"label": "f3", "rows": [{"c0": value, ...}, ...]}`` (an empty file has
    ``"partition_row"`` instead); Iceberg Java writes one data file per partition of the current
    spec that the rows fall in. ``branch``: append to that branch instead of main.
``delete_positions``
    ``targets``: ``[{"file": label, "rows": [row index, ...]}]`` of main's files; ``scope``:
    ``file`` (a position-delete file per data file) or ``partition`` (one per partition). In
    format v3, deletion vectors instead (each merging the data file's earlier deletes).
``delete_equality``
    ``columns`` (ids), ``keys`` (value lists in that order), ``scope``: ``partition`` (the
    partition of ``partition_row`` in the current spec) or ``global`` (written under an
    unpartitioned spec of the table: needs one).
``add_column`` (``column``, ``type``), ``drop_column``, ``rename_column`` (``to``), ``promote``
    (``type``: int to long, float to double, a wider decimal).
``set_spec``
    ``fields`` as in ``spec``: the whole new spec (identity, bucket[N], truncate[W], year, month,
    day, hour, void).
``branch``, ``tag`` (``name``) at main's head; ``upgrade`` (format v2 to v3).

Values are JSON: floats as the hex of their IEEE bits (8 digits for float, 16 for double: NaN
payloads and -0.0 survive), decimals as strings, dates as days, times and timestamps as
microseconds, binary and fixed as hex. Actions (what the fuzzer does to the written table):
``{"action": "run", "strategy": ..., "columns": [...], "output_spec": "current" | "first",
"branch": ..., "rewrite_all": ..., "bulk_read": ..., "parallelism": ...}``, ``rewrite_deletes``,
``expire``, ``orphans``.

:func:`compile_history` replays a history through :class:`Model`: operations that no longer
make sense (shrinking removed what they refer to) are dropped, values are fitted to their
column's type at the time, and column ids become the names Iceberg Java sees. It returns what
``compactor.fuzzwriter.HistoryWriter`` reads.
"""

from __future__ import annotations

import copy
import math
import random
import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, TypeVar

GENERATOR_VERSION = 1

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
DAY_US = 86_400_000_000
HOUR_US = 3_600_000_000

# Column types and how often a new column has each.
TYPES: tuple[tuple[str, int], ...] = (
    ("boolean", 1),
    ("int", 3),
    ("long", 3),
    ("float", 3),
    ("double", 4),
    ("decimal(9,2)", 2),
    ("decimal(18,6)", 1),
    ("decimal(38,10)", 1),
    ("decimal(38,0)", 1),
    ("decimal(1,0)", 1),
    ("string", 4),
    ("uuid", 2),
    ("date", 2),
    ("time", 1),
    ("timestamp", 2),
    ("timestamptz", 2),
    ("binary", 1),
    ("fixed[4]", 1),
)

TRANSFORMS_BY_TYPE: dict[str, tuple[str, ...]] = {
    "boolean": ("identity",),
    "int": ("identity", "bucket", "truncate"),
    "long": ("identity", "bucket", "truncate"),
    "float": ("identity",),
    "double": ("identity",),
    "decimal": ("identity", "bucket", "truncate"),
    "string": ("identity", "bucket", "truncate"),
    "uuid": ("identity", "bucket"),
    "date": ("identity", "bucket", "year", "month", "day"),
    "time": ("identity", "bucket"),
    "timestamp": ("identity", "bucket", "year", "month", "day", "hour"),
    "timestamptz": ("identity", "bucket", "year", "month", "day", "hour"),
    "binary": ("identity", "bucket", "truncate"),
    "fixed": ("identity", "bucket"),
}
TIME_TRANSFORMS = ("year", "month", "day", "hour")

METRICS_MODES = (None, None, "none", "counts", "full", "truncate(4)")


def base_type(type_name: str) -> str:
    """``decimal(9,2)`` -> ``decimal``, ``fixed[4]`` -> ``fixed``."""
    return type_name.split("(")[0].split("[")[0]


def decimal_shape(type_name: str) -> tuple[int, int]:
    """(precision, scale) of ``decimal(P,S)``."""
    precision, scale = type_name[len("decimal(") : -1].split(",")
    return int(precision), int(scale)


def transform_allowed(transform: str, type_name: str) -> bool:
    """Whether Iceberg defines ``transform`` (``bucket[4]``, ``day``, ...) on ``type_name``."""
    kind = transform.split("[")[0]
    if kind == "truncate" and base_type(type_name) == "decimal":
        return False  # Java's truncate of a decimal near its lowest value overflows the type
    return kind == "void" or kind in TRANSFORMS_BY_TYPE[base_type(type_name)]


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------


def f32(bits: int) -> str:
    return f"{bits:08x}"


def f64(bits: int) -> str:
    return f"{bits:016x}"


def float_hex(value: float) -> str:
    return f32(struct.unpack(">I", struct.pack(">f", value))[0])


def double_hex(value: float) -> str:
    return f64(struct.unpack(">Q", struct.pack(">d", value))[0])


FLOAT_NASTY = (
    f32(0x00000000),  # 0.0
    f32(0x80000000),  # -0.0
    f32(0x7FC00000),  # NaN, canonical
    f32(0xFFC00000),  # NaN, sign bit set (what x86 computes for 0.0/0.0)
    f32(0x7FC00001),  # NaN with a payload
    f32(0x7F800000),  # inf
    f32(0xFF800000),  # -inf
    f32(0x00000001),  # smallest subnormal
    f32(0x7F7FFFFF),  # largest finite
    float_hex(1.5),
    float_hex(-2.25),
)
DOUBLE_NASTY = (
    f64(0x0000000000000000),
    f64(0x8000000000000000),
    f64(0x7FF8000000000000),
    f64(0xFFF8000000000000),
    f64(0x7FF8000000000001),
    f64(0x7FF4000000000000),  # a signalling NaN's bits as a quiet one would not have them
    f64(0x7FF0000000000000),
    f64(0xFFF0000000000000),
    f64(0x0000000000000001),
    f64(0x7FEFFFFFFFFFFFFF),
    double_hex(0.1),
    double_hex(-1e300),
    double_hex(1.0),
)
STRING_NASTY = (
    "",
    "\x00",
    "a\x00",
    "a\x00b",
    "a",
    "ab",
    "prefix-prefix-prefix-x",
    "prefix-prefix-prefix-y",
    "aaaaaaaaaaaaaaaa",  # 16 characters: the default truncate(16) bound
    "aaaaaaaaaaaaaaaab",
    "é",
    "\U0001f600",
    "\U0010ffff",
    "\uffff\uffff",
    "null",
    "NaN",
    "a/b",
    "a=b%20c",
    " ",
)
# No uuid has its top bit set: Iceberg Java compares uuids as signed numbers when it matches
# equality-delete files to data files by their bounds (apache/iceberg#14216), so the reference
# would skip deletes that apply.
UUID_NASTY = (
    "00000000-0000-0000-0000-000000000000",
    "7fffffff-ffff-ffff-ffff-ffffffffffff",
    "7fffffff-ffff-ffff-8000-000000000000",
    "00000000-0000-0000-8000-000000000000",
    "00000000-0000-0000-ffff-ffffffffffff",
)
# Instants around midnight, the epoch and daylight-saving changes (US and EU, 2024), in us.
DST_SECONDS = (1710054000, 1711846800, 1729990800, 1730613600)
TIMESTAMP_NASTY = (
    0,
    -1,
    1,
    DAY_US - 1,
    DAY_US,
    -DAY_US,
    -DAY_US - 1,
    -HOUR_US - 1,
    951_782_400_000_000,  # 2000-02-29T00:00
    951_868_799_999_999,  # 2000-02-29T23:59:59.999999
    -62_135_596_800_000_000,  # 0001-01-01T00:00
    253_402_300_799_999_999,  # 9999-12-31T23:59:59.999999
    *(s * 1_000_000 + d for s in DST_SECONDS for d in (-1, 0, 1)),
    *(s * 1_000_000 - HOUR_US for s in DST_SECONDS[:2]),
)
DATE_NASTY = (0, -1, 1, 10957, 11016, 19783, -719162, 2932896, -25567)
TIME_NASTY = (0, 1, DAY_US - 1, 43_200_000_000, HOUR_US - 1)
BINARY_NASTY = ("", "00", "0000", "ff" * 17, "0001", "00ff00")
FIXED_NASTY = ("00000000", "ffffffff", "00000001", "80000000", "7fffffff")


def decimal_nasty(type_name: str) -> list[str]:
    precision, scale = decimal_shape(type_name)
    whole = "9" * (precision - scale) or "0"
    biggest = whole + ("." + "9" * scale if scale else "")
    smallest = "0." + "0" * (scale - 1) + "1" if scale else "1"
    zero = "0." + "0" * scale if scale else "0"
    return [biggest, "-" + biggest, smallest, "-" + smallest, zero]


def nasty_values(type_name: str) -> list[Any]:
    """Values of ``type_name`` chosen to hurt: edges, NaNs, signed zeros, shared prefixes."""
    kind = base_type(type_name)
    match kind:
        case "boolean":
            return [True, False]
        case "int":
            return [0, 1, -1, INT_MIN, INT_MAX, 10, -10]
        case "long":
            return [0, -1, LONG_MIN, LONG_MAX, INT_MAX + 1, INT_MIN - 1]
        case "float":
            return list(FLOAT_NASTY)
        case "double":
            return list(DOUBLE_NASTY)
        case "decimal":
            return decimal_nasty(type_name)
        case "string":
            return list(STRING_NASTY)
        case "uuid":
            return list(UUID_NASTY)
        case "date":
            return list(DATE_NASTY)
        case "time":
            return list(TIME_NASTY)
        case "timestamp" | "timestamptz":
            return list(TIMESTAMP_NASTY)
        case "binary":
            return list(BINARY_NASTY)
        case "fixed":
            return list(FIXED_NASTY)
    raise ValueError(type_name)


def random_value(type_name: str, rng: random.Random) -> Any:
    """An ordinary value of ``type_name``."""
    kind = base_type(type_name)
    match kind:
        case "boolean":
            return rng.random() < 0.5
        case "int":
            return rng.randint(-1000, 1000)
        case "long":
            return rng.randint(-(10**12), 10**12)
        case "float":
            return float_hex(rng.uniform(-1000, 1000))
        case "double":
            return double_hex(round(rng.uniform(-1e6, 1e6), rng.randint(0, 6)))
        case "decimal":
            precision, scale = decimal_shape(type_name)
            digits = rng.randint(1, precision)
            unscaled = rng.randint(0, 10**digits - 1) * rng.choice((1, -1))
            return format(Decimal(unscaled).scaleb(-scale), "f")
        case "string":
            size = rng.randint(1, 24)
            return "".join(rng.choice("abcxyz-_0") for _ in range(size))
        case "uuid":
            return str(uuid.UUID(int=rng.getrandbits(127)))
        case "date":
            return rng.randint(-3650, 25000)
        case "time":
            return rng.randint(0, DAY_US - 1)
        case "timestamp" | "timestamptz":
            return rng.randint(-(10**15), 2 * 10**15)
        case "binary":
            return rng.randbytes(rng.randint(0, 20)).hex()
        case "fixed":
            return rng.randbytes(4).hex()
    raise ValueError(type_name)


def value_pool(type_name: str, rng: random.Random) -> list[Any]:
    """The few values a column draws from: duplicates make partitions and deletes collide."""
    nasty = nasty_values(type_name)
    pool = rng.sample(nasty, min(len(nasty), rng.randint(1, 4)))
    pool += [random_value(type_name, rng) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.6:
        pool.append(None)
    return pool


def coerce(value: Any, type_name: str) -> Any:
    """``value`` as a value of ``type_name`` (after a promotion, or a removed one), or None."""
    if value is None:
        return None
    kind = base_type(type_name)
    if kind in ("int", "long"):
        low, high = (INT_MIN, INT_MAX) if kind == "int" else (LONG_MIN, LONG_MAX)
        return value if isinstance(value, int) and low <= value <= high else None
    if kind == "float":
        if len(value) == 8:
            return value
        widened = struct.unpack(">d", bytes.fromhex(value))[0]
        if math.isnan(widened):
            return f32(0x7FC00000)
        try:
            return float_hex(widened)
        except OverflowError:
            return None
    if kind == "double":
        if len(value) == 16:
            return value
        return double_hex(struct.unpack(">f", bytes.fromhex(value))[0])
    if kind == "decimal":
        precision, scale = decimal_shape(type_name)
        number = Decimal(value)
        if number.as_tuple().exponent != -scale:
            return None
        return value if len(number.as_tuple().digits) <= precision else None
    return value


# --------------------------------------------------------------------------------------------
# The model: what the table holds, as far as generating and replaying need to know
# --------------------------------------------------------------------------------------------


@dataclass
class Column:
    cid: str
    name: str
    type: str


@dataclass
class AppendedFile:
    ref: str  # "main" or a branch name
    rows: list[dict[str, Any]]  # column id -> value, as appended


@dataclass
class Model:
    """The state a history has built so far; :meth:`apply` checks and compiles one operation."""

    format_version: int
    columns: dict[str, Column] = field(default_factory=dict)  # current columns by id, in order
    spec: list[dict[str, str]] = field(default_factory=list)  # current spec (column ids)
    specs: list[list[dict[str, str]]] = field(default_factory=list)  # every spec so far
    spec_sources: set[str] = field(default_factory=set)  # columns any spec uses
    equality_columns: set[str] = field(default_factory=set)  # columns any delete keys on
    files: dict[str, AppendedFile] = field(default_factory=dict)  # by label
    refs: dict[str, str] = field(default_factory=dict)  # name -> "branch" | "tag"
    has_snapshot: bool = False  # main has a snapshot

    @property
    def names(self) -> set[str]:
        return {c.name for c in self.columns.values()}

    def has_unpartitioned_spec(self) -> bool:
        return any(all(f["transform"] == "void" for f in spec) for spec in self.specs)

    def branches(self) -> list[str]:
        return [name for name, kind in self.refs.items() if kind == "branch"]

    def main_files(self) -> list[str]:
        return [label for label, f in self.files.items() if f.ref == "main" and f.rows]

    def row(self, row: dict[str, Any] | None) -> dict[str, Any]:
        """A row (column id -> value) as Java gets it: current names, values fitted to type."""
        row = row or {}
        return {
            c.name: coerce(row.get(cid), c.type) for cid, c in self.columns.items() if cid in row
        }

    def spec_fields(self, fields: Sequence[dict[str, str]]) -> list[dict[str, str]]:
        """The fields of a spec that are valid now: known column, transform defined on its type,
        no duplicate name, source-and-transform pair or second time transform of a source."""
        kept: list[dict[str, str]] = []
        names: set[str] = set()
        pairs: set[tuple[str, str]] = set()
        timed: set[str] = set()
        for f in fields:
            column = self.columns.get(f["column"])
            transform = f["transform"]
            if column is None or not transform_allowed(transform, column.type):
                continue
            if f["name"] in names or f["name"] in self.names:
                continue
            kind = transform.split("[")[0]
            if transform != "void" and (f["column"], transform) in pairs:
                continue
            if kind in TIME_TRANSFORMS and f["column"] in timed:
                continue
            names.add(f["name"])
            pairs.add((f["column"], transform))
            if kind in TIME_TRANSFORMS:
                timed.add(f["column"])
            kept.append(dict(f))
        return kept

    def java_spec(self, fields: Sequence[dict[str, str]]) -> list[dict[str, str]]:
        return [
            {
                "source": self.columns[f["column"]].name,
                "transform": f["transform"],
                "name": f["name"],
            }
            for f in fields
        ]

    def apply(self, op: dict[str, Any]) -> dict[str, Any] | None:
        """Update the model with ``op``; return it as Java reads it, or None if it is invalid."""
        kind = op["op"]
        handler: Callable[[dict[str, Any]], dict[str, Any] | None] = getattr(self, f"_{kind}")
        return handler(op)

    def _append(self, op: dict[str, Any]) -> dict[str, Any] | None:
        branch = op.get("branch")
        if branch is not None and self.refs.get(branch) != "branch":
            return None
        files = []
        for f in op["files"]:
            if f["label"] in self.files:
                continue
            rows = [{cid: v for cid, v in r.items() if cid in self.columns} for r in f["rows"]]
            entry: dict[str, Any] = {"label": f["label"], "rows": [self.row(r) for r in rows]}
            if not rows:
                entry["partition_row"] = self.row(f.get("partition_row"))
            files.append(entry)
            self.files[f["label"]] = AppendedFile(branch or "main", rows)
        if not files:
            return None
        if branch is None:
            self.has_snapshot = True
        return {"op": "append", "files": files, "branch": branch}

    def _delete_positions(self, op: dict[str, Any]) -> dict[str, Any] | None:
        targets = []
        for t in op["targets"]:
            f = self.files.get(t["file"])
            if f is None or f.ref != "main":
                continue
            rows = sorted({i for i in t["rows"] if 0 <= i < len(f.rows)})
            if rows:
                targets.append({"file": t["file"], "rows": rows})
        if not targets:
            return None
        return {"op": "delete_positions", "targets": targets, "scope": op["scope"]}

    def _delete_equality(self, op: dict[str, Any]) -> dict[str, Any] | None:
        columns = op["columns"]
        if not columns or not op["keys"] or any(c not in self.columns for c in columns):
            return None  # (Java writes no file for a delete file without rows)
        if any(base_type(self.columns[c].type) == "fixed" for c in columns):
            return None  # Java's generic reader applies only the last key of a fixed column
        if op["scope"] == "global" and not self.has_unpartitioned_spec():
            return None
        types = [self.columns[c].type for c in columns]
        keys = [[coerce(v, t) for v, t in zip(key, types, strict=True)] for key in op["keys"]]
        self.equality_columns.update(columns)
        compiled = {
            "op": "delete_equality",
            "columns": [self.columns[c].name for c in columns],
            "keys": keys,
            "scope": op["scope"],
        }
        if op["scope"] == "partition":
            compiled["partition_row"] = self.row(op.get("partition_row"))
        return compiled

    def _add_column(self, op: dict[str, Any]) -> dict[str, Any] | None:
        cid = op["column"]
        if cid in self.columns or cid in self.names:
            return None
        self.columns[cid] = Column(cid, cid, op["type"])
        return {"op": "add_column", "name": cid, "type": op["type"]}

    def _drop_column(self, op: dict[str, Any]) -> dict[str, Any] | None:
        cid = op["column"]
        if cid not in self.columns or len(self.columns) < 2:
            return None
        if cid in self.spec_sources or cid in self.equality_columns:
            return None
        name = self.columns.pop(cid).name
        return {"op": "drop_column", "name": name}

    def _rename_column(self, op: dict[str, Any]) -> dict[str, Any] | None:
        cid, to = op["column"], op["to"]
        if cid not in self.columns or to in self.names:
            return None
        if any(f["name"] == to for spec in self.specs for f in spec):
            return None
        old = self.columns[cid].name
        self.columns[cid].name = to
        return {"op": "rename_column", "name": old, "to": to}

    def _promote(self, op: dict[str, Any]) -> dict[str, Any] | None:
        cid, to = op["column"], op["type"]
        column = self.columns.get(cid)
        if column is None or not promotable(column.type, to):
            return None
        if cid in self.spec_sources:
            return None  # Java then writes manifests it cannot (Float partition values as double)
        column.type = to
        return {"op": "promote", "name": column.name, "type": to}

    def _set_spec(self, op: dict[str, Any]) -> dict[str, Any] | None:
        fields = self.spec_fields(op["fields"])
        self.spec = fields
        self.specs.append(fields)
        self.spec_sources.update(f["column"] for f in fields)
        return {"op": "set_spec", "fields": self.java_spec(fields)}

    def _branch(self, op: dict[str, Any]) -> dict[str, Any] | None:
        return self._ref(op, "branch")

    def _tag(self, op: dict[str, Any]) -> dict[str, Any] | None:
        return self._ref(op, "tag")

    def _ref(self, op: dict[str, Any], kind: str) -> dict[str, Any] | None:
        if not self.has_snapshot or op["name"] in self.refs or op["name"] == "main":
            return None
        self.refs[op["name"]] = kind
        return {"op": kind, "name": op["name"]}

    def _upgrade(self, op: dict[str, Any]) -> dict[str, Any] | None:
        if self.format_version != 2:
            return None
        self.format_version = 3
        return {"op": "upgrade"}

    def action(self, action: dict[str, Any]) -> dict[str, Any] | None:
        """A compactor action with column ids replaced by the final names, or None if invalid."""
        compiled = dict(action)
        if action["action"] != "run":
            return compiled
        if action.get("branch") is not None and self.refs.get(action["branch"]) != "branch":
            return None
        if action.get("strategy") in ("sort", "zorder"):
            columns = []
            for c in action["columns"]:
                cid = c[0] if isinstance(c, list) else c
                if cid in self.columns:
                    name = self.columns[cid].name
                    columns.append([name, *c[1:]] if isinstance(c, list) else name)
            if not columns:
                return None
            compiled["columns"] = columns
        return compiled


def promotable(old: str, new: str) -> bool:
    """Iceberg's type promotions: int to long, float to double, decimal to a wider precision."""
    if (old, new) in (("int", "long"), ("float", "double")):
        return True
    if base_type(old) == base_type(new) == "decimal":
        (p1, s1), (p2, s2) = decimal_shape(old), decimal_shape(new)
        return s1 == s2 and p2 > p1
    return False


def new_model(history: dict[str, Any]) -> tuple[Model, dict[str, Any]]:
    """The model after the history's table is created, and the creation as Java reads it."""
    model = Model(format_version=history["format_version"])
    for c in history["schema"]:
        model.columns[c["column"]] = Column(c["column"], c["column"], c["type"])
    model.spec = model.spec_fields(history["spec"])
    model.specs.append(model.spec)
    model.spec_sources.update(f["column"] for f in model.spec)
    created = {
        "seed": history["seed"],
        "format_version": history["format_version"],
        "properties": dict(history.get("properties", {})),
        "schema": [{"name": c.name, "type": c.type} for c in model.columns.values()],
        "spec": model.java_spec(model.spec),
    }
    return model, created


def compile_history(history: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The history as ``HistoryWriter`` reads it, and its valid actions (names, not ids)."""
    model, java = new_model(history)
    ops = [compiled for op in history["ops"] if (compiled := model.apply(op)) is not None]
    if not history["schema"] or not model.columns:
        raise ValueError("a history needs at least one column")
    actions = [a for action in history["actions"] if (a := model.action(action)) is not None]
    return {**java, "ops": ops}, actions


# --------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------


class Generator:
    """Builds one history from a seed, keeping the model up to date as it goes."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(f"compactor-fuzz-v{GENERATOR_VERSION}-{seed}")
        self.pools: dict[str, list[Any]] = {}
        self.counter = 0

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def column_type(self) -> str:
        names, weights = zip(*TYPES, strict=True)
        return self.rng.choices(names, weights)[0]

    def new_column(self, type_name: str | None = None) -> tuple[str, str]:
        cid = f"c{len(self.pools)}"
        type_name = type_name or self.column_type()
        self.pools[cid] = value_pool(type_name, self.rng)
        return cid, type_name

    def spec_field(self, model: Model, cid: str) -> dict[str, str] | None:
        column = model.columns[cid]
        choices = list(TRANSFORMS_BY_TYPE[base_type(column.type)])
        kind = self.rng.choice(choices)
        if kind == "bucket":
            transform = f"bucket[{self.rng.choice((1, 2, 3, 16))}]"
        elif kind == "truncate":
            transform = f"truncate[{self.rng.choice((1, 2, 4, 10))}]"
        else:
            transform = kind
        name = f"p_{cid}_{transform.replace('[', '').replace(']', '')}"
        taken = {f["name"] for spec in model.specs for f in spec}
        while name in taken:
            name = f"{name}x"
        return {"column": cid, "transform": transform, "name": name}

    def row(self, model: Model) -> dict[str, Any]:
        return {cid: self.rng.choice(self.pools[cid]) for cid in model.columns}

    def generate(self) -> dict[str, Any]:
        rng = self.rng
        format_version = rng.choice((2, 2, 3))
        schema = []
        for _ in range(rng.randint(2, 5)):
            cid, type_name = self.new_column()
            schema.append({"column": cid, "type": type_name})
        properties = {}
        metrics = rng.choice(METRICS_MODES)
        if metrics is not None:
            properties["write.metadata.metrics.default"] = metrics
        history: dict[str, Any] = {
            "version": GENERATOR_VERSION,
            "seed": self.seed,
            "format_version": format_version,
            "properties": properties,
            "schema": schema,
            "spec": [],
            "ops": [],
            "actions": [],
        }
        model, _ = new_model(history)
        if rng.random() < 0.65:
            fields = [self.spec_field(model, rng.choice(list(model.columns)))]
            if rng.random() < 0.3:
                fields.append(self.spec_field(model, rng.choice(list(model.columns))))
            history["spec"] = [f for f in fields if f]
            model, _ = new_model(history)
        ops = history["ops"]
        for i in range(rng.randint(4, 13)):
            op = self.append(model) if i == 0 else self.operation(model)
            if op is not None and model.apply(op) is not None:
                ops.append(op)
        history["actions"] = self.actions(model)
        return history

    def operation(self, model: Model) -> dict[str, Any] | None:
        rng = self.rng
        kinds = {
            "append": 5.0,
            "delete_positions": 3.0 if model.main_files() else 0.0,
            "delete_equality": 3.0,
            "add_column": 1.0,
            "drop_column": 0.7,
            "rename_column": 0.7,
            "promote": 1.0,
            "set_spec": 1.5,
            "branch": 0.4 if model.has_snapshot else 0.0,
            "tag": 0.4 if model.has_snapshot else 0.0,
            "branch_append": 1.0 if model.branches() else 0.0,
            "upgrade": 0.3 if model.format_version == 2 else 0.0,
        }
        names, weights = zip(*kinds.items(), strict=True)
        kind = rng.choices(names, weights)[0]
        match kind:
            case "append":
                return self.append(model)
            case "branch_append":
                return self.append(model, branch=rng.choice(model.branches()))
            case "delete_positions":
                return self.delete_positions(model)
            case "delete_equality":
                return self.delete_equality(model)
            case "add_column":
                cid, type_name = self.new_column()
                return {"op": "add_column", "column": cid, "type": type_name}
            case "drop_column":
                return {"op": "drop_column", "column": rng.choice(list(model.columns))}
            case "rename_column":
                cid = rng.choice(list(model.columns))
                return {"op": "rename_column", "column": cid, "to": self.fresh(f"{cid}_r")}
            case "promote":
                return self.promote(model)
            case "set_spec":
                return self.set_spec(model)
            case "branch" | "tag":
                return {"op": kind, "name": self.fresh(kind[0])}
            case "upgrade":
                return {"op": "upgrade"}
        raise AssertionError(kind)

    def append(self, model: Model, branch: str | None = None) -> dict[str, Any]:
        rng = self.rng
        files = []
        for _ in range(rng.randint(1, 3)):
            label = self.fresh("f")
            if rng.random() < 0.08:
                files.append({"label": label, "rows": [], "partition_row": self.row(model)})
                continue
            rows = [self.row(model) for _ in range(rng.randint(1, 25))]
            files.append({"label": label, "rows": rows})
        op: dict[str, Any] = {"op": "append", "files": files}
        if branch is not None:
            op["branch"] = branch
        return op

    def delete_positions(self, model: Model) -> dict[str, Any]:
        rng = self.rng
        labels = model.main_files()
        targets = []
        for label in rng.sample(labels, min(len(labels), rng.randint(1, 3))):
            size = len(model.files[label].rows)
            rows = rng.sample(range(size), rng.randint(1, max(1, size // 2)))
            targets.append({"file": label, "rows": sorted(rows)})
        scope = rng.choice(("file", "partition"))
        return {"op": "delete_positions", "targets": targets, "scope": scope}

    def delete_equality(self, model: Model) -> dict[str, Any] | None:
        rng = self.rng
        keyable = [c for c, column in model.columns.items() if base_type(column.type) != "fixed"]
        if not keyable:
            return None
        columns = rng.sample(keyable, min(len(keyable), rng.choice((1, 1, 2))))
        live = [r for f in model.files.values() if f.ref == "main" for r in f.rows]
        keys = []
        for _ in range(rng.randint(1, 6)):
            if live and rng.random() < 0.7:
                row = rng.choice(live)
                keys.append([row.get(c) for c in columns])
            else:
                keys.append([rng.choice(self.pools[c]) for c in columns])
        scope = "global" if model.has_unpartitioned_spec() and rng.random() < 0.4 else "partition"
        op: dict[str, Any] = {
            "op": "delete_equality",
            "columns": columns,
            "keys": keys,
            "scope": scope,
        }
        if scope == "partition":
            op["partition_row"] = rng.choice(live) if live else self.row(model)
        return op

    def promote(self, model: Model) -> dict[str, Any] | None:
        rng = self.rng
        options = []
        for cid, column in model.columns.items():
            if cid in model.spec_sources:
                continue
            if column.type == "int":
                options.append((cid, "long"))
            elif column.type == "float":
                options.append((cid, "double"))
            elif base_type(column.type) == "decimal":
                precision, scale = decimal_shape(column.type)
                if precision < 38:
                    wider = rng.choice(sorted({precision + 1, 18, 38} - {precision}))
                    options.append((cid, f"decimal({max(wider, precision + 1)},{scale})"))
        if not options:
            return None
        cid, to = rng.choice(options)
        self.pools[cid] = [coerce(v, to) for v in self.pools[cid]]
        self.pools[cid] += rng.sample(nasty_values(to), 2)
        return {"op": "promote", "column": cid, "type": to}

    def set_spec(self, model: Model) -> dict[str, Any]:
        rng = self.rng
        fields = [dict(f) for f in model.spec]
        live = [f for f in fields if f["transform"] != "void"]
        change = rng.choice(("add", "add", "remove", "void", "unpartitioned", "replace"))
        if change == "remove" and live:
            fields.remove(rng.choice(live))
        elif change == "void" and live:
            rng.choice(live)["transform"] = "void"
        elif change == "unpartitioned":
            fields = []
        elif change == "replace":
            fields = [self.spec_field(model, rng.choice(list(model.columns)))]
        else:
            fields.append(self.spec_field(model, rng.choice(list(model.columns))))
        return {"op": "set_spec", "fields": [f for f in fields if f]}

    def actions(self, model: Model) -> list[dict[str, Any]]:
        rng = self.rng
        runs: list[dict[str, Any]] = []
        for _ in range(rng.randint(1, 3)):
            choice = rng.choices(
                ("binpack", "sort", "zorder", "output_spec", "branch"),
                (3, 2, 2, 2 if len(model.specs) > 1 else 0, 1 if model.branches() else 0),
            )[0]
            run: dict[str, Any] = {
                "action": "run",
                "strategy": "binpack",
                "rewrite_all": rng.random() < 0.8,
                "bulk_read": rng.random() < 0.7,
                "parallelism": rng.choice((1, 2)),
            }
            cids = list(model.columns)
            if choice == "sort":
                run["strategy"] = "sort"
                run["columns"] = [
                    [c, rng.choice(("ASC", "DESC")), rng.choice(("FIRST", "LAST"))]
                    for c in rng.sample(cids, min(len(cids), rng.randint(1, 3)))
                ]
            elif choice == "zorder":
                run["strategy"] = "zorder"
                run["columns"] = rng.sample(cids, min(len(cids), rng.randint(1, 3)))
            elif choice == "output_spec":
                run["output_spec"] = rng.choice(("current", "current", "first"))
            elif choice == "branch":
                run["branch"] = rng.choice(model.branches())
            runs.append(run)
        maintenance: list[dict[str, Any]] = []
        if rng.random() < 0.5:
            maintenance.append({"action": "rewrite_deletes"})
        rng.shuffle(maintenance)
        actions = runs + maintenance
        rng.shuffle(actions)
        if rng.random() < 0.6:
            actions.append({"action": "expire"})
        if rng.random() < 0.5:
            actions.append({"action": "orphans"})
        return actions


def generate(seed: int) -> dict[str, Any]:
    """The history of ``seed`` (for this ``GENERATOR_VERSION``)."""
    return Generator(seed).generate()


# --------------------------------------------------------------------------------------------
# Shrinking
# --------------------------------------------------------------------------------------------

T = TypeVar("T")


class Budget:
    """How many more candidate histories shrinking may try."""

    def __init__(self, tries: int) -> None:
        self.left = tries

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


def ddmin(items: list[T], fails: Callable[[list[T]], bool], budget: Budget) -> list[T]:
    """Delta debugging: a smaller list for which ``fails`` still holds (1-minimal if the
    budget allows). ``fails(items)`` is assumed true."""
    chunks = 2
    while len(items) >= 1 and budget.left > 0:
        size = math.ceil(len(items) / chunks)
        reduced = False
        for start in range(0, len(items), size):
            candidate = items[:start] + items[start + size :]
            if not budget.take():
                return items
            if fails(candidate):
                items, chunks, reduced = candidate, max(chunks - 1, 2), True
                break
        if not reduced:
            if size == 1:
                break
            chunks = min(len(items), chunks * 2)
    return items


def _replace_list(
    history: dict[str, Any], path: tuple[Any, ...], values: list[Any]
) -> dict[str, Any]:
    """``history`` with the list at ``path`` (keys and indexes from the top) replaced."""
    copied = copy.deepcopy(history)
    target = copied
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = values
    return copied


def _get(history: dict[str, Any], path: tuple[Any, ...]) -> Any:
    value: Any = history
    for key in path:
        value = value[key]
    return value


def shrink(
    history: dict[str, Any], fails: Callable[[dict[str, Any]], bool], budget: Budget
) -> dict[str, Any]:
    """A smaller history for which ``fails`` still holds: fewer actions, operations, initial
    columns and spec fields, then fewer files, rows and keys per operation, within ``budget``."""
    current = copy.deepcopy(history)

    def still_fails(candidate: dict[str, Any]) -> bool:
        try:
            compile_history(candidate)
        except ValueError:  # no column left
            return False
        return fails(candidate)

    def reduce(path: tuple[Any, ...]) -> None:
        nonlocal current
        base = current
        values = list(_get(base, path))
        if values:
            kept = ddmin(values, lambda v: still_fails(_replace_list(base, path, v)), budget)
            current = _replace_list(base, path, kept)

    for key in ("actions", "ops", "schema", "spec"):
        reduce((key,))
    for index in range(len(current["ops"])):
        op = current["ops"][index]
        if op["op"] == "append":
            reduce(("ops", index, "files"))
            for position in range(len(current["ops"][index]["files"])):
                reduce(("ops", index, "files", position, "rows"))
        elif op["op"] == "delete_equality":
            reduce(("ops", index, "keys"))
        elif op["op"] == "delete_positions":
            reduce(("ops", index, "targets"))
    return tidy(current)


def tidy(history: dict[str, Any]) -> dict[str, Any]:
    """``history`` without the values of columns it never has (left by shrinking): the same
    table, shorter to read."""
    known = {c["column"] for c in history["schema"]}
    known.update(op["column"] for op in history["ops"] if op["op"] == "add_column")
    tidied = copy.deepcopy(history)
    for op in tidied["ops"]:
        rows = [r for f in op.get("files", ()) for r in [*f["rows"], f.get("partition_row")]]
        for row in [*rows, op.get("partition_row")]:
            for cid in set(row or ()) - known:
                del row[cid]
    return tidied
