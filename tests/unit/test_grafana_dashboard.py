"""deploy/grafana/compactor.json: a Grafana dashboard model that imports as is and queries only
metrics the daemon exports; deploy/kubernetes ships it to Grafana's sidecar, deploy/compose
provisions it."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from compactor.daemon.metrics import DaemonMetrics

from support import REPOSITORY

GRAFANA = REPOSITORY / "deploy" / "grafana"
DASHBOARD = GRAFANA / "compactor.json"
METRIC = re.compile(r"\bcompactor_[a-z_]+\b")
# The sample names each kind of metric family exports.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}


def _dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return board


def _queries(board: dict[str, Any]) -> list[str]:
    panels = [p for p in board["panels"] if p["type"] != "row"]
    variables = board["templating"]["list"]
    return [t["expr"] for p in panels for t in p["targets"]] + [
        v["definition"] for v in variables if v["type"] == "query"
    ]


def _exported_names() -> set[str]:
    """Every sample name the daemon's registry exports, its labelled families included
    (exported once a label is used)."""
    text = DaemonMetrics().exposition().decode()
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in SUFFIXES[family.type]
    }


def test_every_queried_metric_is_exported() -> None:
    queried = {name for query in _queries(_dashboard()) for name in METRIC.findall(query)}
    assert queried, "the dashboard queries no compactor metric"
    assert queried - _exported_names() == set()


def test_every_exported_metric_is_shown() -> None:
    queried = {name for query in _queries(_dashboard()) for name in METRIC.findall(query)}
    families = {name.removesuffix("_total") for name in queried}
    families |= {name.removesuffix("_bucket") for name in queried}
    text = DaemonMetrics().exposition().decode()
    # Counters' and histograms' creation times are exported as families of their own.
    exported = {
        family.name
        for family in text_string_to_metric_families(text)
        if not family.name.endswith("_created")
    }
    assert exported - families == set()


def test_the_model_imports_as_is_with_a_datasource_variable() -> None:
    board = _dashboard()
    assert board["uid"] == "compactor" and board["title"] and board["schemaVersion"] >= 36
    (datasource,) = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert (datasource["name"], datasource["query"]) == ("datasource", "prometheus")
    reference = {"type": "prometheus", "uid": "${datasource}"}
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == reference, panel["title"]
        assert panel["targets"] and all(t["datasource"] == reference for t in panel["targets"])
    # Nothing left from an export that would need the import dialog: no ${DS_...} inputs.
    assert board["__inputs"] == [] and "${DS_" not in DASHBOARD.read_text()


def test_kubernetes_ships_the_dashboard_to_grafanas_sidecar() -> None:
    kustomization = yaml.safe_load((GRAFANA / "kustomization.yaml").read_text())
    (generator,) = kustomization["configMapGenerator"]
    assert generator["files"] == ["compactor.json"]
    assert generator["options"]["labels"] == {"grafana_dashboard": "1"}
    main = yaml.safe_load((REPOSITORY / "deploy" / "kubernetes" / "kustomization.yaml").read_text())
    assert "../grafana" in main["resources"]


def test_compose_provisions_the_dashboard() -> None:
    compose_dir = REPOSITORY / "deploy" / "compose"
    compose = yaml.safe_load((compose_dir / "compose.yaml").read_text())
    grafana = compose["services"]["grafana"]
    mounts = {
        m.split(":")[1]: (compose_dir / m.split(":")[0]).resolve() for m in grafana["volumes"]
    }
    dashboards = next(source for target, source in mounts.items() if "dashboards" in target)
    assert (dashboards / "compactor.json").samefile(DASHBOARD) or dashboards.samefile(GRAFANA)
    provisioning = next(source for target, source in mounts.items() if "provisioning" in target)
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    assert [d["type"] for d in datasources["datasources"]] == ["prometheus"]
    providers = yaml.safe_load((provisioning / "dashboards" / "compactor.yaml").read_text())
    (provider,) = providers["providers"]
    assert provider["options"]["path"] in mounts
    prometheus = yaml.safe_load((compose_dir / "prometheus.yaml").read_text())
    (scrape,) = prometheus["scrape_configs"]
    assert scrape["static_configs"] == [{"targets": ["compactor:9464"]}]
