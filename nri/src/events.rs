//! Kubernetes Events for what the plugin lets run without its GPUs (fail-open) or stops
//! (`--mandatory`): a Warning on the pod, seen in `kubectl describe pod` and `kubectl get
//! events`, beside the plugin's own log line.
//!
//! One request kind (POST of a core/v1 Event), sent with a small blocking client (`ureq` on
//! rustls with ring) rather than kube-rs: that would bring an async runtime, hyper, tower and
//! the generated API types into a daemon whose memory goal is 20 MiB (issue 40).
//!
//! Posting never holds up the engine's request: [`Events::warn`] only puts the event on a
//! bounded queue that one thread drains, with short timeouts; a full queue drops the event,
//! counted in the log.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;
use thiserror::Error;
use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig, TlsProvider};

/// Where a pod's service account is mounted (in-cluster credentials) unless told otherwise.
pub const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Events waiting for the posting thread; more are dropped.
const QUEUE: usize = 64;

/// The API server's limit on an event's message (events.k8s.io's `note`: 1 kB).
const MESSAGE_MAX: usize = 1024;

#[derive(Debug, Error)]
pub enum EventsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("kubeconfig {path}: {why}")]
    Kubeconfig { path: PathBuf, why: String },
    #[error("kubeconfig {path}: user {user} authenticates with {how}, which nvshim-nri does not run; give it a token, tokenFile or client certificate (the node's /etc/kubernetes/kubelet.conf has one), or run it in-cluster with its service account")]
    Plugin {
        path: PathBuf,
        user: String,
        how: &'static str,
    },
    #[error("the {what} for {server}: {source}")]
    Pem {
        what: &'static str,
        server: String,
        source: ureq::Error,
    },
    #[error("the client certificate for {server} cannot be used: {why}; it must be an X.509 v3 certificate (as Kubernetes issues them) whose key is the kubeconfig's client-key")]
    ClientCert { server: String, why: String },
    #[error("cannot start the thread that posts Kubernetes events: {0}")]
    Thread(std::io::Error),
}

/// Why the pod gets a warning: the Event's `reason`, CamelCase as the kubelet's are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Fail-open: the container runs without device nodes its request names.
    GpusMissing,
    /// `--mandatory`: the engine was told not to start the container.
    GpuRequestRefused,
    /// `--mandatory`: a container found running without its GPUs was stopped.
    ContainerStoppedWithoutGpus,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::GpusMissing => "GPUsMissing",
            Reason::GpuRequestRefused => "GPURequestRefused",
            Reason::ContainerStoppedWithoutGpus => "ContainerStoppedWithoutGPUs",
        }
    }
}

/// The pod (and container) an event is about, as the NRI `PodSandbox` names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The container's name in the pod spec, where known.
    pub container: Option<String>,
}

/// An event before it is posted.
#[derive(Debug, Clone)]
pub struct Event {
    pub pod: Pod,
    pub reason: Reason,
    pub message: String,
    pub time: SystemTime,
}

impl Event {
    /// The core/v1 Event as the API server takes it; `node`: source.host and the reporting
    /// instance. Named `<pod>.<time in hex nanoseconds>` as client-go's recorder names them.
    pub fn body(&self, node: &str) -> serde_json::Value {
        let nanos = self
            .time
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let time = humantime::format_rfc3339_seconds(self.time).to_string();
        let mut message = self.message.as_str();
        if message.len() > MESSAGE_MAX {
            let mut end = MESSAGE_MAX;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message = &message[..end];
        }
        let mut involved = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": self.pod.namespace,
            "name": self.pod.name,
            "uid": self.pod.uid,
        });
        if let Some(c) = &self.pod.container {
            involved["fieldPath"] = json!(format!("spec.containers{{{c}}}"));
        }
        json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": format!("{}.{nanos:x}", self.pod.name),
                "namespace": self.pod.namespace,
            },
            "involvedObject": involved,
            "reason": self.reason.name(),
            "message": message,
            "type": "Warning",
            "source": { "component": "nvshim-nri", "host": node },
            "reportingComponent": "nvshim-nri",
            "reportingInstance": node,
            "firstTimestamp": time,
            "lastTimestamp": time,
            "count": 1,
        })
    }
}

