//! The NRI plugin: the `Plugin` service the engine calls, and the connection to the engine,
//! made again with back-off whenever the engine goes away (a restart, an upgrade).
//!
//! State lives in this process only, and is only the engine's name and version (from
//! `Configure`) and the CDI registry ([`crate::specs`], renewed on inotify events): every event
//! plans its container from what the engine sends.

use std::os::fd::IntoRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvshim::config::Config;
use nvshim::install::{self, Tools};
use thiserror::Error;

use crate::adjust::{self, Engine, How, Options};
use crate::events::{self, Events, Reason};
use crate::mux;
use crate::proto::{nri, nri_ttrpc};
use crate::specs::Specs;
use crate::stop;

/// NRI's event numbers (its `Event` enum) this plugin subscribes to.
const CREATE_CONTAINER: i32 = 4;
const POST_CREATE_CONTAINER: i32 = 5;
const START_CONTAINER: i32 = 6;

/// A bit per event in `ConfigureResponse.events`.
fn event_mask(events: &[i32]) -> i32 {
    events.iter().fold(0, |m, e| m | (1 << (e - 1)))
}

#[derive(Debug, Error)]
pub enum PluginError {
    #[error("cannot connect to the NRI socket {path}: {source}; is NRI enabled in the engine (containerd: [plugins.\"io.containerd.nri.v1.nri\"] disable = false; `nvshim runtime configure --runtime containerd --nri`)?")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot set up the NRI connection: {0}")]
    Setup(#[from] std::io::Error),
    #[error("the engine refused the registration of plugin {index}-{name}: {source}")]
    Register {
        name: String,
        index: String,
        source: ttrpc::Error,
    },
    #[error("cannot start the plugin's ttRPC server: {0}")]
    Server(ttrpc::Error),
}

/// Serves the `Plugin` service.
pub struct Handler {
    /// nvshim's config, read for every container as `nvshim-runtime` reads it for every
    /// create: an edit applies to the next container, with no reload to forget.
    config: PathBuf,
    options: Options,
    /// A container whose requested device nodes are missing at `StartContainer` does not
    /// start (an error to the engine), and a running one found so at `Synchronize` is
    /// stopped; otherwise a warning.
    mandatory: bool,
    engine: Mutex<Engine>,
    /// The CDI registry of the configured spec directories, kept current ([`crate::specs`]).
    specs: Specs,
    /// Warnings and refusals as Kubernetes events on the pod, where there is an API server.
    events: Option<Events>,
}

impl Handler {
    pub fn new(config: PathBuf, options: Options, mandatory: bool) -> Handler {
        let specs = Specs::default();
        // Read the spec directories now, not in the first container's 2 s.
        if let Ok(c) = Config::load(&config) {
            specs.registry(&c.cdi_spec_dirs);
        }
        Handler {
            config,
            options,
            mandatory,
            engine: Mutex::new(Engine::default()),
            specs,
            events: None,
        }
    }

    /// Also puts warnings and refusals on the pod as Kubernetes events ([`crate::events`]).
    pub fn with_events(mut self, events: Option<Events>) -> Handler {
        self.events = events;
        self
    }

    /// `text` as a Warning event on `container`'s pod, where events are on and the pod is
    /// known; never waits.
    pub fn tell(
        &self,
        pod: Option<&nri::PodSandbox>,
        container: &nri::Container,
        reason: Reason,
        text: &str,
    ) {
        if let (Some(sink), Some(target)) = (&self.events, event_target(pod, container)) {
            sink.warn(target, reason, text);
        }
    }

    /// Sets the engine as `Configure` names it (tests and benchmarks call this directly).
    pub fn set_engine(&self, engine: Engine) {
        *self.engine.lock().unwrap_or_else(|e| e.into_inner()) = engine;
    }

