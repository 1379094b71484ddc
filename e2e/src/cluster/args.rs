//! The flags of the control plane's components: kube-apiserver's, its kubelet client's, the
//! feature gates a Kubernetes version needs, and kube-scheduler's configuration file.

use crate::pki::CertFiles;

/// A KubeSchedulerConfiguration (JSON, which kube-scheduler reads as YAML) with `profiles` and the
/// settings the harness's scheduler flags give without one.
pub(super) fn scheduler_config(
    kubeconfig: &str,
    profiles: &serde_json::Value,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig, "qps": 100, "burst": 200},
        "leaderElection": {"leaderElect": false},
        "profiles": profiles,
    })
}

/// The feature gates the control plane of Kubernetes 1.`minor` needs for DAS, as the README's
/// compatibility table tells users (shared counters, `DRAPartitionableDevices`, are alpha and
/// off before 1.36), then `extra` (`Name=bool`, a test's own), as one `--feature-gates` flag.
pub(super) fn feature_gates(minor: u32, extra: &[String]) -> Vec<String> {
    let mut gates: Vec<String> = if minor < 36 {
        vec!["DRAPartitionableDevices=true".into()]
    } else {
        Vec::new()
    };
    gates.extend_from_slice(extra);
    if gates.is_empty() {
        Vec::new()
    } else {
        vec![format!("--feature-gates={}", gates.join(","))]
    }
}

/// How the API server reaches kubelets: with its kubelet-client certificate, at the node's
/// InternalIP (node names do not resolve here).
pub(super) fn kubelet_client_args(creds: &CertFiles) -> Vec<String> {
    vec![
        format!("--kubelet-client-certificate={}", creds.cert.display()),
        format!("--kubelet-client-key={}", creds.key.display()),
        "--kubelet-preferred-address-types=InternalIP".into(),
    ]
}

pub(super) fn apiserver_args(
    etcd_url: &str,
    port: u16,
    ca: &CertFiles,
    serving: &CertFiles,
    sa: &CertFiles,
    host_ip: Option<std::net::IpAddr>,
) -> Vec<String> {
    let address = match host_ip {
        // Pods reach the API server through the `kubernetes` Service, whose endpoint is the
        // advertised address (kept by the lease endpoint reconciler).
        Some(ip) => vec![
            "--bind-address=0.0.0.0".to_string(),
            format!("--advertise-address={ip}"),
        ],
        // No routable address here: loopback cannot go into Endpoints.
        None => vec![
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            "--endpoint-reconciler-type=none".into(),
        ],
    };
    let mut args = vec![
        "kube-apiserver".into(),
        format!("--etcd-servers={etcd_url}"),
        format!("--secure-port={port}"),
        format!("--tls-cert-file={}", serving.cert.display()),
        format!("--tls-private-key-file={}", serving.key.display()),
        format!("--client-ca-file={}", ca.cert.display()),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-account-key-file={}", sa.cert.display()),
        format!("--service-account-signing-key-file={}", sa.key.display()),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--authorization-mode=Node,RBAC".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
        "--allow-privileged=true".into(),
        "--enable-priority-and-fairness=false".into(),
        "--profiling=false".into(),
    ];
    args.extend(address);
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_config_keeps_the_profiles_and_the_flags_settings() {
        let profiles = serde_json::json!([{"schedulerName": "default-scheduler",
            "pluginConfig": [{"name": "NodeResourcesFit", "args": {}}]}]);
        let c = scheduler_config("/tmp/a b/kubeconfig", &profiles);
        assert_eq!(c["kind"], "KubeSchedulerConfiguration");
        assert_eq!(c["clientConnection"]["kubeconfig"], "/tmp/a b/kubeconfig");
        assert_eq!(c["leaderElection"]["leaderElect"], false);
        assert_eq!(c["profiles"], profiles);
    }

    #[test]
    fn gates_follow_the_minor_version() {
        assert_eq!(
            feature_gates(34, &[]),
            ["--feature-gates=DRAPartitionableDevices=true"]
        );
        assert!(feature_gates(36, &[]).is_empty());
        let off = ["DRAResourceClaimGranularStatusAuthorization=false".to_string()];
        assert_eq!(
            feature_gates(34, &off),
            [
                "--feature-gates=DRAPartitionableDevices=true,DRAResourceClaimGranularStatusAuthorization=false"
            ]
        );
        assert_eq!(
            feature_gates(37, &off),
            ["--feature-gates=DRAResourceClaimGranularStatusAuthorization=false"]
        );
    }
}
