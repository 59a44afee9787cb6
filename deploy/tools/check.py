#!/usr/bin/env python3
"""Checks for deploy/ that schema validation cannot make (used by .ci/validate-deploy).

  check.py manifests OVERLAY_NAME RENDERED.yaml   semantics and policy of one rendered overlay
  check.py secrets-example FILE                   the example Secrets are unusable placeholders
  check.py compose FILE                           references inside the compose file
  check.py metrics REPO_ROOT                      every idemgate_* name used exists in src/metrics.rs
  check.py dashboard FILE OUT_RULES.yml           dashboard structure; its PromQL as a rules file for promtool
  check.py redis COMPOSE_FILE REDIS_EXAMPLE.yaml   both ship the Redis settings RELIABILITY.md requires
  check.py toml FILE...                           config files parse as TOML (when no binary can check them)

Needs PyYAML (installed with yamllint). Exits 1 with one line per problem.
"""

import json
import os
import re
import sys
import tomllib

import yaml

PROBLEMS = []


def problem(msg):
    PROBLEMS.append(msg)


def duration_seconds(text):
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d)", text.strip())
    if not m:
        raise ValueError(f"not a duration: {text!r}")
    n, unit = int(m.group(1)), m.group(2)
    return n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_container(where, c, pod_volumes, configmaps):
    sc = c.get("securityContext") or {}
    if sc.get("allowPrivilegeEscalation") is not False:
        problem(f"{where}: securityContext.allowPrivilegeEscalation must be false")
    if sc.get("readOnlyRootFilesystem") is not True:
        problem(f"{where}: securityContext.readOnlyRootFilesystem must be true")
    if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
        problem(f"{where}: securityContext.capabilities.drop must contain ALL")
    res = c.get("resources") or {}
    for kind in ("requests", "limits"):
        for r in ("cpu", "memory"):
            if r not in (res.get(kind) or {}):
                problem(f"{where}: resources.{kind}.{r} is missing")
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports") or [] if p.get("name")}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = (c.get(probe) or {}).get("httpGet")
        if get and isinstance(get.get("port"), str) and get["port"] not in ports:
            problem(f"{where}: {probe} uses port {get['port']!r}, which the container does not name")
    for m in c.get("volumeMounts") or []:
        if m["name"] not in pod_volumes:
            problem(f"{where}: volumeMount {m['name']!r} has no volume")
    for ef in c.get("envFrom") or []:
        ref = (ef.get("configMapRef") or {}).get("name")
        if ref and ref not in configmaps:
            problem(f"{where}: envFrom ConfigMap {ref!r} is not in the overlay")
    return ports