    /// `CreateContainer`: the adjustment, or the refusal `nvshim-runtime` would make.
    pub fn create(
        &self,
        req: &nri::CreateContainerRequest,
    ) -> Result<nri::CreateContainerResponse, String> {
        let container = req.container.get_or_default();
        let pod = req.pod.get_or_default();
        let engine = self
            .engine
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let who = format!(
            "container {} ({}) of pod {}/{}",
            container.name,
            short(&container.id),
            pod.namespace,
            pod.name
        );
        let started = Instant::now();
        let refuse = |e: &(dyn std::error::Error + 'static)| {
            let text = nvshim::report::error_text(e);
            // The planner names the config.json it was shown; the container is named here.
            let text = text.strip_prefix("config.json: ").unwrap_or(&text);
            let text = format!("nvshim: {who}: {text}");
            tracing::error!("{text}");
            text
        };
        let config = Config::load(&self.config).map_err(|e| refuse(&e))?;
        // The `nvidia` runtime class's nvshim-runtime rewrites such nodes itself.
        if !self.runtime_class_pod(pod) {
            adjust::engine_devices_in_user_namespace(&config, container).map_err(|e| refuse(&e))?;
        }
        let tools = self.tools(&config);
        let answer = adjust::answer(&config, &tools, &engine, &self.options, container)
            .map_err(|e| refuse(&e))?;
        for w in &answer.warnings {
            tracing::warn!("{who}: {w}");
        }
        if !answer.dropped.is_empty() {
            tracing::info!("{who}: --no-hooks: not done: {}", answer.dropped.join("; "));
        }
        if answer.how != How::Nothing {
            tracing::info!(
                served = ?answer.served,
                devices = answer.expected_devices.len(),
                engine = %format!("{} {}", engine.name, engine.version),
                micros = started.elapsed().as_micros() as u64,
                "{who}: {}", answer.how.name()
            );
        }
        Ok(nri::CreateContainerResponse {
            adjust: protobuf::MessageField::some(answer.adjust),
            ..Default::default()
        })
    }

    fn tools(&self, config: &Config) -> Tools {
        Tools {
            cdi: self.specs.registry(&config.cdi_spec_dirs),
            ..Tools::in_process(config, install::self_exe().as_deref())
        }
    }

    /// `StartContainer` (and `PostCreateContainer` where an engine sends it) and
    /// `Synchronize`: plans the container again
    /// as it now is; device nodes the plan would still add are missing. Nothing is kept
    /// between the events, so this also finds a container created while the plugin was down
    /// (the engine then creates it unadjusted). Mandatory: an error to the engine (the start
    /// fails); otherwise a warning.
    pub fn verify(
        &self,
        pod: Option<&nri::PodSandbox>,
        container: &nri::Container,
        event: &str,
    ) -> Result<(), String> {
        match self.unserved(container) {
            None => Ok(()),
            Some(u) => self.report(pod, container, event, &u),
        }
    }

    /// `StartContainer`: [`Handler::verify`], whose error fails the start on containerd.
    /// CRI-O (1.36.3, seen) only logs a plugin's error there and starts the container: on
    /// CRI-O the created container's process (runc init, waiting for the start) is killed
    /// instead, and the start fails.
    fn verify_start(
        &self,
        pod: Option<&nri::PodSandbox>,
        container: &nri::Container,
    ) -> Result<(), String> {
        let result = self.verify(pod, container, "StartContainer");
        let crio = self.engine.lock().unwrap_or_else(|e| e.into_inner()).name == "cri-o";
        if let (Err(text), true) = (&result, crio) {
            if let Err(e) = stop::kill_container_process(container.pid, &container.id) {
                let e = nvshim::report::error_text(&e);
                tracing::error!("{text}; CRI-O starts it anyway, and it could not be stopped: {e}");
            }
        }
        result
    }

    /// A pod of a runtime class whose handler is nvshim-runtime (`--runtime-handler`).
    fn runtime_class_pod(&self, pod: &nri::PodSandbox) -> bool {
        self.options.runtime_handlers.contains(&pod.runtime_handler)
    }

    /// What the container lacks of its request, planned again as it now is.
    fn unserved(&self, container: &nri::Container) -> Option<Unserved> {
        let engine = self
            .engine
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let missing = Config::load(&self.config)
            .map_err(|e| nvshim::report::error_text(&e))
            .and_then(|config| {
                let tools = self.tools(&config);
                adjust::answer(&config, &tools, &engine, &self.options, container)
                    .map_err(|e| nvshim::report::error_text(&e))
            })
            .map(|a| a.expected_devices);
        match missing {
            Ok(m) if m.is_empty() => None,
            Ok(m) => Some(Unserved::Devices(m)),
            Err(e) => Some(Unserved::Refused(e)),
        }
    }

