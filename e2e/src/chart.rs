//! The Helm chart `deploy/helm/das`, rendered by Helm (built from the Go module proxy into
//! `.local/bin/helm` by `make helm`), as objects the tests and the local cluster can use.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

pub use crate::binaries::helm_binary;
use crate::binaries::{KUBERNETES_VERSION, k8s_binary, k8s_version, kubectl_binary};
use crate::paths::workspace_root;

/// Release name used for every render.
pub const RELEASE: &str = "das";
/// The install namespace (docs/design.md §3).
pub const NAMESPACE: &str = "das-system";

/// `deploy/helm/das`.
pub fn chart_dir() -> PathBuf {
    workspace_root().join("deploy/helm/das")
}

/// A values file of the chart's `ci/` folder, e.g. `emulated-values.yaml`.
pub fn ci_values(name: &str) -> PathBuf {
    chart_dir().join("ci").join(name)
}

/// How to render: values files and `--set` overrides, for a Kubernetes version.
#[derive(Clone, Debug, Default)]
pub struct RenderOptions {
    pub values: Vec<PathBuf>,
    pub set: Vec<String>,
    /// `--kube-version`; default: the local cluster's version.
    pub kube_version: Option<String>,
    /// `--api-versions` (rendering only; `helm lint` has no such flag): API versions (or
    /// `group/version/Kind`) to render as present.
    pub api_versions: Vec<String>,
}

impl RenderOptions {
    pub fn with_values(file: impl Into<PathBuf>) -> Self {
        Self {
            values: vec![file.into()],
            ..Default::default()
        }
    }

    pub fn set(mut self, kv: &str) -> Self {
        self.set.push(kv.to_string());
        self
    }

    fn helm_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for v in &self.values {
            args.push(format!("--values={}", v.display()));
        }
        for s in &self.set {
            args.push(format!("--set={s}"));
        }
        args
    }
}

/// Runs helm with `args` against the cluster of `kubeconfig` (`helm install`, `upgrade`,
/// `uninstall`); its stdout, or an error with its stderr.
pub fn helm_on(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    all.push(format!("--kubeconfig={}", kubeconfig.display()));
    helm(&all)
}