def prestop_sleep(c):
    return (((c.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}).get("seconds", 0)


def idemgate_args(c):
    args = c.get("args") or c.get("command") or []
    return args if c.get("image", "").split("/")[-1].split(":")[0] == "idemgate" else None


def check_manifests(overlay, path):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    configmaps = {d["metadata"]["name"]: d for d in by_kind.get("ConfigMap", [])}
    if by_kind.get("Secret"):
        problem(f"{overlay}: renders a Secret; Secrets are created out of band (secrets.example.yaml)")
    deployments = by_kind.get("Deployment", [])
    if not deployments:
        problem(f"{overlay}: no Deployment")
    pods = []  # (deployment name, template labels, named ports)
    for dep in deployments:
        name = f"{overlay}/Deployment/{dep['metadata']['name']}"
        spec = dep["spec"]
        tmpl = spec["template"]
        labels = tmpl["metadata"].get("labels") or {}
        if not matches(spec["selector"].get("matchLabels"), labels):
            problem(f"{name}: selector.matchLabels does not match the pod template labels")
        pod = tmpl["spec"]
        psc = pod.get("securityContext") or {}
        if psc.get("runAsNonRoot") is not True:
            problem(f"{name}: pod securityContext.runAsNonRoot must be true")
        if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            problem(f"{name}: pod seccompProfile must be RuntimeDefault")
        if pod.get("automountServiceAccountToken") is not False:
            problem(f"{name}: automountServiceAccountToken must be false")
        if pod.get("enableServiceLinks") is not False:
            problem(f"{name}: enableServiceLinks must be false (only IDEMGATE__* should configure idemgate)")
        ann = tmpl["metadata"].get("annotations") or {}
        if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/port") != "9090":
            problem(f"{name}: missing prometheus.io/scrape and prometheus.io/port: \"9090\" annotations")
        volumes = {}
        for v in pod.get("volumes") or []:
            volumes[v["name"]] = v
            cm = (v.get("configMap") or {}).get("name")
            if cm and cm not in configmaps:
                problem(f"{name}: volume {v['name']!r} uses ConfigMap {cm!r}, which is not in the overlay")
        grace = pod.get("terminationGracePeriodSeconds", 30)
        named_ports = {}
        # The kubelet stops native sidecars only after every regular container
        # has exited, so their preStop sleeps come first in the grace budget.
        app_prestop = max((prestop_sleep(c) for c in pod.get("containers") or [] if idemgate_args(c) is None),
                          default=0)
        for section in ("initContainers", "containers"):
            for c in pod.get(section) or []:
                where = f"{name}/{c['name']}"
                named_ports.update(check_container(where, c, volumes, configmaps))
                args = idemgate_args(c)
                if args is None:
                    continue
                if not args or args[0] not in ("serve", "relay", "migrate"):
                    problem(f"{where}: idemgate must run serve, relay or migrate, not {args!r}")
                    continue
                sidecar = section == "initContainers" and c.get("restartPolicy") == "Always"
                if section == "initContainers" and args[0] != "migrate" and not sidecar:
                    problem(f"{where}: {args[0]} never exits, so as an initContainer it needs restartPolicy: Always"
                            " (a native sidecar); otherwise the pod never gets past Init")
                    continue
                if (section == "initContainers" and not sidecar) or args[0] == "migrate":
                    continue
                others = [o for o in pod.get("containers") or [] if idemgate_args(o) is None]
                if section == "containers" and args[0] == "serve" and others:
                    problem(f"{where}: a gateway in a pod with {others[0]['name']!r} must be a native sidecar"
                            " (an initContainer with restartPolicy: Always), so that it starts before and"
                            " stops after the app")
                if sidecar and not (c.get("startupProbe") or {}).get("httpGet"):
                    problem(f"{where}: a native sidecar needs an httpGet startupProbe, or the app starts before"
                            " the gateway listens")
                ready = ((c.get("readinessProbe") or {}).get("httpGet") or {})
                live = ((c.get("livenessProbe") or {}).get("httpGet") or {})
                ports = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}
                for probe, want, got in (("readinessProbe", "/readyz", ready), ("livenessProbe", "/healthz", live)):
                    port = ports.get(got.get("port"), got.get("port"))
                    if got.get("path") != want or port != 9090:
                        problem(f"{where}: {probe} must be httpGet {want} on the admin port 9090")
                env = {e["name"]: e for e in c.get("env") or []}
                token = ((env.get("IDEMGATE__ADMIN__TOKEN") or {}).get("valueFrom") or {}).get("secretKeyRef")
                if not token:
                    problem(f"{where}: IDEMGATE__ADMIN__TOKEN must come from a Secret (secretKeyRef)")
                if args[0] == "relay":
                    db = ((env.get("IDEMGATE__RELAY__DATABASE_URL") or {}).get("valueFrom") or {}).get("secretKeyRef")
                    if not db:
                        problem(f"{where}: IDEMGATE__RELAY__DATABASE_URL must come from a Secret")
                if args[0] == "serve":
                    shutdown = 25.0
                    if "--config" in args:
                        cfg_path = args[args.index("--config") + 1]
                        cfg = config_for(pod, c, cfg_path, volumes, configmaps, where)
                        if cfg is not None:
                            shutdown = duration_seconds((cfg.get("gateway") or {}).get("shutdown_grace", "25s"))
                    pre = prestop_sleep(c)
                    before = app_prestop if sidecar else 0
                    if grace <= before + pre + shutdown:
                        first = f"the app's preStop sleep {before}s + " if sidecar else ""
                        problem(f"{where}: terminationGracePeriodSeconds {grace} must exceed {first}preStop sleep"
                                f" {pre}s + gateway.shutdown_grace {shutdown:g}s")
        pods.append((dep["metadata"]["name"], labels, named_ports, dep))
    for svc in by_kind.get("Service", []):
        name = f"{overlay}/Service/{svc['metadata']['name']}"
        hits = [p for p in pods if matches(svc["spec"].get("selector"), p[1])]
        if not hits:
            problem(f"{name}: selector matches no Deployment's pods")
        for port in svc["spec"]["ports"]:
            tp = port.get("targetPort", port["port"])
            for dep_name, _, named, _ in hits:
                if isinstance(tp, str) and tp not in named:
                    problem(f"{name}: targetPort {tp!r} is not a named port of Deployment {dep_name}")
                if tp in (9090, "admin") or named.get(tp) == 9090:
                    problem(f"{name}: exposes the admin port; scrape pods and port-forward instead")
    pdb_selectors = [d["spec"]["selector"].get("matchLabels") for d in by_kind.get("PodDisruptionBudget", [])]
    for sel in pdb_selectors:
        if not any(matches(sel, p[1]) for p in pods):
            problem(f"{overlay}: a PodDisruptionBudget selects no Deployment's pods")
    for dep_name, labels, _, dep in pods:
        if not any(matches(sel, labels) for sel in pdb_selectors):
            problem(f"{overlay}/Deployment/{dep_name}: no PodDisruptionBudget")
        if dep["spec"].get("replicas", 1) < 2:
            problem(f"{overlay}/Deployment/{dep_name}: fewer than 2 replicas")


