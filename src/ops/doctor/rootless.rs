//! What a rootless user (podman as a regular user, with nvshim's CDI spec) needs, checked when
//! `nvshim doctor` runs as that user: the GPU nodes at `/dev` and openable by the user, the
//! specs readable, and subordinate ids for the user namespace. Seen with podman 5.4
//! (tests/e2e/rootless.rs): the spec's hook runs as the user's namespace root and its
//! ld.so.cache update works; what fails is outside the spec.

use std::path::Path;

use crate::config::Config;
use crate::host::{Gpu, Host, HostDeviceNode};

use super::{check, Check, Status};

/// The user `doctor` runs as.
#[derive(Debug, Clone)]
pub struct Who {
    pub uid: u32,
    pub name: String,
    /// The process's groups (primary and supplementary).
    pub groups: Vec<u32>,
}

/// [`checks`] for the user running this process, with the system's `/etc/subuid` and
/// `/etc/subgid`.
pub fn current_user(config: &Config, host: &Host, gpus: &[Gpu]) -> Vec<Check> {
    let uid = nix::unistd::getuid();
    let mut groups: Vec<u32> = nix::unistd::getgroups()
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.as_raw())
        .collect();
    groups.push(nix::unistd::getgid().as_raw());
    let who = Who {
        uid: uid.as_raw(),
        name: nix::unistd::User::from_uid(uid)
            .ok()
            .flatten()
            .map_or_else(|| uid.to_string(), |u| u.name),
        groups,
    };
    let read = |p: &str| std::fs::read_to_string(p).ok();
    checks(
        config,
        host,
        gpus,
        &who,
        read("/etc/subuid").as_deref(),
        read("/etc/subgid").as_deref(),
    )
}

/// The rootless checks: `rootless-devices`, `rootless-spec`, `rootless-subids`. `subuid` and
/// `subgid` are the text of `/etc/subuid` and `/etc/subgid` (`None`: unreadable or missing).
pub fn checks(
    config: &Config,
    host: &Host,
    gpus: &[Gpu],
    who: &Who,
    subuid: Option<&str>,
    subgid: Option<&str>,
) -> Vec<Check> {
    vec![
        devices(host, gpus, who),
        specs(config),
        subids(who, subuid, subgid),
    ]
}

fn devices(host: &Host, gpus: &[Gpu], who: &Who) -> Check {
    let dev_root = &host.roots().dev_root;
    if dev_root != Path::new("/") {
        return check(
            "rootless-devices",
            Status::Warning,
            format!(
                "the GPU nodes are under dev-root {}: runc in a rootless user namespace bind-mounts each node from the host path equal to its container path (/dev/nvidia0), so a rootless container cannot get them",
                dev_root.display()
            ),
            Some("create the nodes at /dev (nvidia-modprobe, or the driver container's /dev mounted at the host's)".into()),
        );
    }
    let mut names: Vec<String> = vec!["nvidiactl".into(), "nvidia-uvm".into()];
    names.extend(gpus.iter().map(|g| format!("nvidia{}", g.minor)));
    let mut nodes: Vec<HostDeviceNode> = names.iter().filter_map(|n| host.device_node(n)).collect();
    for g in gpus {
        nodes.extend(host.drm_nodes(&g.bus_id));
    }
    let (closed, by_group) = access(&nodes, who);
    if closed.is_empty() && by_group.is_empty() {
        return check(
            "rootless-devices",
            Status::Ok,
            format!("{} GPU nodes, each one {} can open", nodes.len(), who.name),
            None,
        );
    }
    let mut message = Vec::new();
    if !closed.is_empty() {
        message.push(format!("{} cannot open {}", who.name, closed.join(", ")));
    }
    if !by_group.is_empty() {
        message.push(format!(
            "{} opens {} only through a group, which a rootless container under runc does not keep (podman sets the container's own groups; the spec's additionalGids are groups inside the user namespace)",
            who.name,
            by_group.join(", ")
        ));
    }
    check(
        "rootless-devices",
        Status::Warning,
        message.join("; "),
        Some(format!(
            "usermod -aG <the node's group> {} (DRM nodes: video, render) and run podman with --group-add keep-groups, which needs crun",
            who.name
        )),
    )
}

/// The nodes `who` cannot open at all, and those it opens only through one of its groups:
/// each as `path (mode, owner:group)`.
fn access(nodes: &[HostDeviceNode], who: &Who) -> (Vec<String>, Vec<String>) {
    let (mut closed, mut by_group) = (Vec::new(), Vec::new());
    for n in nodes {
        let mode = n.file_mode & 0o777;
        let shown = format!(
            "{} (mode {mode:04o}, owner {}:{})",
            n.host_path.display(),
            n.uid,
            n.gid
        );
        if mode & 0o006 == 0o006 || (n.uid == who.uid && mode & 0o600 == 0o600) {
            continue;
        }
        if who.groups.contains(&n.gid) && mode & 0o060 == 0o060 {
            by_group.push(shown);
        } else {
            closed.push(shown);
        }
    }
    (closed, by_group)
}

