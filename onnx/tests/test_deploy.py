"""deploy/: the Kubernetes manifests, the container config and the Dockerfile agree with each other
and with the runtime's config keys, environment variables and endpoints."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILE = DEPLOY / "Dockerfile"

Doc = dict[str, Any]


def load_docs() -> dict[str, list[Doc]]:
    """Every YAML document under deploy/k8s, by file name (empty documents dropped)."""
    files = sorted(K8S.glob("*.yaml")) + sorted(K8S.glob("*.yml"))
    assert files, f"no YAML under {K8S}"
    out: dict[str, list[Doc]] = {}
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs, f"{path.name}: no document"
        for d in docs:
            assert isinstance(d, dict), f"{path.name}: a document is not a mapping"
        out[path.name] = docs
    return out


def objects(kind: str) -> list[Doc]:
    return [d for docs in load_docs().values() for d in docs if d.get("kind") == kind]


def one(kind: str) -> Doc:
    found = objects(kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def dotted_keys(table: dict[str, Any], prefix: str = "") -> set[str]:
    """Leaf keys of a TOML table as "section.key" (sub-tables such as stages.llm are descended)."""
    keys: set[str] = set()
    for k, v in table.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            keys |= dotted_keys(v, name + ".")
        else:
            keys.add(name)
    return keys


def repo_config() -> dict[str, Any]:
    return tomllib.loads((REPO / "config.toml").read_text())


def configmap_config() -> dict[str, Any]:
    cm = one("ConfigMap")
    assert "config.toml" in cm["data"], "the ConfigMap has no config.toml"
    return tomllib.loads(cm["data"]["config.toml"])


def image_config() -> dict[str, Any]:
    return tomllib.loads((DEPLOY / "config.toml").read_text())


def bind_port(bind: str) -> int:
    host, _, port = bind.rpartition(":")
    assert host, f"bind {bind!r} is not HOST:PORT"
    return int(port)


def known_env_vars() -> set[str]:
    """The variables of the key tables (`.env("COSY_…")` in src/config/keys.rs, the library's, and
    src/serve/settings.rs, the server's) and CONFIG_ENV: cosy refuses any other COSY_* setting
    variable."""
    tables = [REPO / "src" / "config" / "keys.rs", REPO / "src" / "serve" / "settings.rs"]
    names = {name for table in tables for name in re.findall(r'\.env\("(COSY_[A-Z_]+)"\)', table.read_text())}
    config_env = re.search(r'pub const CONFIG_ENV: &str = "(COSY_[A-Z_]+)";', (REPO / "src" / "config" / "mod.rs").read_text())
    assert names and config_env, "the key tables' variables or CONFIG_ENV not found"
    return names | {config_env.group(1)}


def dockerfile_final_stage() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile's last stage, continuation lines joined."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or not stripped:
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    instructions = [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]
    last_from = max(i for i, (ins, _) in enumerate(instructions) if ins == "FROM")
    return instructions[last_from:]


def dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for ins, args in dockerfile_final_stage():
        if ins == "ENV":
            for pair in shlex.split(args):
                key, sep, value = pair.partition("=")
                assert sep, f"ENV {args!r}: use KEY=VALUE"
                env[key] = value
    return env


def dockerfile_last(instruction: str) -> str:
    found = [args for ins, args in dockerfile_final_stage() if ins == instruction]
    assert found, f"the Dockerfile's final stage has no {instruction}"
    return found[-1]


def container() -> Doc:
    containers = one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def mounts() -> dict[str, Doc]:
    """Volume mounts of the cosy container, by mount path."""
    return {m["mountPath"]: m for m in container()["volumeMounts"]}


def volume_of(mount_path: str) -> Doc:
    mount = mounts().get(mount_path)
    assert mount is not None, f"nothing is mounted at {mount_path}"
    volumes = {v["name"]: v for v in one("Deployment")["spec"]["template"]["spec"]["volumes"]}
    return volumes[mount["name"]]


def shutdown_grace_s() -> int:
    cfg = configmap_config().get("server", {})
    return int(cfg.get("shutdown_grace_s", repo_config()["server"]["shutdown_grace_s"]))


def test_every_document_is_a_named_object() -> None:
    for name, docs in load_docs().items():
        for d in docs:
            assert d.get("apiVersion") and d.get("kind"), f"{name}: a document lacks apiVersion or kind"
            if d["kind"] == "Kustomization":
                continue
            assert d.get("metadata", {}).get("name"), f"{name}: {d['kind']} has no metadata.name"


def test_kustomization_lists_every_manifest() -> None:
    docs = load_docs()
    kustomization = [d for ds in docs.values() for d in ds if d["kind"] == "Kustomization"]
    if not kustomization:
        pytest.skip("no kustomization.yaml")
    listed = kustomization[0]["resources"]
    others = {name for name, ds in docs.items() if all(d["kind"] != "Kustomization" for d in ds)}
    assert sorted(listed) == sorted(others)


def test_probes_use_health_and_ready_on_the_service_port() -> None:
    c = container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    if "startupProbe" in c:
        # /health answers during the model load; a startup probe on /ready would need its own budget.
        assert c["startupProbe"]["httpGet"]["path"] in ("/health", "/ready")
    service = one("Service")
    (sport,) = service["spec"]["ports"]
    target = sport["targetPort"]
    assert target in ports, f"Service targetPort {target!r} is not a named container port {sorted(ports)}"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe in c:
            assert c[probe]["httpGet"]["port"] in (target, ports[target]), probe
    pod_labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_one_port_everywhere() -> None:
    target = one("Service")["spec"]["ports"][0]["targetPort"]
    (port,) = [p["containerPort"] for p in container()["ports"] if p["name"] == target]
    assert bind_port(configmap_config()["server"]["bind"]) == port
    assert bind_port(image_config()["server"]["bind"]) == port
    assert bind_port(dockerfile_env()["COSY_BIND"]) == port
    assert int(dockerfile_last("EXPOSE").split("/")[0]) == port


def test_grace_period_covers_the_drain() -> None:
    pod = one("Deployment")["spec"]["template"]["spec"]
    pre_stop = container().get("lifecycle", {}).get("preStop", {})
    sleep_s = 0
    if "exec" in pre_stop:
        command = pre_stop["exec"]["command"]
        assert command[0] == "sleep"
        sleep_s = int(command[1])
    elif "sleep" in pre_stop:
        sleep_s = int(pre_stop["sleep"]["seconds"])
    assert pod["terminationGracePeriodSeconds"] > sleep_s + shutdown_grace_s()


def test_config_keys_exist() -> None:
    known = dotted_keys(repo_config())
    for name, cfg in (("ConfigMap config.toml", configmap_config()), ("deploy/config.toml", image_config())):
        unknown = dotted_keys(cfg) - known
        assert not unknown, f"{name}: keys not in config.toml: {sorted(unknown)}"


def test_env_vars_are_known_to_cosy() -> None:
    known = known_env_vars()
    deployment_env = {e["name"] for e in container().get("env", [])}
    for name in deployment_env | set(dockerfile_env()):
        if name.startswith("COSY_"):
            assert name in known, f"{name}: cosy refuses unknown COSY_* variables"
    # Service links would add COSY_SERVICE_HOST, COSY_PORT, ... for a Service named cosy*.
    prefixes = {s["metadata"]["name"].upper().replace("-", "_") for s in objects("Service")}
    if any(p.startswith("COSY") for p in prefixes):
        assert one("Deployment")["spec"]["template"]["spec"].get("enableServiceLinks") is False
    secret = next(e for e in container()["env"] if e["name"] == "COSY_API_KEY")
    assert secret["valueFrom"]["secretKeyRef"]["optional"] is True


def test_paths_agree() -> None:
    cm = configmap_config()
    env = dockerfile_env()
    model_dir = cm["model"]["dir"]
    voices_dir = cm["voices"]["dir"]
    assert env["COSY_MODEL"] == image_config()["model"]["dir"] == model_dir
    assert env["COSY_VOICES"] == image_config()["voices"]["dir"] == voices_dir
    assert env["COSY_ENGINE_CACHE"] == cm["runtime"]["engine_cache"] == image_config()["runtime"]["engine_cache"]
    assert mounts()[model_dir].get("readOnly") is True
    assert voices_dir in mounts() and not mounts()[voices_dir].get("readOnly", False)
    assert cm["runtime"]["engine_cache"] in mounts()
    config_file = Path(env["COSY_CONFIG"])
    config_volume = volume_of(str(config_file.parent))
    assert config_volume["configMap"]["name"] == one("ConfigMap")["metadata"]["name"]
    # ONNX Runtime is found beside the binary (/opt/cosy/lib/cosy, from the tarball): no variable.
    assert "COSY_ORT_LIBRARY" not in env and "ORT_DYLIB_PATH" not in env


def test_threads_match_cpu_request() -> None:
    threads = configmap_config().get("runtime", {}).get("threads", 0)
    if threads:
        assert str(threads) == str(container()["resources"]["requests"]["cpu"])


def test_hpa_targets_the_deployment() -> None:
    hpa = one("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", one("Deployment")["metadata"]["name"])
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert "cpu" in container()["resources"]["requests"], "CPU utilization is relative to the CPU request"


def test_claims_exist_and_voices_are_shared() -> None:
    claims = {d["metadata"]["name"]: d for d in load_docs()["pvc.yaml"] if d["kind"] == "PersistentVolumeClaim"}
    volumes = one("Deployment")["spec"]["template"]["spec"]["volumes"]
    for v in volumes:
        if "persistentVolumeClaim" in v:
            assert v["persistentVolumeClaim"]["claimName"] in claims, v["name"]
    voices = volume_of(configmap_config()["voices"]["dir"])
    assert "ReadWriteMany" in claims[voices["persistentVolumeClaim"]["claimName"]]["spec"]["accessModes"]
    model = volume_of(configmap_config()["model"]["dir"])
    assert model["persistentVolumeClaim"].get("readOnly") is True


def test_dockerfile_runs_cosy_serve_as_non_root() -> None:
    command = json.loads(dockerfile_last("ENTRYPOINT")) + json.loads(dockerfile_last("CMD"))
    assert command == ["cosy", "serve"]
    args = container().get("args")
    assert args in (None, ["serve"])
    user = dockerfile_last("USER").split(":")[0]
    assert user not in ("root", "0")
    if user.isdigit():
        pod = one("Deployment")["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] == int(user)
    # Built from the relocatable tarball (scripts/package.sh), laid out as an install, on BASE.
    stage = dockerfile_final_stage()
    assert stage[0][1] == "${BASE}", "the final stage is FROM the BASE build-arg"
    adds = [a for ins, a in stage if ins == "ADD"]
    assert any(a.split()[0] == "${TARBALL}" for a in adds), "the image unpacks the tarball"
    runs = " ".join(a for ins, a in stage if ins == "RUN")
    assert "ln -s /opt/cosy/bin/cosy /usr/local/bin/cosy" in runs