def config_for(pod, c, cfg_path, volumes, configmaps, where):
    for m in c.get("volumeMounts") or []:
        mount = m["mountPath"].rstrip("/") + "/"
        if cfg_path.startswith(mount):
            cm_name = (volumes.get(m["name"], {}).get("configMap") or {}).get("name")
            key = cfg_path[len(mount):]
            data = (configmaps.get(cm_name) or {}).get("data") or {}
            if key not in data:
                problem(f"{where}: --config {cfg_path} is not a key of ConfigMap {cm_name!r}")
                return None
            try:
                return tomllib.loads(data[key])
            except tomllib.TOMLDecodeError as e:
                problem(f"{where}: {cfg_path} is not valid TOML: {e}")
                return None
    problem(f"{where}: --config {cfg_path} is not under a mounted volume")
    return None


def check_secrets_example(path):
    for d in yaml.safe_load_all(open(path)):
        if not d:
            continue
        if d.get("kind") != "Secret":
            problem(f"{path}: only Secrets belong here, found {d.get('kind')}")
            continue
        data = d.get("stringData") or {}
        if d.get("data"):
            problem(f"{path}: {d['metadata']['name']}: use stringData placeholders, not base64 data")
        for key, value in data.items():
            if "CHANGE-ME" not in value:
                problem(f"{path}: {d['metadata']['name']}.{key} must be an obvious placeholder (CHANGE-ME)")
        if d["metadata"]["name"] == "idemgate-admin" and len(data.get("token", "")) >= 16:
            problem(f"{path}: the placeholder admin token must be shorter than 16 characters so idemgate refuses it")


def check_compose(path):
    base = os.path.dirname(os.path.abspath(path))
    doc = yaml.safe_load(open(path))
    services = doc.get("services") or {}
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        for dep in deps if isinstance(deps, (list, dict)) else []:
            if dep not in services:
                problem(f"{path}: {name} depends on unknown service {dep!r}")
        for vol in svc.get("volumes") or []:
            src = vol.split(":")[0] if isinstance(vol, str) else vol.get("source", "")
            if src.startswith(("./", "../", "/")) and not os.path.exists(os.path.join(base, src)):
                problem(f"{path}: {name} mounts {src}, which does not exist")
        build = svc.get("build")
        if isinstance(build, dict):
            ctx = os.path.join(base, build.get("context", "."))
            if not os.path.exists(os.path.join(ctx, build.get("dockerfile", "Dockerfile"))):
                problem(f"{path}: {name}: build.dockerfile not found relative to build.context")
        cmd = svc.get("command") or []
        if svc.get("image", "").startswith("${IDEMGATE_IMAGE") and "--config" in cmd:
            target = cmd[cmd.index("--config") + 1]
            mounted = [v for v in svc.get("volumes") or [] if isinstance(v, str) and v.split(":")[1] == target]
            if not mounted:
                problem(f"{path}: {name}: --config {target} is not mounted")
    migrate = (services.get("relay") or {}).get("depends_on", {}).get("migrate", {})
    if migrate.get("condition") != "service_completed_successfully":
        problem(f"{path}: relay must wait for migrate with condition service_completed_successfully")


