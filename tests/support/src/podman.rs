//! podman as an independent CDI consumer: its own storage, run and temp dirs under one
//! directory, runc as its runtime, a busybox image imported from a [`Rootfs`], and cleanup of
//! everything it left (containers, then mounts under its dirs) when dropped.
//!
//! Debian 12's podman 4.3 is the system one; [`Podman::newer`] is the podman 5 of
//! `$NVSHIM_PODMAN` (Debian 13's, from scripts/install-engines.sh), for the CDI versions 4.3
//! cannot read. Both read CDI specs from `/etc/cdi` and `/var/run/cdi` only (podman 5.4 ignores
//! `cdi_spec_dirs`), so a test puts its specs there with a [`SystemSpec`] guard. On the CI machines podman needs
//! `--ulimit nofile=1024:1024 --ulimit nproc=1024:1024` (the default rlimits are refused) and
//! runc (crun 1.8 refuses these machines' hybrid cgroups: "cgroups in hybrid mode not
//! supported").

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{bail, Context, Result};

use crate::rootfs::Rootfs;
use crate::rootless::RootlessUser;

/// A podman with its state under `dir`.
#[derive(Debug)]
pub struct Podman {
    dir: PathBuf,
    program: PathBuf,
    /// The major release (`podman --version`).
    major: u32,
    /// Run as this user, with the nodes of this fake host `dev` ([`RootlessUser::command`]).
    rootless: Option<(RootlessUser, PathBuf)>,
}

impl Podman {
    /// The system podman. Fails when podman is not installed, saying how to install it.
    pub fn new(dir: &Path) -> Result<Podman> {
        Podman::with_program(dir, Path::new("podman"))
    }

    /// The podman of `$NVSHIM_PODMAN`, when that is set.
    pub fn newer(dir: &Path) -> Result<Option<Podman>> {
        match std::env::var_os("NVSHIM_PODMAN") {
            Some(p) => Podman::with_program(dir, Path::new(&p)).map(Some),
            None => Ok(None),
        }
    }

    /// Whether this podman's CDI library reads specs of `version`: 4.x (CDI 0.5) up to 0.5.0,
    /// 5.x (CDI 0.8 and later) up to 0.8.0, the newest version the tests' fixtures use.
    pub fn reads_cdi(&self, version: &str) -> bool {
        let newest = if self.major >= 5 { (0, 8) } else { (0, 5) };
        let mut parts = version
            .split('.')
            .map(|p| p.parse::<u32>().unwrap_or(u32::MAX));
        let (a, b) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        (a, b) <= newest
    }

    /// Writes spec `name` where this podman reads it (`/var/run/cdi`); removed when the guard
    /// drops.
    pub fn put_spec(&self, name: &str, text: &str) -> Result<SystemSpec> {
        SystemSpec::write(
            Path::new("/var/run/cdi"),
            &format!("nvshim-e2e-{name}"),
            text,
        )
    }

    /// The podman of `$NVSHIM_PODMAN` (else the system one) run rootless as `user`, its
    /// state under `dir` (made the user's), with the device nodes of `fake_dev` at `/dev`.
    pub fn rootless(dir: &Path, user: &RootlessUser, fake_dev: &Path) -> Result<Podman> {
        let program = std::env::var_os("NVSHIM_PODMAN").unwrap_or_else(|| "podman".into());
        let mut p = Podman::with_program(dir, Path::new(&program))?;
        user.own(dir)?;
        p.rootless = Some((user.clone(), fake_dev.to_path_buf()));
        Ok(p)
    }