/// How requests prove who they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// A bearer token read again for every post (a projected service-account token rotates).
    TokenFile(PathBuf),
    Token(String),
    /// PEM: the certificate (chain) and the key.
    ClientCert {
        cert: Vec<u8>,
        key: Vec<u8>,
    },
    None,
}

/// An API server and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiServer {
    /// `https://host:port`, no trailing slash.
    pub server: String,
    /// PEM certificates the server's is checked against.
    pub ca: Vec<u8>,
    pub auth: Auth,
}

impl ApiServer {
    /// In a pod with a service account (the DaemonSet): the environment the kubelet sets and
    /// the token and CA in `dir`; `None` elsewhere.
    pub fn in_cluster(dir: &Path) -> Option<Result<ApiServer, EventsError>> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").ok()?;
        let token = dir.join("token");
        if !token.exists() {
            return None;
        }
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        Some(read(&dir.join("ca.crt")).map(|ca| ApiServer {
            server: format!("https://{host}:{port}"),
            ca,
            auth: Auth::TokenFile(token),
        }))
    }

    /// The current context of a kubeconfig; relative file names are relative to its
    /// directory, as kubectl takes them.
    pub fn from_kubeconfig(path: &Path) -> Result<ApiServer, EventsError> {
        let text = read(path)?;
        parse_kubeconfig(&text, path)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, EventsError> {
    std::fs::read(path).map_err(|source| EventsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

#[derive(Deserialize)]
struct Kubeconfig {
    #[serde(rename = "current-context", default)]
    current_context: String,
    #[serde(default)]
    clusters: Vec<Named<Cluster>>,
    #[serde(default)]
    contexts: Vec<Named<Context>>,
    #[serde(default)]
    users: Vec<Named<User>>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "context", alias = "user")]
    value: T,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Cluster {
    server: String,
    certificate_authority: Option<PathBuf>,
    certificate_authority_data: Option<String>,
}

#[derive(Deserialize)]
struct Context {
    cluster: String,
    user: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct User {
    client_certificate: Option<PathBuf>,
    client_certificate_data: Option<String>,
    client_key: Option<PathBuf>,
    client_key_data: Option<String>,
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<PathBuf>,
    exec: Option<serde_yaml::Value>,
    auth_provider: Option<serde_yaml::Value>,
}

/// The current context of the kubeconfig `text`, read from `path`.
pub fn parse_kubeconfig(text: &[u8], path: &Path) -> Result<ApiServer, EventsError> {
    let bad = |why: String| EventsError::Kubeconfig {
        path: path.to_path_buf(),
        why,
    };
    let doc: Kubeconfig = serde_yaml::from_slice(text).map_err(|e| bad(e.to_string()))?;
    let find = |what: &str, name: &str| bad(format!("no {what} named {name:?}"));
    let context = doc
        .contexts
        .iter()
        .find(|c| c.name == doc.current_context)
        .ok_or_else(|| find("context", &doc.current_context))?;
    let cluster = doc
        .clusters
        .iter()
        .find(|c| c.name == context.value.cluster)
        .ok_or_else(|| find("cluster", &context.value.cluster))?;
    let user = doc
        .users
        .iter()
        .find(|u| u.name == context.value.user)
        .ok_or_else(|| find("user", &context.value.user))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let data = |field: &str, file: &Option<PathBuf>, inline: &Option<String>| match (inline, file) {
        (Some(b64), _) => base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map(Some)
            .map_err(|e| bad(format!("{field}-data is not base64: {e}"))),
        (None, Some(f)) => read(&dir.join(f)).map(Some),
        (None, None) => Ok(None),
    };
    let c = &cluster.value;
    let ca = data(
        "certificate-authority",
        &c.certificate_authority,
        &c.certificate_authority_data,
    )?
    .ok_or_else(|| {
        bad(format!(
            "cluster {:?} names no certificate-authority",
            cluster.name
        ))
    })?;
    let u = &user.value;
    let refuse = |how| EventsError::Plugin {
        path: path.to_path_buf(),
        user: user.name.clone(),
        how,
    };
    if u.exec.is_some() {
        return Err(refuse("an exec plugin"));
    }
    if u.auth_provider.is_some() {
        return Err(refuse("an auth-provider"));
    }
    let cert = data(
        "client-certificate",
        &u.client_certificate,
        &u.client_certificate_data,
    )?;
    let key = data("client-key", &u.client_key, &u.client_key_data)?;
    let auth = match (cert, key, &u.token, &u.token_file) {
        (Some(cert), Some(key), _, _) => Auth::ClientCert { cert, key },
        (Some(_), None, _, _) | (None, Some(_), _, _) => {
            return Err(bad(format!(
                "user {:?} has a client certificate or key without the other",
                user.name
            )))
        }
        (None, None, Some(token), _) => Auth::Token(token.clone()),
        (None, None, None, Some(file)) => Auth::TokenFile(dir.join(file)),
        (None, None, None, None) => Auth::None,
    };
    Ok(ApiServer {
        server: c.server.trim_end_matches('/').to_string(),
        ca,
        auth,
    })
}

/// The sink the plugin's handler warns into; cheap to clone.
#[derive(Clone)]
pub struct Events {
    queue: SyncSender<Event>,
    dropped: Arc<AtomicU64>,
}

impl Events {
    /// Starts the posting thread. Certificates are checked here, so that a broken one is an
    /// error at start rather than one per event.
    pub fn start(api: ApiServer, node: String) -> Result<Events, EventsError> {
        let agent = agent(&api)?;
        let (queue, rx) = mpsc::sync_channel::<Event>(QUEUE);
        std::thread::Builder::new()
            .name("kube-events".into())
            .spawn(move || {
                for event in rx {
                    if let Err(e) = post(&agent, &api, &node, &event) {
                        tracing::warn!(
                            "cannot post the {} event for pod {}/{} to {}: {e}",
                            event.reason.name(),
                            event.pod.namespace,
                            event.pod.name,
                            api.server
                        );
                    }
                }
            })
            .map_err(EventsError::Thread)?;
        Ok(Events {
            queue,
            dropped: Arc::default(),
        })
    }

    /// Queues a Warning on `pod`; never waits.
    pub fn warn(&self, pod: Pod, reason: Reason, message: &str) {
        let event = Event {
            pod,
            reason,
            message: message.to_string(),
            time: SystemTime::now(),
        };
        match self.queue.try_send(event) {
            Ok(()) => {}
            Err(TrySendError::Full(e)) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(
                    "Kubernetes event {} for pod {}/{} dropped: {QUEUE} waiting ({n} dropped so far)",
                    e.reason.name(),
                    e.pod.namespace,
                    e.pod.name
                );
            }
            Err(TrySendError::Disconnected(_)) => {
                tracing::warn!("Kubernetes events: the posting thread is gone");
            }
        }
    }
}

fn agent(api: &ApiServer) -> Result<ureq::Agent, EventsError> {
    let pem_err = |what| {
        move |source| EventsError::Pem {
            what,
            server: api.server.clone(),
            source,
        }
    };
    let mut roots = Vec::new();
    for item in ureq::tls::parse_pem(&api.ca) {
        if let PemItem::Certificate(c) = item.map_err(pem_err("CA certificates"))? {
            roots.push(c);
        }
    }
    let client_cert = match &api.auth {
        Auth::ClientCert { cert, key } => {
            let chain = ureq::tls::parse_pem(cert)
                .filter_map(|i| match i {
                    Ok(PemItem::Certificate(c)) => Some(Ok(c)),
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(pem_err("client certificate"))?;
            let key = PrivateKey::from_pem(key).map_err(pem_err("client key"))?;
            check_client_cert(&chain, &key).map_err(|why| EventsError::ClientCert {
                server: api.server.clone(),
                why,
            })?;
            Some(ClientCert::new_with_certs(&chain, key))
        }
        _ => None,
    };
    let tls = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .root_certs(RootCerts::new_with_certs(&roots))
        .client_cert(client_cert)
        .build();
    Ok(ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(2)))
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into())
}

/// What rustls, under ureq, checks of a client certificate when it first connects, checked
/// here: ureq's connector panics on a certificate rustls refuses (a v1 certificate, a key
/// that is not the certificate's).
fn check_client_cert(
    chain: &[Certificate<'static>],
    key: &PrivateKey<'static>,
) -> Result<(), String> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = chain
        .iter()
        .map(|c| CertificateDer::from(c.der().to_vec()))
        .collect();
    let key = PrivateKeyDer::try_from(key.der().to_vec()).map_err(str::to_string)?;
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_client_auth_cert(chain, key)
        .map(drop)
        .map_err(|e| e.to_string())
}

fn post(agent: &ureq::Agent, api: &ApiServer, node: &str, event: &Event) -> Result<(), String> {
    let url = format!(
        "{}/api/v1/namespaces/{}/events",
        api.server, event.pod.namespace
    );
    let token = match &api.auth {
        Auth::TokenFile(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read the token {}: {e}", path.display()))?
                .trim()
                .to_string(),
        ),
        Auth::Token(t) => Some(t.clone()),
        _ => None,
    };
    let body = serde_json::to_vec(&event.body(node)).map_err(|e| e.to_string())?;
    let mut req = agent
        .post(&url)
        .content_type("application/json")
        .header("Accept", "application/json");
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let mut resp = req.send(&body[..]).map_err(|e| e.to_string())?;
    let status = resp.status();
    if status.is_success() {
        tracing::debug!("posted a {} event: {status}", event.reason.name());
        return Ok(());
    }
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    Err(format!("{status}: {}", text.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> Event {
        Event {
            pod: Pod {
                namespace: "team-a".into(),
                name: "trainer-0".into(),
                uid: "1f0c3b8e-6a4e-4d2a-9c55-3f1e0b7a9d21".into(),
                container: Some("cuda".into()),
            },
            reason: Reason::GpusMissing,
            message: "nvshim: container cuda (0123456789ab) at Synchronize: it lacks device nodes"
                .into(),
            time: UNIX_EPOCH + Duration::from_secs(1_795_000_000),
        }
    }

    #[test]
    fn event_body_names_the_pod_and_container() {
        let b = event().body("node-1");
        assert_eq!(b["kind"], "Event");
        assert_eq!(b["type"], "Warning");
        assert_eq!(b["reason"], "GPUsMissing");
        assert_eq!(b["metadata"]["namespace"], "team-a");
        // client-go's recorder: `<object name>.<UnixNano in hex>`.
        assert_eq!(b["metadata"]["name"], "trainer-0.18e91efd5bd38000");
        let o = &b["involvedObject"];
        assert_eq!(o["kind"], "Pod");
        assert_eq!(o["namespace"], "team-a");
        assert_eq!(o["name"], "trainer-0");
        assert_eq!(o["uid"], "1f0c3b8e-6a4e-4d2a-9c55-3f1e0b7a9d21");
        assert_eq!(o["fieldPath"], "spec.containers{cuda}");
        assert_eq!(b["source"]["component"], "nvshim-nri");
        assert_eq!(b["source"]["host"], "node-1");
        assert_eq!(b["reportingInstance"], "node-1");
        assert_eq!(b["firstTimestamp"], "2026-11-18T11:06:40Z");
        assert_eq!(b["lastTimestamp"], b["firstTimestamp"]);
        assert_eq!(b["count"], 1);
        assert!(b.get("eventTime").is_none());
    }

    #[test]
    fn event_body_without_container_or_long_message() {
        let mut e = event();
        e.pod.container = None;
        e.message = "é".repeat(600);
        let b = e.body("n");
        assert!(b["involvedObject"].get("fieldPath").is_none());
        let m = b["message"].as_str().unwrap();
        assert_eq!(m.len(), 1024);
    }

    /// Shaped as kubeadm writes /etc/kubernetes/kubelet.conf: inline CA, the rotated client
    /// certificate and key in one file under /var/lib/kubelet/pki.
    const KUBELET_CONF: &str = "apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
    server: https://10.0.0.10:6443/
  name: kubernetes
contexts:
- context:
    cluster: kubernetes
    user: system:node:node-1
  name: system:node:node-1@kubernetes
current-context: system:node:node-1@kubernetes
kind: Config
preferences: {}
users:
- name: system:node:node-1
  user:
    client-certificate: pki/kubelet-client-current.pem
    client-key: pki/kubelet-client-current.pem
";

    #[test]
    fn kubeconfig_as_kubeadm_writes_kubelet_conf() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("pki")).unwrap();
        std::fs::write(dir.path().join("pki/kubelet-client-current.pem"), b"PEM").unwrap();
        let path = dir.path().join("kubelet.conf");
        let api = parse_kubeconfig(KUBELET_CONF.as_bytes(), &path).unwrap();
        assert_eq!(api.server, "https://10.0.0.10:6443");
        assert_eq!(api.ca, b"-----BEGIN CERTIFICATE-----\n");
        assert_eq!(
            api.auth,
            Auth::ClientCert {
                cert: b"PEM".to_vec(),
                key: b"PEM".to_vec()
            }
        );
    }

    /// A throwaway self-signed X.509 v1 certificate and its key (`openssl x509 -req
    /// -signkey`, no extensions: v1), as a hand-made client certificate may be.
    const V1_CERT_AND_KEY: &str = "-----BEGIN CERTIFICATE-----\n\
MIIBIzCBywIUHMcKnqUHfRwpO0d7kXe780DinewwCgYIKoZIzj0EAwIwFDESMBAG\n\
A1UEAwwJdjEtY2xpZW50MCAXDTI2MTEyODE3MjQzMFoYDzIxMjYxMTA0MTcyNDMw\n\
WjAUMRIwEAYDVQQDDAl2MS1jbGllbnQwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNC\n\
AAQIZA2JYczavp8fM85zUaHJbkeWxI6M9r7fk4A26kGOjMLDWr6Qkmbl/+7/wZV9\n\
jbCiCk6WYodqHUvAJ9KGtyGjMAoGCCqGSM49BAMCA0cAMEQCIF4A+Gs/gGul72FF\n\
7k9zSDvg8rbLZK/hyAxN6fXAExsrAiBkpTyXtQC1BV3TgpKNJK+B56lFUv9siJxA\n\
EgqT5MW1KQ==\n\
-----END CERTIFICATE-----\n\
-----BEGIN PRIVATE KEY-----\n\
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgF8Wi0g13+PB5C3rX\n\
wovrdBPJIRjSveg1mAzYnBz7BiWhRANCAAQIZA2JYczavp8fM85zUaHJbkeWxI6M\n\
9r7fk4A26kGOjMLDWr6Qkmbl/+7/wZV9jbCiCk6WYodqHUvAJ9KGtyGj\n\
-----END PRIVATE KEY-----\n\
";

    /// ureq's connector panics at the first post on a certificate rustls refuses: refused at
    /// start instead, saying what the certificate must be.
    #[test]
    fn unusable_client_certificate_is_an_error_at_start() {
        let pem = V1_CERT_AND_KEY.as_bytes().to_vec();
        let api = ApiServer {
            server: "https://127.0.0.1:6443".into(),
            ca: pem.clone(),
            auth: Auth::ClientCert {
                cert: pem.clone(),
                key: pem,
            },
        };
        let err = Events::start(api, "n".into()).err().unwrap().to_string();
        assert!(
            err.contains("UnsupportedCertVersion") && err.contains("X.509 v3"),
            "{err}"
        );
    }

    #[test]
    fn kubeconfig_tokens_and_refusals() {
        let path = Path::new("/etc/nvshim/kubeconfig");
        let with_user = |user: &str| {
            KUBELET_CONF.replace(
                "    client-certificate: pki/kubelet-client-current.pem\n    client-key: pki/kubelet-client-current.pem\n",
                user,
            )
        };
        let api = parse_kubeconfig(with_user("    token: abc\n").as_bytes(), path).unwrap();
        assert_eq!(api.auth, Auth::Token("abc".into()));
        let api = parse_kubeconfig(with_user("    tokenFile: t\n").as_bytes(), path).unwrap();
        assert_eq!(api.auth, Auth::TokenFile("/etc/nvshim/t".into()));
        let exec =
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws\n";
        let err = parse_kubeconfig(with_user(exec).as_bytes(), path).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("exec plugin") && text.contains("system:node:node-1"),
            "{text}"
        );
        let err = parse_kubeconfig(
            with_user("    auth-provider:\n      name: gcp\n").as_bytes(),
            path,
        )
        .unwrap_err();
        assert!(err.to_string().contains("auth-provider"), "{err}");
        let bad = KUBELET_CONF.replace(
            "current-context: system:node:node-1@kubernetes",
            "current-context: other",
        );
        let err = parse_kubeconfig(bad.as_bytes(), path).unwrap_err();
        assert!(
            err.to_string().contains("no context named \"other\""),
            "{err}"
        );
    }
}
