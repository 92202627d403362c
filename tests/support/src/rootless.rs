//! A rootless user for podman: a local account with subordinate uid and gid ranges in
//! `/etc/subuid` and `/etc/subgid` (what `useradd` gives a regular user on Debian), used through
//! `newuidmap`/`newgidmap` (Debian's `uidmap` package), and the host's `/dev` as such a user's
//! containers need it.
//!
//! runc in a user namespace cannot `mknod`: it bind-mounts each device node from the host path
//! equal to its container path (`/dev/nvidia0`). On a GPU host the nodes are there; the fake
//! host keeps them under its own root, so [`RootlessUser::command`] runs podman in a mount
//! namespace of its own whose `/dev` is a tmpfs holding the host's `/dev` entries (bind mounts)
//! and the fake host's nodes. Nothing changes in the host's `/dev`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The account the rootless tests run podman as.
pub const USER: &str = "nvshim-rootless";

/// Builds the mount namespace's `/dev`, then execs the rest of its arguments. `$1`: the fake
/// host's `dev`, `$2`: a directory to keep the host's `/dev` at.
const DEV_SCRIPT: &str = r#"set -e
fake=$1 old=$2; shift 2
mount --make-rprivate /
mkdir -p "$old"
mount --rbind /dev "$old"
mount -t tmpfs -o mode=755,nosuid tmpfs /dev
for e in "$old"/*; do
    n=${e##*/}
    if [ -L "$e" ]; then cp -P "$e" "/dev/$n"
    elif [ -d "$e" ]; then mkdir "/dev/$n"; mount --rbind "$e" "/dev/$n"
    else : > "/dev/$n"; mount --bind "$e" "/dev/$n"; fi
done
cd "$fake"
for e in $(find . -mindepth 1); do
    p=/dev/${e#./}
    if [ -L "$e" ]; then cp -P "$e" "$p"
    elif [ -d "$e" ]; then mkdir -p "$p"
    else : > "$p"; mount --bind "$fake/$e" "$p"; fi
done
cd /
exec "$@"
"#;

/// The rootless user, made when missing.
#[derive(Debug, Clone)]
pub struct RootlessUser {
    pub uid: u32,
    pub gid: u32,
}

impl RootlessUser {
    /// [`USER`], created (no home directory) with a subordinate range of 65,536 ids when there
    /// is none. Fails when `newuidmap` is missing, saying which package has it.
    pub fn ensure() -> Result<RootlessUser> {
        for tool in ["/usr/bin/newuidmap", "/usr/bin/newgidmap"] {
            if !Path::new(tool).exists() {
                bail!("{tool} is missing (apt-get install uidmap): rootless podman needs it");
            }
        }
        if id(&["-u", USER]).is_err() {
            let out = Command::new("useradd")
                .args(["--no-create-home", "--shell", "/bin/sh", USER])
                .output()
                .context("running useradd")?;
            // A concurrent test may have made it first.
            if !out.status.success() && id(&["-u", USER]).is_err() {
                bail!("useradd {USER}: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        let uid = id(&["-u", USER])?;
        let gid = id(&["-g", USER])?;
        for file in ["/etc/subuid", "/etc/subgid"] {
            let text = fs::read_to_string(file).unwrap_or_default();
            if !text.lines().any(|l| l.starts_with(&format!("{USER}:"))) {
                // Past the ranges Debian's useradd hands out from 100000.
                let mut f = fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(file)
                    .with_context(|| format!("opening {file}"))?;
                std::io::Write::write_all(&mut f, format!("{USER}:3000000:65536\n").as_bytes())
                    .with_context(|| format!("writing {file}"))?;
            }
        }
        Ok(RootlessUser { uid, gid })
    }

    /// `program` run as this user with `HOME` and `XDG_RUNTIME_DIR` in `dir` (made, 0700, the
    /// user's), in a mount namespace of its own whose `/dev` also holds the nodes of `fake_dev`.
    pub fn command(&self, fake_dev: &Path, dir: &Path, program: &Path) -> Result<Command> {
        let (home, xdg) = (dir.join("home"), dir.join("xdg"));
        for d in [&home, &xdg] {
            fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            self.own(d)?;
            fs::set_permissions(d, fs::Permissions::from_mode(0o700))
                .with_context(|| format!("chmod {}", d.display()))?;
        }
        let old_dev = dir.join("host-dev");
        let mut c = Command::new("unshare");
        c.args(["--mount", "sh", "-c", DEV_SCRIPT, "sh"])
            .arg(fake_dev)
            .arg(old_dev)
            .args(["runuser", "-u", USER, "--", "env"])
            .arg(format!("HOME={}", home.display()))
            .arg(format!("XDG_RUNTIME_DIR={}", xdg.display()))
            .arg(program);
        Ok(c)
    }

    /// Makes `path` this user's.
    pub fn own(&self, path: &Path) -> Result<()> {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
            .with_context(|| format!("chown {} to {USER}", path.display()))
    }
}

fn id(args: &[&str]) -> Result<u32> {
    let out = Command::new("id")
        .args(args)
        .output()
        .context("running id")?;
    if !out.status.success() {
        bail!("id {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .with_context(|| format!("id {args:?}: not a number"))
}