    /// Logs what `unserved` found and puts it on the pod as an event: mandatory, an error
    /// (returned, for the engine); otherwise a warning.
    fn report(
        &self,
        pod: Option<&nri::PodSandbox>,
        container: &nri::Container,
        event: &str,
        u: &Unserved,
    ) -> Result<(), String> {
        let who = format!("container {} ({})", container.name, short(&container.id));
        let problem = match u {
            Unserved::Devices(m) => format!("it lacks device nodes its request names: {}; was it created while nvshim-nri was down, or did the engine drop them (its log: CDI registry, NRI validators)?", m.join(", ")),
            Unserved::Refused(e) => format!("its request would be refused: {e}"),
        };
        let text = format!("nvshim: {who} at {event}: {problem}");
        if self.mandatory {
            tracing::error!("{text}");
            // At Synchronize it already runs: the event is the stop's.
            if event != "Synchronize" {
                self.tell(pod, container, Reason::GpuRequestRefused, &text);
            }
            Err(text)
        } else {
            let text = format!("{text} (fail-open: it runs as it is; --mandatory stops it)");
            tracing::warn!("{text}");
            self.tell(pod, container, Reason::GpusMissing, &text);
            Ok(())
        }
    }

    /// `Synchronize`: every container the engine has, checked. Mandatory, a running one
    /// that lacks its device nodes (created and started while the plugin was down: the
    /// engine asked no plugin) is stopped, after this answer (a thread: the engine waits
    /// for the answer). A created one fails at its start; a refusal is only logged (a
    /// policy edited after a served container started must not kill it); a stopped one and
    /// those of `nvidia` runtime-class pods are not checked.
    fn synchronize_containers(&self, req: &nri::SynchronizeRequest) {
        use nri::ContainerState::{CONTAINER_RUNNING, CONTAINER_STOPPED};
        let mut to_stop = Vec::new();
        for c in &req.containers {
            let state = c.state.enum_value_or_default();
            let pod = req.pods.iter().find(|p| p.id == c.pod_sandbox_id);
            // A runtime-class pod's nvshim-runtime served it in config.json, which NRI does
            // not show.
            if state == CONTAINER_STOPPED || pod.is_some_and(|p| self.runtime_class_pod(p)) {
                continue;
            }
            let Some(u) = self.unserved(c) else {
                continue;
            };
            // An error here would only fail the registration.
            let _ = self.report(pod, c, "Synchronize", &u);
            if let (true, CONTAINER_RUNNING, Unserved::Devices(m)) = (self.mandatory, state, u) {
                to_stop.push(Running {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    pod: pod.map_or_else(
                        || c.pod_sandbox_id.clone(),
                        |p| format!("{}/{}", p.namespace, p.name),
                    ),
                    target: event_target(pod, c),
                    pid: c.pid,
                    missing: m,
                });
            }
        }
        if !to_stop.is_empty() {
            let events = self.events.clone();
            std::thread::spawn(move || {
                for c in &to_stop {
                    stop_unserved(c, events.as_ref());
                }
            });
        }
    }
}

/// The pod (and container) an event names, where the engine named the pod.
fn event_target(pod: Option<&nri::PodSandbox>, container: &nri::Container) -> Option<events::Pod> {
    pod.map(|pod| events::Pod {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        container: Some(container.name.clone()).filter(|n| !n.is_empty()),
    })
}

/// What a container lacks of its request.
enum Unserved {
    /// The device nodes its request names that it does not have.
    Devices(Vec<String>),
    /// Its request would be refused now (or nvshim's config cannot be read).
    Refused(String),
}

/// A running container to stop: `--mandatory` found it without its device nodes.
struct Running {
    id: String,
    name: String,
    /// `namespace/name`.
    pod: String,
    /// Where the stop's event goes.
    target: Option<events::Pod>,
    pid: u32,
    missing: Vec<String>,
}

/// Kills the container's process ([`stop::kill_container_process`]) and says so, in the log
/// and on the pod.
fn stop_unserved(c: &Running, events: Option<&Events>) {
    let who = format!(
        "container {} ({}) of pod {}, process {}",
        c.name,
        short(&c.id),
        c.pod,
        c.pid
    );
    let why = format!(
        "it runs without device nodes its request names ({}): it was started while nvshim-nri was down or ran without --mandatory",
        c.missing.join(", ")
    );
    let text = match stop::kill_container_process(c.pid, &c.id) {
        Ok(()) => format!("nvshim: stopped {who} with SIGKILL (--mandatory): {why}; the pod's restartPolicy decides what follows: a new container is served (restartPolicy Never: delete the pod and create it again)"),
        Err(e) => format!("nvshim: {who}: {why}, and --mandatory could not stop it: {}", nvshim::report::error_text(&e)),
    };
    tracing::error!("{text}");
    if let (Some(sink), Some(target)) = (events, c.target.clone()) {
        sink.warn(target, Reason::ContainerStoppedWithoutGpus, &text);
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

fn rpc_error(text: String) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(ttrpc::Code::FAILED_PRECONDITION, text))
}

impl nri_ttrpc::Plugin for Handler {
    fn configure(
        &self,
        _ctx: &ttrpc::TtrpcContext,
        req: nri::ConfigureRequest,
    ) -> ttrpc::Result<nri::ConfigureResponse> {
        let engine = Engine {
            name: req.runtime_name.clone(),
            version: req.runtime_version.clone(),
        };
        tracing::info!(
            "configured by {} {}: CDI requests answered with {}",
            engine.name,
            engine.version,
            if engine.injects_cdi() && !self.options.no_native_cdi {
                How::NativeCdi.name()
            } else {
                How::Raw.name()
            }
        );
        self.set_engine(engine);
        Ok(nri::ConfigureResponse {
            // Checked at StartContainer only: it follows PostCreateContainer at once, can stop
            // the container, and each check plans the container again (scripts/bench/nri.sh:
            // 0.6 ms for a MIG request, 2 ms beside 1,000 CDI spec files).
            events: event_mask(&[CREATE_CONTAINER, START_CONTAINER]),
            ..Default::default()
        })
    }

