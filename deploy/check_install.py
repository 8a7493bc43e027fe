"""Check an installed compactor: every module of the package imports with what pip installed.

``compactor --help`` loads the command line only; the modules behind each action (the rewrite,
sorting, expiry, orphan sweep, delete rewrite, the daemon) import their own dependencies, so a
dependency missing from the install shows up only when that action first runs. This imports
them all, now. Run it with the environment's own Python, outside the source tree (so that the
installed package is the one imported):

    /opt/compactor/venv/bin/python deploy/check_install.py --extras s3

A module that needs an extra not named in ``--extras`` (``compactor[ray]`` for the Ray executor)
is listed as skipped; the modules each named extra brings must import. Exit 0 when everything
imports, 1 otherwise, naming each module and the error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

# Python puts this script's directory first on sys.path, and deploy/ holds directories named
# like packages (ray/): import nothing from there.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

# The modules each extra installs, by import name.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "s3": ("boto3",),
    "ray": ("ray",),
    "postgres": ("psycopg2",),
}


def extra_of(module: str) -> str | None:
    """The extra that installs ``module`` (a top-level import name), if any."""
    top = module.split(".")[0]
    return next((extra for extra, tops in EXTRA_MODULES.items() if top in tops), None)


def package_modules(root: Path) -> list[str]:
    """Every module of the package in ``root`` (a directory named after it), sorted."""
    names = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(names)


def check(extras: set[str]) -> dict[str, Any]:
    """Import every module of compactor and each extra's modules; report what happened."""
    report: dict[str, Any] = {"imported": [], "skipped": {}, "failed": {}}
    try:
        package = importlib.import_module("compactor")
    except Exception as exc:  # noqa: BLE001 - reported, as every other failure
        report["failed"]["compactor"] = f"{type(exc).__name__}: {exc}"
        return report
    root = Path(package.__file__ or "").parent
    report["version"] = getattr(package, "__version__", None)
    report["location"] = str(root)
    for extra in sorted(extras):
        for name in EXTRA_MODULES[extra]:
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001
                report["failed"][name] = f"compactor[{extra}]: {type(exc).__name__}: {exc}"
    for name in package_modules(root):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            extra = extra_of(exc.name or "")
            if extra and extra not in extras:
                report["skipped"][name] = extra
            else:
                report["failed"][name] = f"ModuleNotFoundError: {exc}"
        except Exception as exc:  # noqa: BLE001
            report["failed"][name] = f"{type(exc).__name__}: {exc}"
        else:
            report["imported"].append(name)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--extras",
        default="",
        help="comma-separated extras that were installed, e.g. s3 or s3,ray",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    extras = {e.strip() for e in args.extras.split(",") if e.strip()}
    unknown = extras - set(EXTRA_MODULES)
    if unknown:
        parser.error(f"--extras: unknown {sorted(unknown)} (known: {sorted(EXTRA_MODULES)})")
    report = check(extras)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, error in report["failed"].items():
            print(f"error: {name}: {error}", file=sys.stderr)
        skipped = "".join(
            f"; skipped {name} (needs compactor[{extra}])"
            for name, extra in report["skipped"].items()
        )
        print(
            f"compactor {report.get('version')} at {report.get('location')}: "
            f"{len(report['imported'])} modules imported, {len(report['failed'])} failed{skipped}"
        )
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