    fn with_program(dir: &Path, program: &Path) -> Result<Podman> {
        let out = Command::new(program)
            .arg("--version")
            .output()
            .with_context(|| {
                format!(
                    "{} is not installed (apt-get install podman): this test needs it",
                    program.display()
                )
            })?;
        if !out.status.success() {
            bail!(
                "podman --version failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // "podman version 5.4.2"
        let version = String::from_utf8_lossy(&out.stdout);
        let major = version
            .split_whitespace()
            .last()
            .and_then(|v| v.split('.').next())
            .and_then(|m| m.parse().ok())
            .with_context(|| format!("{}: unexpected --version: {version}", program.display()))?;
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Podman {
            dir: dir.to_path_buf(),
            program: program.to_path_buf(),
            major,
            rootless: None,
        })
    }

    /// `podman` with this instance's global flags.
    pub fn cmd(&self) -> Command {
        let mut c = match &self.rootless {
            Some((user, dev)) => user
                .command(dev, &self.dir, &self.program)
                .expect("the rootless user's runtime dir"),
            None => Command::new(&self.program),
        };
        c.arg("--root")
            .arg(self.dir.join("root"))
            .arg("--runroot")
            .arg(self.dir.join("run"))
            .arg("--tmpdir")
            .arg(self.dir.join("tmp"))
            .args([
                "--storage-driver",
                "vfs",
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "file",
                "--runtime",
                "runc",
            ]);
        c
    }

    /// Imports a busybox rootfs (made under this podman's dir) as image `name`.
    pub fn import_busybox(&self, name: &str) -> Result<()> {
        let rootfs = Rootfs::busybox(&self.dir.join("image-rootfs"))?;
        self.import_rootfs(rootfs.path(), name)
    }

    /// Imports the rootfs directory `root` as image `name`.
    pub fn import_rootfs(&self, root: &Path, name: &str) -> Result<()> {
        let tar = self.dir.join("image.tar");
        let status = Command::new("tar")
            .arg("-C")
            .arg(root)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .context("running tar")?;
        if !status.success() {
            bail!("tar of {} failed: {status}", root.display());
        }
        let out = self
            .cmd()
            .arg("import")
            .arg(&tar)
            .arg(name)
            .output()
            .context("running podman import")?;
        if !out.status.success() {
            bail!(
                "podman import {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// `podman run --rm --network none` with the rlimits these machines need, `CAP_MKNOD` (the
    /// probe mknods nodes to test the device cgroup), `--device` per CDI name, and `args` as the
    /// command.
    pub fn run(&self, image: &str, devices: &[&str], args: &[&str]) -> Result<Output> {
        self.run_with(image, devices, &[], args)
    }

    /// [`Podman::run`] with further `run` options (`--userns=keep-id`).
    pub fn run_with(
        &self,
        image: &str,
        devices: &[&str],
        options: &[&str],
        args: &[&str],
    ) -> Result<Output> {
        let mut c = self.cmd();
        c.args([
            "run",
            "--rm",
            "--network",
            "none",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "--cap-add",
            "MKNOD",
        ]);
        for d in devices {
            c.args(["--device", d]);
        }
        c.args(options).arg(image).args(args);
        c.output().context("running podman run")
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.cmd().args(["rm", "-af"]).output();
        // A rootless podman leaves its pause process (holding its user namespace) running; its
        // pid file is in `--tmpdir` (podman 4) or `$XDG_RUNTIME_DIR/libpod/tmp` (podman 5).
        let pid_files = ["tmp/pause.pid", "xdg/libpod/tmp/pause.pid"];
        for pid_file in pid_files.iter().filter(|_| self.rootless.is_some()) {
            if let Some(pid) = fs::read_to_string(self.dir.join(pid_file))
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok())
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        // Anything podman left mounted under its dirs goes with it.
        if let Ok(mounts) = fs::read_to_string("/proc/self/mounts") {
            let prefix = self.dir.to_string_lossy().into_owned();
            let mut targets: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split(' ').nth(1))
                .filter(|t| t.starts_with(&prefix))
                .collect();
            targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
            for t in targets {
                let _ = nix::mount::umount2(t, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

/// A spec file written into a system CDI directory (`/var/run/cdi`), removed when dropped.
#[derive(Debug)]
pub struct SystemSpec(PathBuf);

impl SystemSpec {
    /// Writes `text` to `dir/name` (creating `dir`).
    pub fn write(dir: &Path, name: &str, text: &str) -> Result<SystemSpec> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(name);
        fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(SystemSpec(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SystemSpec {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}