    fn synchronize(
        &self,
        _ctx: &ttrpc::TtrpcContext,
        req: nri::SynchronizeRequest,
    ) -> ttrpc::Result<nri::SynchronizeResponse> {
        tracing::info!(
            pods = req.pods.len(),
            containers = req.containers.len(),
            "synchronized with the engine"
        );
        self.synchronize_containers(&req);
        Ok(nri::SynchronizeResponse::default())
    }

    fn shutdown(&self, _ctx: &ttrpc::TtrpcContext, _: nri::Empty) -> ttrpc::Result<nri::Empty> {
        tracing::info!("the engine asked the plugin to shut down");
        Ok(nri::Empty::default())
    }

    fn create_container(
        &self,
        _ctx: &ttrpc::TtrpcContext,
        req: nri::CreateContainerRequest,
    ) -> ttrpc::Result<nri::CreateContainerResponse> {
        self.create(&req).map_err(rpc_error)
    }

    fn post_create_container(
        &self,
        _ctx: &ttrpc::TtrpcContext,
        req: nri::PostCreateContainerRequest,
    ) -> ttrpc::Result<nri::PostCreateContainerResponse> {
        self.verify(
            req.pod.as_ref(),
            req.container.get_or_default(),
            "PostCreateContainer",
        )
        .map_err(rpc_error)?;
        Ok(nri::PostCreateContainerResponse::default())
    }

    fn start_container(
        &self,
        _ctx: &ttrpc::TtrpcContext,
        req: nri::StartContainerRequest,
    ) -> ttrpc::Result<nri::StartContainerResponse> {
        self.verify_start(req.pod.as_ref(), req.container.get_or_default())
            .map_err(rpc_error)?;
        Ok(nri::StartContainerResponse::default())
    }

