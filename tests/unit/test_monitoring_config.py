"""docker-compose.yml's `monitoring` profile: Prometheus scrapes every speckv
service on the metrics port that service is configured with, Grafana is
provisioned with that Prometheus and the speckv dashboard, and both run pinned
images only when the profile is asked for (no Docker engine needed)."""
from __future__ import annotations

import json
import re

import yaml

from tests.support.repo import REPO_ROOT

COMPOSE = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
SPECKV_IMAGE = {name: s for name, s in SERVICES.items() if s.get("image", "").startswith("speckv:")}
# The one-shot `certs` job (it writes the TLS bundle, then exits) serves no metrics.
SPECKV = {name: s for name, s in SPECKV_IMAGE.items() if s["command"][0] != "certs"}
MONITORING = {name: s for name, s in SERVICES.items() if name not in SPECKV_IMAGE}
PROMETHEUS = yaml.safe_load((REPO_ROOT / "deploy/prometheus/prometheus.yml").read_text())
DASHBOARD = json.loads((REPO_ROOT / "deploy/grafana/speckv.json").read_text())


def _mounts(service: dict) -> dict[str, str]:
    """Container path -> repository path of a service's bind mounts."""
    out = {}
    for volume in service.get("volumes", ()):
        source, target = volume.split(":")[:2]
        out[target] = source
    return out


def test_monitoring_runs_pinned_images_only_in_its_profile():
    assert set(MONITORING) == {"prometheus", "grafana"}
    for name, service in MONITORING.items():
        assert service["profiles"] == ["monitoring"], name
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", service["image"]), f"{name}: pin a release tag"
    for name, service in SPECKV_IMAGE.items():
        assert "profiles" not in service, f"{name} must run without a profile"


def test_prometheus_scrapes_each_speckv_service_on_its_metrics_port():
    scraped = {(job["job_name"], target) for job in PROMETHEUS["scrape_configs"]
               for group in job["static_configs"] for target in group["targets"]}
    expected = {(s["command"][0], f"{name}:{s['environment']['SPECKV_METRICS_PORT']}")
                for name, s in SPECKV.items()}
    assert scraped == expected  # the job is the service kind, as the dashboard's $job expects
    mounts = _mounts(SERVICES["prometheus"])
    assert mounts["/etc/prometheus/prometheus.yml"] == "./deploy/prometheus/prometheus.yml"


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard():
    mounts = _mounts(SERVICES["grafana"])
    provisioning = REPO_ROOT / mounts["/etc/grafana/provisioning"]
    (datasource,) = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards/speckv.yml").read_text())["providers"]
    dashboard_mount = f"{provider['options']['path']}/speckv.json"
    assert (REPO_ROOT / mounts[dashboard_mount]).resolve() == (REPO_ROOT / "deploy/grafana/speckv.json").resolve()
    (variable,) = [v for v in DASHBOARD["templating"]["list"] if v["type"] == "datasource"]
    assert variable["current"]["value"] == datasource["uid"]


def test_every_dashboard_panel_queries_through_the_datasource_variable():
    panels = [p for p in DASHBOARD["panels"] if p["type"] != "row"]
    titles = [p["title"] for p in panels]
    assert len(set(titles)) == len(titles)
    assert len({p["id"] for p in DASHBOARD["panels"]}) == len(DASHBOARD["panels"])
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