/// Runs helm with `args`; its stdout, or an error with its stderr.
fn helm(args: &[String]) -> Result<String> {
    let bin = helm_binary();
    let out = Command::new(&bin)
        .args(args)
        .output()
        .with_context(|| format!("run {} (build it with `make helm`)", bin.display()))?;
    if !out.status.success() {
        // Only the subcommand: tests match the error against Helm's own message, which must
        // not be satisfied by an echo of the arguments.
        bail!(
            "helm {} failed: {}",
            args.first().map(String::as_str).unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// The YAML `helm template` prints for the chart with `opts`, in namespace [`NAMESPACE`].
pub fn render_yaml(opts: &RenderOptions) -> Result<String> {
    let kube_version = opts
        .kube_version
        .clone()
        // The version the local cluster runs (`K8S_VERSION`), as Helm asks a real cluster.
        .or_else(|| k8s_version(&k8s_binary()).ok())
        .filter(|v| v.starts_with("v1."))
        .unwrap_or_else(|| KUBERNETES_VERSION.to_string());
    let mut args = vec![
        "template".to_string(),
        RELEASE.into(),
        chart_dir().display().to_string(),
        format!("--namespace={NAMESPACE}"),
        format!("--kube-version={kube_version}"),
    ];
    args.extend(opts.helm_args());
    args.extend(
        opts.api_versions
            .iter()
            .map(|a| format!("--api-versions={a}")),
    );
    helm(&args)
}

/// The chart rendered as the local cluster uses it: `ci/emulated-values.yaml`.
pub fn render() -> Result<Rendered> {
    render_with(&[])
}

/// [`render`] with `--set` overrides `sets`, e.g. [`WHOLE_GPUS`].
pub fn render_with(sets: &[&str]) -> Result<Rendered> {
    let opts = sets.iter().fold(
        RenderOptions::with_values(ci_values("emulated-values.yaml")),
        |opts, s| opts.set(s),
    );
    Rendered::new(&opts)
}

/// The values that serve whole GPUs beside MIG slices (docs/design.md §7, "Whole GPUs"): the
/// DeviceClass `gpu.das.com`, `DAS_WHOLE_GPUS` on the plugin, and the webhook translating
/// `nvidia.com/gpu` (its flag, and such pods sent to it).
pub const WHOLE_GPUS: &[&str] = &["wholeGpus.enabled=true", "webhook.translateWholeGpus=true"];

/// The shared profiles `make demo` installs (`sharing.profiles`, docs/design.md §7, "Shared
/// slices" and "Memory slices of a whole GPU"): the `1g.5gb` slices of its A100s, for
/// docs/examples/07-shared-slice.yaml, and its whole GPUs by memory (its L4, for
/// docs/examples/08-memory-slices.yaml); needs [`WHOLE_GPUS`].
pub const DEMO_SHARING: &[&str] = &["sharing.profiles={1g.5gb,gpu}"];

/// [`WHOLE_GPUS`] and MIG mode following demand (docs/design.md §7, "MIG mode follows demand":
/// `--mig-mode-switching` on the plugin): Hopper GPUs are published whole and as every MIG
/// placement. What `make demo` installs (`das-cluster up --whole-gpus`).
pub const WHOLE_GPUS_SWITCHING: &[&str] = &[
    "wholeGpus.enabled=true",
    "wholeGpus.switchMigMode=true",
    "webhook.translateWholeGpus=true",
];

/// Where the plain manifests for users without Helm live, relative to the workspace root.
pub const MANIFESTS: &str = "deploy/manifests/das.yaml";

/// The plain manifests: the chart with its defaults except that cert-manager issues the
/// webhook's certificate (a generated one would put a private key into the file) and that the
/// chart renders the install namespace with its Pod Security labels (`namespace.create`; Helm
/// puts it first), for the oldest supported Kubernetes (nothing in the defaults depends on the
/// version). Deterministic, so a test can tell when the file is stale.
pub fn manifests() -> Result<String> {
    let opts = RenderOptions {
        kube_version: Some("v1.34.0".into()),
        ..Default::default()
    }
    .set("webhook.tls.mode=certManager")
    .set("namespace.create=true");
    let body = render_yaml(&opts)?;
    Ok(format!(
        "# DAS without Helm: `kubectl apply --server-side -f {MANIFESTS}`.\n\
         # Generated from deploy/helm/das by `make manifests`; do not edit. Needs cert-manager for\n\
         # the webhook's certificate; use the Helm chart to change any value.\n{body}"
    ))
}

/// `helm lint --strict` with `opts`: Ok, or the linter's findings.
pub fn lint(opts: &RenderOptions) -> Result<String> {
    let mut args = vec![
        "lint".to_string(),
        "--strict".into(),
        chart_dir().display().to_string(),
        format!("--namespace={NAMESPACE}"),
    ];
    args.extend(opts.helm_args());
    helm(&args)
}

/// The chart rendered: every object, in the order Helm printed them.
#[derive(Clone, Debug)]
pub struct Rendered {
    pub objects: Vec<Value>,
}

impl Rendered {
    /// Renders the chart with `opts`.
    pub fn new(opts: &RenderOptions) -> Result<Self> {
        Self::parse(&render_yaml(opts)?)
    }

    /// Parses a multi-document YAML stream; empty documents are skipped.
    pub fn parse(yaml: &str) -> Result<Self> {
        use serde::Deserialize;
        let mut objects = Vec::new();
        for doc in serde_yaml::Deserializer::from_str(yaml) {
            let v = Value::deserialize(doc).context("rendered chart is not valid YAML")?;
            if !v.is_null() {
                objects.push(v);
            }
        }
        Ok(Self { objects })
    }

    /// Every object of `kind`.
    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects.iter().filter(move |o| o["kind"] == kind)
    }

    /// The object of `kind` named `name`, if rendered.
    pub fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    /// The object of `kind` named `name`, or an error naming what is missing.
    pub fn get(&self, kind: &str, name: &str) -> Result<&Value> {
        self.find(kind, name)
            .with_context(|| format!("the chart renders no {kind} {name}"))
    }

    /// The first container of the pod template of workload `kind`/`name`.
    pub fn container(&self, kind: &str, name: &str) -> Result<&Value> {
        let c = &self.get(kind, name)?["spec"]["template"]["spec"]["containers"][0];
        if c.is_null() {
            bail!("{kind} {name} has no container");
        }
        Ok(c)
    }

    /// The objects as one YAML stream (for `kubectl apply -f`).
    pub fn to_yaml<'a>(objects: impl IntoIterator<Item = &'a Value>) -> Result<String> {
        let mut out = String::new();
        for o in objects {
            out.push_str("---\n");
            out.push_str(&serde_yaml::to_string(o)?);
        }
        Ok(out)
    }
}

/// What a container's `fieldRef` environment variables resolve to: the facts of the pod the
/// harness stands in for (the downward API).
#[derive(Clone, Debug, Default)]
pub struct PodFacts {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub node_name: String,
    pub service_account: String,
}

/// The environment of `container` as the kubelet would give it for a pod with `facts`, then
/// `overrides` (name, value) applied. Every override must name a variable the chart sets, so the
/// harness cannot drift from the chart unnoticed; `extra` adds variables the chart does not
/// set (e.g. `KUBECONFIG` in place of the in-cluster configuration).
pub fn container_env(
    container: &Value,
    facts: &PodFacts,
    overrides: &[(&str, String)],
    extra: &[(&str, String)],
) -> Result<Vec<(String, String)>> {
    let mut env = Vec::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().context("env entry without a name")?;
        let value = if let Some(v) = e["value"].as_str() {
            v.to_string()
        } else if let Some(path) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            match path {
                "metadata.name" => facts.name.clone(),
                "metadata.namespace" => facts.namespace.clone(),
                "metadata.uid" => facts.uid.clone(),
                "spec.nodeName" => facts.node_name.clone(),
                "spec.serviceAccountName" => facts.service_account.clone(),
                other => bail!("env {name}: fieldRef {other} is not emulated by the harness"),
            }
        } else {
            bail!("env {name}: only `value` and `fieldRef` are emulated by the harness: {e}");
        };
        env.push((name.to_string(), value));
    }
    for (name, value) in overrides {
        let Some(slot) = env.iter_mut().find(|(n, _)| n == name) else {
            bail!(
                "the chart no longer sets {name} in container {}: update das-e2e's install",
                container["name"]
            );
        };
        slot.1 = value.clone();
    }
    env.extend(extra.iter().map(|(n, v)| (n.to_string(), v.clone())));
    Ok(env)
}

