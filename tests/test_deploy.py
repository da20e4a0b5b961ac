"""What cannot be started here, checked as far as it can be: docker-compose.yml (GPU replicas
behind Envoy), Envoy's configuration, deploy/Dockerfile, and deploy/kubernetes.yaml against the
Kubernetes OpenAPI schemas (the ``kubernetes`` client's models reject unknown fields, wrong types
and missing required ones)."""

from __future__ import annotations

import yaml

from .conftest import ROOT


def test_compose_serves_gpu_replicas_behind_one_health_checked_address():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    triton, envoy, sdk = (compose["services"][name] for name in ("triton", "envoy", "sdk"))
    assert triton["build"]["dockerfile"] == "deploy/Dockerfile" and "--strict-readiness=true" in triton["command"]
    assert triton["deploy"]["replicas"] >= 2 and "ports" not in triton  # replicas are reached through Envoy
    assert triton["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert "/v2/health/ready" in " ".join(triton["healthcheck"]["test"])
    assert {"8000:8000", "8001:8001"} <= set(envoy["ports"]) and "./deploy/envoy.yaml:/etc/envoy/envoy.yaml:ro" in \
        envoy["volumes"]
    assert envoy["depends_on"]["triton"]["condition"] == "service_healthy" and sdk["image"].endswith("-py3-sdk")
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "COPY backend /opt/tritonserver/backends/dvabatch" in dockerfile
    assert all(package in dockerfile for package in ("onnxruntime==", "onnx==", "torch==", "tensorrt"))
    # the GPU replicas' stages are built by the serving image itself, with its torch
    slicer = compose["services"]["slicer"]
    assert slicer["image"] == triton["image"] and slicer["profiles"] == ["build"]
    assert slicer["command"][:3] == ["python3", "-m", "tools.build_examples"]
    assert ["--target", "torch", "--device", "cuda"] == slicer["command"][3:7] and "./model_repository:/models" in \
        slicer["volumes"]
    assert all(f"COPY {folder} /opt/dvabatch/{folder}" in dockerfile for folder in ("backend", "slicer", "tools"))
    release = dockerfile.split("tritonserver:")[1].split("-")[0]
    assert tuple(map(int, release.split("."))) >= (26, 3), "is_ready() and dead-stub readiness need 26.03+"


def test_envoy_balances_grpc_over_every_replica_and_checks_readiness():
    config = yaml.safe_load((ROOT / "deploy" / "envoy.yaml").read_text())["static_resources"]
    listeners = {listener["name"]: listener["address"]["socket_address"]["port_value"]
                 for listener in config["listeners"]}
    assert listeners == {"grpc": 8001, "http": 8000}
    clusters = {cluster["name"]: cluster for cluster in config["clusters"]}
    grpc = clusters["triton_grpc"]
    assert grpc["type"] == "STRICT_DNS"  # every replica behind the service name
    assert "http2_protocol_options" in str(grpc["typed_extension_protocol_options"])
    for cluster in clusters.values():
        endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        assert endpoint["address"]["socket_address"]["address"] == "triton"
        assert cluster["health_checks"][0]["http_health_check"]["path"] == "/v2/health/ready"
    assert grpc["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["health_check_config"] == \
        {"port_value": 8000}


def test_kubernetes_manifest_is_valid_and_probes_triton():
    from kubernetes import client

    models = {("apps/v1", "Deployment"): client.V1Deployment, ("v1", "Service"): client.V1Service,
              ("v1", "PersistentVolumeClaim"): client.V1PersistentVolumeClaim,
              ("autoscaling/v2", "HorizontalPodAutoscaler"): client.V2HorizontalPodAutoscaler}
    documents = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes.yaml").read_text()))
    parsed = {doc["kind"]: models[(doc["apiVersion"], doc["kind"])].model_validate(doc) for doc in documents}
    assert set(parsed) == {"Deployment", "Service", "PersistentVolumeClaim", "HorizontalPodAutoscaler"}
    pod = parsed["Deployment"].spec.template.spec
    [container] = pod.containers
    assert container.resources.limits["nvidia.com/gpu"] == "1" and "--strict-readiness=true" in container.args
    assert container.readiness_probe.http_get.path == "/v2/health/ready"
    assert container.liveness_probe.http_get.path == "/v2/health/live"
    assert {p.container_port for p in container.ports} == {8000, 8001, 8002}
    assert {p.port for p in parsed["Service"].spec.ports} == {8000, 8001, 8002}
    assert parsed["Service"].spec.selector == parsed["Deployment"].spec.selector.match_labels
    hpa = parsed["HorizontalPodAutoscaler"].spec
    assert hpa.scale_target_ref.name == parsed["Deployment"].metadata.name and hpa.metrics[0].type == "Pods"
    # The check is a real one: an unknown field is refused.
    broken = dict(documents[0], spec={**documents[0]["spec"], "replica": 2})
    try:
        models[("apps/v1", "Deployment")].model_validate(broken)
    except ValueError:
        pass
    else:
        raise AssertionError("a misspelt field passed the schema check")
