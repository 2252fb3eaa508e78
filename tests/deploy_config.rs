//! The Kubernetes manifests agree with the broker: the ConfigMap's TOML
//! (deploy/k8s/base/agui-fanout.toml) loads with the broker's own loader (unknown keys are
//! refused at start-up, so a typo there would crash every pod), and the pod's termination grace
//! period covers the preStop sleep plus the broker's drain (PROTOCOL §9).

use agui_fanout::config::{Config, Overrides};
use std::path::Path;
use std::time::Duration;

fn deploy_file(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The integer after `key:` on the first line that has it (the manifests are plain YAML with
/// one key per line).
fn yaml_int(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{key} <int>` line"))
}

/// Loads the ConfigMap's TOML as a pod does: with the auth key of the Secret in the environment.
// figment's own error type is large; the project's config tests allow it the same way.
#[allow(clippy::result_large_err)]
fn load_as_pod(env: &[(String, String)]) -> Config {
    let path = deploy_file("deploy/k8s/base/agui-fanout.toml");
    let mut out = None;
    figment::Jail::expect_with(|jail| {
        jail.set_env("AGUI_AUTH__HS256_SECRET", "k".repeat(32));
        for (k, v) in env {
            jail.set_env(k, v);
        }
        out = Some(Config::load(Some(&path), &Overrides::default()).map_err(|e| e.to_string())?);
        Ok(())
    });
    out.expect("set in the jail")
}

#[test]
fn configmap_toml_loads_and_needs_the_secret_key() {
    let c = load_as_pod(&[]);
    assert_eq!(c.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(c.redis_url, "redis://redis:6379");
    // Without the Secret's key the broker refuses the non-loopback address (PROTOCOL §8): the
    // Deployment must provide AGUI_AUTH__HS256_SECRET, and does.
    let mut without_key = c.clone();
    without_key.auth.hs256_secret.clear();
    assert!(without_key.validate().is_err());
    let deployment =
        std::fs::read_to_string(deploy_file("deploy/k8s/base/deployment.yaml")).expect("read");
    assert!(deployment.contains("name: AGUI_AUTH__HS256_SECRET"));
}

#[test]
fn grace_period_covers_prestop_and_drain() {
    let c = load_as_pod(&[]);
    let deployment =
        std::fs::read_to_string(deploy_file("deploy/k8s/base/deployment.yaml")).expect("read");
    let grace = Duration::from_secs(yaml_int(&deployment, "terminationGracePeriodSeconds:"));
    let pre_stop = Duration::from_secs(yaml_int(&deployment, "seconds:"));
    // After the drain, in-flight requests get at most 5 s more before the process exits.
    let exit_after = pre_stop + c.shutdown.drain + Duration::from_secs(5);
    assert!(
        grace > exit_after,
        "terminationGracePeriodSeconds {grace:?} must exceed preStop + drain + 5 s = {exit_after:?}"
    );
}

/// The literal `env:` values of a manifest (`- name: K` followed by `value: V`).
fn env_values(manifest: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = manifest.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter_map(|w| {
            let name = w[0].strip_prefix("- name: ")?;
            let value = w[1].strip_prefix("value: ")?;
            Some((name.to_string(), value.trim_matches('\'').to_string()))
        })
        .collect()
}

/// The environment the overlays add parses too (an unknown `AGUI_SSE__…` key would stop every
/// pod at start-up).
#[test]
fn overlay_environments_load() {
    for overlay in ["dev", "production"] {
        let patch = std::fs::read_to_string(deploy_file(&format!(
            "deploy/k8s/overlays/{overlay}/deployment-patch.yaml"
        )))
        .expect("read");
        let mut env = env_values(&patch);
        assert!(!env.is_empty(), "{overlay}: env values found");
        if overlay == "production" {
            // The URL comes from the Secret (valueFrom); production's is a rediss:// URL.
            env.push((
                "AGUI_REDIS_URL".into(),
                "rediss://redis.example:6380".into(),
            ));
        }
        let c = load_as_pod(&env);
        if overlay == "production" {
            assert_eq!(c.sse.max_stream_age, Some(Duration::from_secs(1800)));
            assert!(
                !c.redis_tls_ca.is_empty(),
                "production names the Redis CA (AGUI_REDIS_TLS_CA)"
            );
        } else {
            assert_eq!(c.cors.allow_origins.len(), 3);
        }
    }
}