/// The value of environment variable `name` in rendered `container` (a literal `value`; `None`
/// when absent or set from a source).
pub fn env_of(container: &Value, name: &str) -> Option<String> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
        .map(str::to_string)
}

/// The container's `args` (strings).
pub fn container_args(container: &Value) -> Vec<String> {
    container["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect()
}

/// `kubectl apply --server-side` (field manager `das-e2e`) of `objects`; kubectl's output.
///
/// # Errors
/// kubectl fails (the message has its output).
pub fn apply<'a>(
    kubeconfig: &Path,
    objects: impl IntoIterator<Item = &'a Value>,
) -> Result<String> {
    let yaml = Rendered::to_yaml(objects)?;
    kubectl(
        kubeconfig,
        &[APPLY[0], APPLY[1], APPLY[2], "-f", "-"],
        Some(&yaml),
    )
}

/// [`apply`] of the manifests in `path`, a file or a directory.
///
/// # Errors
/// kubectl fails, or the path is not UTF-8.
pub fn apply_path(kubeconfig: &Path, path: &Path) -> Result<String> {
    let path = path.to_str().context("a non-UTF-8 manifest path")?;
    kubectl(
        kubeconfig,
        &[APPLY[0], APPLY[1], APPLY[2], "-f", path],
        None,
    )
}

const APPLY: [&str; 3] = ["apply", "--server-side", "--field-manager=das-e2e"];

/// Runs `kubectl` from `.local/bin` against `kubeconfig` with `args`, feeding `stdin`; its
/// stdout, or an error with its stderr.
pub fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Result<String> {
    use std::io::Write;
    use std::process::Stdio;
    let bin = kubectl_binary();
    let mut child = Command::new(&bin)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("run {}", bin.display()))?;
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .context("kubectl stdin")?
            .write_all(input.as_bytes())?;
    }
    drop(child.stdin.take());
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn env_resolves_field_refs_and_applies_overrides() {
        let c = json!({"name": "plugin", "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "CDI_DIR", "value": "/var/run/cdi"},
        ]});
        let facts = PodFacts {
            uid: "u-1".into(),
            node_name: "n0".into(),
            ..Default::default()
        };
        let env = container_env(
            &c,
            &facts,
            &[("CDI_DIR", "/tmp/cdi".into())],
            &[("KUBECONFIG", "/k".into())],
        )
        .unwrap();
        assert_eq!(
            env,
            vec![
                ("NODE_NAME".into(), "n0".into()),
                ("POD_UID".into(), "u-1".into()),
                ("CDI_DIR".into(), "/tmp/cdi".into()),
                ("KUBECONFIG".into(), "/k".into()),
            ]
        );
    }

    #[test]
    fn overriding_a_variable_the_chart_does_not_set_is_an_error() {
        let c = json!({"name": "plugin", "env": [{"name": "A", "value": "1"}]});
        let err = container_env(&c, &PodFacts::default(), &[("B", "2".into())], &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("no longer sets B"), "{err}");
    }

    #[test]
    fn secrets_in_env_are_not_silently_dropped() {
        let c = json!({"name": "x", "env": [
            {"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]});
        assert!(container_env(&c, &PodFacts::default(), &[], &[]).is_err());
    }

    #[test]
    fn multi_document_yaml_skips_empty_documents() {
        let r = Rendered::parse("---\n# c\n---\nkind: A\nmetadata: {name: a}\n---\n").unwrap();
        assert_eq!(r.objects.len(), 1);
        assert!(r.find("A", "a").is_some());
        assert!(r.get("A", "b").is_err());
    }
}