fn specs(config: &Config) -> Check {
    let mut unreadable = Vec::new();
    let mut found = 0;
    for dir in &config.cdi_spec_dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if !p.extension().is_some_and(|x| x == "yaml" || x == "json") {
                continue;
            }
            found += 1;
            if std::fs::File::open(&p).is_err() {
                unreadable.push(p.display().to_string());
            }
        }
    }
    if unreadable.is_empty() {
        return check(
            "rootless-spec",
            Status::Ok,
            format!("{found} CDI spec files, all readable by this user"),
            None,
        );
    }
    check(
        "rootless-spec",
        Status::Error,
        format!(
            "this user cannot read {}: rootless podman does not see their devices",
            unreadable.join(", ")
        ),
        Some(format!("chmod 0644 {}", unreadable.join(" "))),
    )
}

/// The ids in `file`'s lines for the user (by name or uid).
fn subordinate(file: &str, who: &Who) -> u64 {
    file.lines()
        .filter_map(|l| {
            let mut f = l.trim().split(':');
            let (user, _, count) = (f.next()?, f.next()?, f.next()?);
            (user == who.name || user == who.uid.to_string())
                .then(|| count.parse::<u64>().ok())
                .flatten()
        })
        .sum()
}

fn subids(who: &Who, subuid: Option<&str>, subgid: Option<&str>) -> Check {
    let fix = format!(
        "usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {}, and install newuidmap/newgidmap (Debian: apt-get install uidmap)",
        who.name
    );
    let (u, g) = (
        subordinate(subuid.unwrap_or(""), who),
        subordinate(subgid.unwrap_or(""), who),
    );
    let tools = ["/usr/bin/newuidmap", "/usr/bin/newgidmap"]
        .into_iter()
        .filter(|t| !Path::new(t).exists())
        .collect::<Vec<_>>();
    if u == 0 || g == 0 || !tools.is_empty() {
        return check(
            "rootless-subids",
            Status::Error,
            format!(
                "{}: {u} subordinate uids, {g} gids{}; podman's default rootless mapping and --userns=keep-id need both",
                who.name,
                if tools.is_empty() {
                    String::new()
                } else {
                    format!(", {} missing", tools.join(" and "))
                }
            ),
            Some(fix),
        );
    }
    let status = if u < 65536 || g < 65536 {
        Status::Warning
    } else {
        Status::Ok
    };
    check(
        "rootless-subids",
        status,
        format!(
            "{}: {u} subordinate uids, {g} gids (65,536 each map a whole image)",
            who.name
        ),
        (status != Status::Ok).then_some(fix),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who() -> Who {
        Who {
            uid: 1000,
            name: "alice".into(),
            groups: vec![1000],
        }
    }

    #[test]
    fn node_access_by_mode_owner_and_group() {
        let node = |name: &str, mode: u32, uid: u32, gid: u32| HostDeviceNode {
            container_path: format!("/dev/{name}"),
            host_path: format!("/dev/{name}").into(),
            kind: 'c',
            major: 195,
            minor: 0,
            file_mode: 0o20000 | mode,
            uid,
            gid,
        };
        let nodes = [
            node("nvidia0", 0o666, 0, 0),
            node("dri/card0", 0o660, 0, 44),
            node("dri/renderD128", 0o660, 0, 105),
            node("mine", 0o600, 1000, 0),
        ];
        let who = Who {
            groups: vec![1000, 44],
            ..who()
        };
        let (closed, by_group) = access(&nodes, &who);
        assert_eq!(closed, ["/dev/dri/renderD128 (mode 0660, owner 0:105)"]);
        assert_eq!(by_group, ["/dev/dri/card0 (mode 0660, owner 0:44)"]);
    }

    #[test]
    fn subordinate_ids_by_name_or_uid() {
        let c = subids(
            &who(),
            Some("bob:100000:65536\nalice:165536:65536\n"),
            Some("1000:1:10\n"),
        );
        assert_eq!(c.status, Status::Warning, "{c:?}");
        assert!(
            c.message.contains("65536 subordinate uids, 10 gids"),
            "{c:?}"
        );
        let c = subids(&who(), Some("bob:100000:65536\n"), None);
        assert_eq!(c.status, Status::Error, "{c:?}");
        assert!(c.fix.unwrap().contains("usermod --add-subuids"));
    }

    #[test]
    fn unreadable_specs_are_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("nvidia.yaml"), "x").unwrap();
        let config = Config {
            cdi_spec_dirs: vec![dir.path().to_path_buf(), "/nonexistent".into()],
            ..Config::default()
        };
        let c = specs(&config);
        assert_eq!(
            (c.status, c.message.as_str()),
            (Status::Ok, "1 CDI spec files, all readable by this user")
        );
    }
}