# What RELIABILITY.md requires of a Redis store: a record acknowledged is on
# disk (AOF, fsync always), and none is evicted (records carry TTLs).
REDIS_SETTINGS = {"appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "noeviction"}


def check_redis_settings(where, settings):
    for key, want in REDIS_SETTINGS.items():
        got = settings.get(key)
        if got != want:
            problem(f"{where}: Redis needs {key} {want} (RELIABILITY.md), "
                    + (f"not {got}" if got else "and does not set it"))


def check_redis(compose_path, example_path):
    services = (yaml.safe_load(open(compose_path)) or {}).get("services") or {}
    redis = [n for n, svc in services.items() if str(svc.get("image", "")).startswith("redis:")]
    if not redis:
        problem(f"{compose_path}: no redis:* service")
    for name in redis:
        cmd = services[name].get("command") or []
        if isinstance(cmd, str):
            cmd = cmd.split()
        flags = {a[2:]: b for a, b in zip(cmd, cmd[1:]) if a.startswith("--")}
        check_redis_settings(f"{compose_path}: {name}", flags)
    confs = [(d["metadata"]["name"], d.get("data", {}).get("redis.conf"))
             for d in yaml.safe_load_all(open(example_path)) if d and d.get("kind") == "ConfigMap"]
    if not any(text for _, text in confs):
        problem(f"{example_path}: no ConfigMap with a redis.conf key")
    for name, text in confs:
        if text:
            settings = {}
            for line in text.splitlines():
                words = line.split("#", 1)[0].split()
                if len(words) >= 2:
                    settings[words[0].lower()] = " ".join(words[1:])
            check_redis_settings(f"{example_path}: ConfigMap {name} redis.conf", settings)


def metric_names(root):
    text = open(os.path.join(root, "src", "metrics.rs")).read()
    return set(re.findall(r'"(idemgate_[a-z0-9_]+)"', text))


def used_metrics(text):
    names = set()
    for n in re.findall(r"\bidemgate_[a-z0-9_]+", text):
        names.add(re.sub(r"_(bucket|sum|count)$", "", n) if re.search(r"_seconds_(bucket|sum|count)$", n) else n)
    return names


def check_metrics(root):
    known = metric_names(root)
    if len(known) < 5:
        problem(f"{root}/src/metrics.rs: found only {sorted(known)}; has the file moved?")
        return
    files = ["deploy/prometheus/alerts.yml", "deploy/prometheus/alerts.test.yml", "deploy/grafana/idemgate-dashboard.json"]
    for rel in files:
        text = open(os.path.join(root, rel)).read()
        if rel.endswith(".yml"):
            # Alert names and runbook prose are not metric names; only expressions and series are.
            text = "\n".join(re.findall(r"(?:expr|series):.*(?:\n\s{10,}.*)*", text))
        for name in sorted(used_metrics(text) - known):
            problem(f"{rel}: uses {name}, which src/metrics.rs does not export")


def check_dashboard(path, out_rules):
    dash = json.load(open(path))
    ids = set()
    exprs = []
    for p in dash.get("panels", []):
        if p["id"] in ids:
            problem(f"{path}: duplicate panel id {p['id']}")
        ids.add(p["id"])
        g = p["gridPos"]
        if g["x"] + g["w"] > 24:
            problem(f"{path}: panel {p['title']!r} is wider than the 24-column grid")
        if p["type"] == "row":
            continue
        if (p.get("datasource") or {}).get("uid") != "${datasource}":
            problem(f"{path}: panel {p['title']!r} must use the ${{datasource}} variable")
        if not p.get("targets"):
            problem(f"{path}: panel {p['title']!r} has no query")
        for t in p.get("targets", []):
            exprs.append((p["title"], t["expr"]))
    variables = {v["name"] for v in dash.get("templating", {}).get("list", [])}
    for title, e in exprs:
        for v in re.findall(r"\$(\w+)", e):
            if v not in variables and not v.startswith("__"):
                problem(f"{path}: panel {title!r} uses undefined variable ${v}")
    rules = []
    for i, (title, e) in enumerate(exprs):
        concrete = e.replace("$__rate_interval", "5m")
        concrete = re.sub(r"\$\{?\w+\}?", ".*", concrete)
        rules.append({"record": f"dashboard:panel_{i}", "expr": concrete})
    with open(out_rules, "w") as f:
        yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}, f, sort_keys=False, width=1000)


def check_toml(paths):
    for p in paths:
        try:
            tomllib.load(open(p, "rb"))
        except tomllib.TOMLDecodeError as e:
            problem(f"{p}: {e}")


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd == "manifests":
        check_manifests(args[0], args[1])
    elif cmd == "secrets-example":
        check_secrets_example(args[0])
    elif cmd == "compose":
        check_compose(args[0])
    elif cmd == "redis":
        check_redis(args[0], args[1])
    elif cmd == "metrics":
        check_metrics(args[0])
    elif cmd == "dashboard":
        check_dashboard(args[0], args[1])
    elif cmd == "toml":
        check_toml(args)
    else:
        sys.exit(f"unknown check {cmd!r}\n{__doc__}")
    for p in PROBLEMS:
        print(f"FAIL {p}", file=sys.stderr)
    return 1 if PROBLEMS else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