    fn state_change(
        &self,
        _ctx: &ttrpc::TtrpcContext,
        req: nri::StateChangeEvent,
    ) -> ttrpc::Result<nri::Empty> {
        let container = req.container.get_or_default();
        match req.event {
            POST_CREATE_CONTAINER => self
                .verify(req.pod.as_ref(), container, "PostCreateContainer")
                .map_err(rpc_error)?,
            START_CONTAINER => self
                .verify_start(req.pod.as_ref(), container)
                .map_err(rpc_error)?,
            _ => {}
        }
        Ok(nri::Empty::default())
    }
}

/// Where and as whom to register.
#[derive(Debug, Clone)]
pub struct Connection {
    pub socket: PathBuf,
    pub name: String,
    pub index: String,
}

/// Serves the engine forever: connects, registers, serves until the engine closes the
/// connection, then connects again, waiting 0.1 s doubling to 5 s between failed tries.
pub fn run(conn: &Connection, handler: Arc<Handler>) -> ! {
    let mut delay = Duration::from_millis(100);
    loop {
        let started = Instant::now();
        match session(conn, Arc::clone(&handler)) {
            Ok(()) => tracing::warn!("the engine closed the NRI connection; reconnecting"),
            Err(e) => tracing::warn!("{}", nvshim::report::error_text(&e)),
        }
        if started.elapsed() > Duration::from_secs(10) {
            delay = Duration::from_millis(100);
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// One connection to the engine, until it closes.
pub fn session(conn: &Connection, handler: Arc<Handler>) -> Result<(), PluginError> {
    let trunk = UnixStream::connect(&conn.socket).map_err(|source| PluginError::Connect {
        path: conn.socket.clone(),
        source,
    })?;
    // The ttRPC server takes connections from a listening socket: one in a directory only
    // this process's user can enter, removed once the multiplexer has connected to it.
    let dir = tempfile::Builder::new().prefix("nvshim-nri-").tempdir()?;
    let path = dir.path().join("plugin.sock");
    let listener = UnixListener::bind(&path)?;
    let served = UnixStream::connect(&path)?;
    std::fs::remove_file(&path)?;
    let (client_end, runtime_end) = UnixStream::pair()?;
    let trunk_mux = mux::start(
        trunk,
        vec![
            (mux::PLUGIN_SERVICE_CONN, served),
            (mux::RUNTIME_SERVICE_CONN, runtime_end),
        ],
    )?;
    let service = nri_ttrpc::create_plugin(handler);
    let mut server = ttrpc::Server::new()
        .add_listener(listener.into_raw_fd())
        .map_err(PluginError::Server)?
        .register_service(service);
    server.start().map_err(PluginError::Server)?;
    let client = ttrpc::Client::new(client_end.into_raw_fd()).map_err(PluginError::Server)?;
    let runtime = nri_ttrpc::RuntimeClient::new(client);
    let req = nri::RegisterPluginRequest {
        plugin_name: conn.name.clone(),
        plugin_idx: conn.index.clone(),
        ..Default::default()
    };
    runtime
        .register_plugin(ttrpc::context::with_timeout(5_000_000_000), &req)
        .map_err(|source| PluginError::Register {
            name: conn.name.clone(),
            index: conn.index.clone(),
            source,
        })?;
    tracing::info!(socket = %conn.socket.display(), "registered as NRI plugin {}-{}", conn.index, conn.name);
    let result = trunk_mux.wait();
    server.shutdown();
    result?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pods nvshim-runtime serves are those of the handlers named, `nvidia` where the
    /// command line names none (main.rs's default), or another `--runtime-name`.
    #[test]
    fn runtime_class_pods_are_those_of_the_named_handlers() {
        let options = Options {
            runtime_handlers: vec!["nvidia".into(), "gpu".into()],
            ..Options::default()
        };
        let handler = Handler::new("/nonexistent/config.toml".into(), options, true);
        let pod = |h: &str| nri::PodSandbox {
            runtime_handler: h.into(),
            ..Default::default()
        };
        assert!(handler.runtime_class_pod(&pod("nvidia")));
        assert!(handler.runtime_class_pod(&pod("gpu")));
        assert!(!handler.runtime_class_pod(&pod("runc")));
        assert!(!handler.runtime_class_pod(&pod("")));
    }
}
