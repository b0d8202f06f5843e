"""Render configmap.yaml: config/proxy.toml as a ConfigMap, verbatim.

    python3 deploy/kubernetes/configmap.py        # rewrites deploy/kubernetes/configmap.yaml

tests/test_deploy.py checks the two are equal, so a change to config/proxy.toml fails the
tests until this is run.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parents[1] / "config" / "proxy.toml"
HEAD = """# config/proxy.toml as a ConfigMap, verbatim (a test keeps them equal). Renew it with:
#   python3 deploy/kubernetes/configmap.py
# Settings that differ in Kubernetes are set by environment in deployment.yaml.
apiVersion: v1
kind: ConfigMap
metadata:
  name: compaction-proxy-config
  labels:
    app.kubernetes.io/name: compaction-proxy
data:
  proxy.toml: |
"""


def render(config: str) -> str:
    body = "".join(f"    {line}".rstrip() + "\n" for line in config.splitlines())
    return HEAD + body


if __name__ == "__main__":
    (HERE / "configmap.yaml").write_text(render(CONFIG.read_text()))
