"""deploy/ray: the manifests parse, the cluster launcher's config passes Ray's own validation
(also in its commented EC2 form), and the commands they run are ones compactor accepts.

No Kubernetes or cloud here: KubeRay's CRDs are not available offline, so the KubeRay manifests
are checked for their shape and for what compactor needs of them.
"""

from __future__ import annotations

import copy
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("ray")

from ray.autoscaler._private.util import prepare_config, validate_config  # noqa: E402

from support import REPOSITORY

RAY_DIR = REPOSITORY / "deploy" / "ray"
COMPACTOR = Path(sys.executable).parent / "compactor"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((RAY_DIR / name).read_text()) if d]


def run_flags() -> set[str]:
    """The options ``compactor run`` accepts."""
    help_text = subprocess.run(
        [str(COMPACTOR), "run", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    ).stdout
    return {word.strip(",") for word in help_text.split() if word.startswith("--")}


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def cluster_specs() -> list[dict[str, Any]]:
    (cluster,) = [d for d in documents("raycluster.yaml") if d["kind"] == "RayCluster"]
    (job,) = documents("rayjob.yaml")
    return [cluster["spec"], job["spec"]["rayClusterSpec"]]


def test_kuberay_manifests_run_compactor_on_its_own_image() -> None:
    kinds = [(d["apiVersion"], d["kind"]) for d in documents("raycluster.yaml")]
    assert kinds == [("v1", "ServiceAccount"), ("ray.io/v1", "RayCluster")]
    (job,) = documents("rayjob.yaml")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    for spec in cluster_specs():
        images = {c["image"] for c in containers(spec)}
        assert images == {"compactor-ray:0.1.0"}
        assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
        ray_version = spec["rayVersion"]
        dockerfile = (RAY_DIR / "Dockerfile").read_text()
        assert f"ARG RAY_VERSION={ray_version}\n" in dockerfile

    command = shlex.split(job["spec"]["entrypoint"])
    assert command[:2] == ["compactor", "run"]
    assert command[command.index("--executor") + 1] == "ray"
    assert command[command.index("--ray-address") + 1] == "auto"
    flags = {word for word in command if word.startswith("--")}
    assert flags <= run_flags()


def test_cluster_launcher_config_passes_rays_validation() -> None:
    text = (RAY_DIR / "cluster.yaml").read_text()
    config = yaml.safe_load(text)
    validate_config(prepare_config(copy.deepcopy(config)))
    assert config["provider"]["type"] == "local"

    # The commented EC2 variant: uncomment it in place of provider, auth and the worker counts.
    block = text.split("# --- or on EC2", 1)[1].split("\n", 1)[1]
    uncommented = "\n".join(line.removeprefix("#").removeprefix(" ") for line in block.splitlines())
    ec2 = {
        k: v
        for k, v in config.items()
        if k not in ("provider", "auth", "min_workers", "max_workers")
    }
    ec2.update(yaml.safe_load(uncommented))
    prepared = prepare_config(copy.deepcopy(ec2))
    validate_config(prepared)
    assert sorted(prepared["available_node_types"]) == ["head", "rewrite"]

    commands = " ".join(config["head_start_ray_commands"] + config["worker_start_ray_commands"])
    assert "--num-cpus=0" in commands and "--object-store-memory=268435456" in commands


def test_every_ray_node_requires_the_clusters_token() -> None:
    """Token authentication is on everywhere: an unauthenticated Ray cluster runs whatever code
    it is sent, and compactor's tasks carry FileIO properties."""
    for spec in cluster_specs():
        for container in containers(spec):
            env = {e["name"]: e for e in container["env"]}
            assert env["RAY_AUTH_MODE"]["value"] == "token", container["name"]
            secret = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert secret == {"name": "compactor-ray-token", "key": "token"}, container["name"]
    config = yaml.safe_load((RAY_DIR / "cluster.yaml").read_text())
    assert config["file_mounts"]["~/.ray/auth_token"] == "./auth_token"
    for command in config["head_start_ray_commands"] + config["worker_start_ray_commands"]:
        if "ray start" in command:
            assert "RAY_AUTH_MODE=token " in command, command
