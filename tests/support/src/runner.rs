//! Drives an OCI runtime with runc's command line and always cleans up.
//!
//! The runtime can be `runc` itself or anything that takes runc's argv (`nvshim-runtime`). Each
//! [`Runtime`] has its own `--root` state dir so tests run in parallel; every container id it has
//! used is force-deleted with the *low-level* `runc` when it is dropped, so a broken shim cannot
//! leave containers behind.
//!
//! Output goes through files, never pipes: with `terminal: false` runc hands its stdio to the
//! container, and after `create` the container's init holds them until it exits, so reading a
//! pipe to EOF would block until after `start`.

use std::cell::RefCell;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tempfile::TempDir;

use crate::bundle::Bundle;

/// Waits for `child` until `timeout` has passed since `start`, polling every `poll`; kills and
/// reaps it then. `None`: killed. The one deadline loop of the harness (runc and engine
/// commands, hooks).
pub fn wait_with_deadline(
    child: &mut std::process::Child,
    start: Instant,
    timeout: Duration,
    poll: Duration,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        sleep(poll);
    }
}

/// The low-level runtime used for cleanup and state queries.
pub const RUNC: &str = "runc";

/// What one runtime command did.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// The command line, for messages.
    pub command: String,
    /// Exit code (`None` if killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl RunOutput {
    /// Exit code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl fmt::Display for RunOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "$ {}", self.command)?;
        writeln!(f, "exit code: {:?}", self.code)?;
        writeln!(f, "--- stdout ---\n{}", self.stdout.trim_end())?;
        write!(f, "--- stderr ---\n{}", self.stderr.trim_end())
    }
}

/// A runtime binary with its own state dir, environment and optional JSON log.
#[derive(Debug)]
pub struct Runtime {
    path: PathBuf,
    state_root: PathBuf,
    env: Vec<(OsString, OsString)>,
    json_log: Option<PathBuf>,
    timeout: Duration,
    scratch: TempDir,
    ids: RefCell<Vec<String>>,
}

fn read_lossy(path: &Path) -> Result<String> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn describe(program: &Path, args: &[OsString]) -> String {
    let mut s = program.display().to_string();
    for a in args {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

impl Runtime {
    /// `path` is the runtime binary (`runc`, or an absolute path); `state_root` is passed as
    /// `--root` and created if missing.
    pub fn new(path: impl Into<PathBuf>, state_root: &Path) -> Result<Runtime> {
        fs::create_dir_all(state_root)
            .with_context(|| format!("creating {}", state_root.display()))?;
        let scratch = tempfile::Builder::new()
            .prefix("nvshim-runner-")
            .tempdir()
            .context("creating a scratch dir for runtime output")?;
        Ok(Runtime {
            path: path.into(),
            state_root: state_root.to_path_buf(),
            env: Vec::new(),
            json_log: None,
            timeout: Duration::from_secs(60),
            scratch,
            ids: RefCell::new(Vec::new()),
        })
    }

    /// Adds an environment variable for the runtime process (e.g. `NVSHIM_CONFIG`).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Runtime {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Passes `--log <file> --log-format json` before every subcommand.
    pub fn json_log(mut self, file: &Path) -> Runtime {
        self.json_log = Some(file.to_path_buf());
        self
    }

    /// Time limit for each command (default 60 s).
    pub fn timeout(mut self, timeout: Duration) -> Runtime {
        self.timeout = timeout;
        self
    }

    /// The `--root` state dir.
    pub fn state_root(&self) -> &Path {
        &self.state_root
    }

    fn global_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["--root".into(), self.state_root.clone().into()];
        if let Some(log) = &self.json_log {
            args.extend([
                "--log".into(),
                log.clone().into(),
                "--log-format".into(),
                "json".into(),
            ]);
        }
        args
    }

    fn remember(&self, id: &str) {
        let mut ids = self.ids.borrow_mut();
        if !ids.iter().any(|i| i == id) {
            ids.push(id.to_string());
        }
    }

    /// Runs `program args` with stdout/stderr redirected to `out`/`err`, within the timeout.
    fn exec_to(
        &self,
        program: &Path,
        args: &[OsString],
        out: &Path,
        err: &Path,
    ) -> Result<RunOutput> {
        let command = describe(program, args);
        let stdout = File::create(out).with_context(|| format!("creating {}", out.display()))?;
        let stderr = File::create(err).with_context(|| format!("creating {}", err.display()))?;
        let mut child = Command::new(program)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_os_str(), v.as_os_str())))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {command}"))?;
        let waited = wait_with_deadline(
            &mut child,
            Instant::now(),
            self.timeout,
            Duration::from_millis(10),
        )
        .with_context(|| format!("waiting for {command}"))?;
        let Some(status) = waited else {
            bail!(
                "{command} did not finish within {:?}; stdout so far: {}; stderr so far: {}",
                self.timeout,
                read_lossy(out).unwrap_or_default(),
                read_lossy(err).unwrap_or_default()
            );
        };
        Ok(RunOutput {
            command,
            code: status.code(),
            stdout: read_lossy(out)?,
            stderr: read_lossy(err)?,
        })
    }

    fn exec(&self, program: &Path, args: &[OsString], tag: &str) -> Result<RunOutput> {
        let out = self.scratch.path().join(format!("{tag}.stdout"));
        let err = self.scratch.path().join(format!("{tag}.stderr"));
        self.exec_to(program, args, &out, &err)
    }

    /// `<runtime> <global flags> <args...>`, output captured.
    pub fn command(&self, args: &[&str]) -> Result<RunOutput> {
        let mut all = self.global_args();
        all.extend(args.iter().map(OsString::from));
        self.exec(&self.path, &all, "command")
    }

    /// `<runtime> --root R [--log F --log-format json] run --bundle B ID`: the container's output
    /// is the command's output. The container is force-deleted afterwards, whatever happened.
    pub fn run(&self, bundle: &Bundle, id: &str) -> Result<RunOutput> {
        self.remember(id);
        let mut args = self.global_args();
        args.extend([
            OsString::from("run"),
            "--bundle".into(),
            bundle.dir().into(),
            id.into(),
        ]);
        let result = self.exec(&self.path, &args, &format!("run-{id}"));
        self.force_delete(id);
        result
    }

    /// `... create --bundle B ID`. The container's stdout and stderr go to files (see
    /// [`Runtime::container_output`]); the returned output is what `create` itself printed so far
    /// (on failure: the runtime's error).
    pub fn create(&self, bundle: &Bundle, id: &str) -> Result<RunOutput> {
        self.remember(id);
        let mut args = self.global_args();
        args.extend([
            OsString::from("create"),
            "--bundle".into(),
            bundle.dir().into(),
            id.into(),
        ]);
        let (out, err) = self.container_files(id);
        self.exec_to(&self.path, &args, &out, &err)
    }

    fn container_files(&self, id: &str) -> (PathBuf, PathBuf) {
        (
            self.scratch.path().join(format!("container-{id}.stdout")),
            self.scratch.path().join(format!("container-{id}.stderr")),
        )
    }

    /// What a container made by [`Runtime::create`] has written so far (stdout, stderr; stderr
    /// also holds what `create` printed).
    pub fn container_output(&self, id: &str) -> Result<(String, String)> {
        let (out, err) = self.container_files(id);
        Ok((read_lossy(&out)?, read_lossy(&err)?))
    }

    /// `... start ID`.
    pub fn start(&self, id: &str) -> Result<RunOutput> {
        self.remember(id);
        let mut args = self.global_args();
        args.extend([OsString::from("start"), id.into()]);
        self.exec(&self.path, &args, &format!("start-{id}"))
    }

    /// `... state ID` through this runtime.
    pub fn state(&self, id: &str) -> Result<RunOutput> {
        let mut args = self.global_args();
        args.extend([OsString::from("state"), id.into()]);
        self.exec(&self.path, &args, &format!("state-{id}"))
    }

    /// `... delete [--force] ID` through this runtime.
    pub fn delete(&self, id: &str, force: bool) -> Result<RunOutput> {
        let mut args = self.global_args();
        args.push("delete".into());
        if force {
            args.push("--force".into());
        }
        args.push(id.into());
        self.exec(&self.path, &args, &format!("delete-{id}"))
    }

    /// The container's status (`created`, `running`, `stopped`) from the low-level runc, or
    /// `None` if runc does not know it.
    pub fn status(&self, id: &str) -> Result<Option<String>> {
        let args: Vec<OsString> = vec![
            "--root".into(),
            self.state_root.clone().into(),
            "state".into(),
            id.into(),
        ];
        let out = self.exec(Path::new(RUNC), &args, &format!("runc-state-{id}"))?;
        if !out.success() {
            return Ok(None);
        }
        let state: serde_json::Value = serde_json::from_str(&out.stdout)
            .with_context(|| format!("parsing `runc state {id}` output: {}", out.stdout))?;
        Ok(state
            .get("status")
            .and_then(|s| s.as_str())
            .map(str::to_string))
    }

    /// Container ids in this state dir, from the low-level `runc list -q`.
    pub fn list(&self) -> Result<Vec<String>> {
        let args: Vec<OsString> = vec![
            "--root".into(),
            self.state_root.clone().into(),
            "list".into(),
            "-q".into(),
        ];
        let out = self.exec(Path::new(RUNC), &args, "runc-list")?;
        if !out.success() {
            bail!("runc list failed:\n{out}");
        }
        Ok(out.stdout.lines().map(str::to_string).collect())
    }

    /// Polls until the container is `stopped` (or gone), within the timeout.
    pub fn wait_stopped(&self, id: &str) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match self.status(id)?.as_deref() {
                Some("stopped") | None => return Ok(()),
                _ if Instant::now() > deadline => {
                    bail!("container {id} did not stop within {:?}", self.timeout)
                }
                _ => sleep(Duration::from_millis(20)),
            }
        }
    }

    /// `create`, `start`, wait until stopped, then the container's output. If `create` or
    /// `start` fails, returns that command's output (with the container's stderr file appended to
    /// stderr). On success `code` is `start`'s, the container's exit code being unknown to runc.
    /// The container is force-deleted afterwards.
    pub fn create_start(&self, bundle: &Bundle, id: &str) -> Result<RunOutput> {
        let result = self.create_start_inner(bundle, id);
        self.force_delete(id);
        result
    }

    fn create_start_inner(&self, bundle: &Bundle, id: &str) -> Result<RunOutput> {
        let created = self.create(bundle, id)?;
        if !created.success() {
            return Ok(created);
        }
        let mut started = self.start(id)?;
        if !started.success() {
            let (_, err) = self.container_output(id)?;
            started.stderr.push_str(&err);
            return Ok(started);
        }
        self.wait_stopped(id)?;
        let (stdout, stderr) = self.container_output(id)?;
        Ok(RunOutput {
            command: format!("{} && {}", created.command, started.command),
            code: started.code,
            stdout,
            stderr,
        })
    }

    /// `runc --root R delete -f ID` with the low-level runc, ignoring errors.
    pub fn force_delete(&self, id: &str) {
        let _ = Command::new(RUNC)
            .arg("--root")
            .arg(&self.state_root)
            .args(["delete", "-f", id])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        for id in self.ids.borrow().iter() {
            self.force_delete(id);
        }
    }
}

/// One-shot: `<runtime> --root <root> run --bundle <bundle> <id>` with extra environment for the
/// runtime process; always cleans up.
pub fn run(
    runtime: &Path,
    root: &Path,
    bundle: &Bundle,
    id: &str,
    env: &[(&str, &str)],
) -> Result<RunOutput> {
    let mut rt = Runtime::new(runtime, root)?;
    for (k, v) in env {
        rt = rt.env(OsStr::new(k), OsStr::new(v));
    }
    rt.run(bundle, id)
}
