//! How `nvshim-nri` answers a container whose route [`crate::request::route`] chose: the one
//! home of that choice, which the plugin applies and logs per container and `nvshim explain`
//! states for a bundle.
//!
//! A CDI request becomes CDI device names the engine injects from its own registry where the
//! engine resolves names in an NRI adjustment (containerd 2.1 and CRI-O 1.34 were the first),
//! unless the container has its own user namespace: the engine's injection then gives runc
//! device nodes to bind from their container path, not from `dev-root`. Everything else is a
//! raw adjustment: the device nodes, mounts, environment and hooks `create` would write.

use crate::request::Route;

/// An NRI engine, as its `Configure` names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Engine {
    pub name: String,
    pub version: String,
}

impl Engine {
    /// Whether the engine resolves CDI device names in an adjustment itself.
    pub fn injects_cdi(&self) -> bool {
        let Some((major, minor)) = major_minor(&self.version) else {
            return false;
        };
        match self.name.as_str() {
            "containerd" => (major, minor) >= (2, 1),
            "cri-o" | "crio" | "CRI-O" => (major, minor) >= (1, 34),
            _ => false,
        }
    }
}

fn major_minor(version: &str) -> Option<(u32, u32)> {
    let v = version.trim().trim_start_matches('v');
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// How a container is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// No GPU request.
    Nothing,
    /// Device nodes, mounts, env and hooks from nvshim's resolvers.
    Raw,
    /// CDI device names for the engine to inject, from its own CDI registry.
    NativeCdi,
}

impl How {
    pub fn name(self) -> &'static str {
        match self {
            How::Nothing => "nothing",
            How::Raw => "raw adjustment",
            How::NativeCdi => "NRI CDI injection",
        }
    }
}

/// The answer for `route`. `touched`: the plan edits the container though it asks for no
/// GPU (a Docker `--gpus` hook removed, say). `no_native_cdi`: the plugin's
/// `--no-native-cdi`. `user_namespace`: the container has its own.
pub fn how(
    route: &Route,
    touched: bool,
    engine: &Engine,
    no_native_cdi: bool,
    user_namespace: bool,
) -> How {
    match route {
        Route::Nothing(_) if !touched => How::Nothing,
        Route::Cdi(..) if engine.injects_cdi() && !no_native_cdi && !user_namespace => {
            How::NativeCdi
        }
        _ => How::Raw,
    }
}

/// `how` on each engine family's releases, for a reader who does not know the engine:
/// `nvshim explain`'s line.
pub fn describe(route: &Route, touched: bool, user_namespace: bool) -> String {
    let old = Engine {
        name: "containerd".into(),
        version: "1.7".into(),
    };
    let new = Engine {
        name: "containerd".into(),
        version: "2.1".into(),
    };
    match (
        how(route, touched, &new, false, user_namespace),
        how(route, touched, &old, false, user_namespace),
    ) {
        (How::NativeCdi, older) => format!(
            "{} on containerd 2.1+ and CRI-O 1.34+ (the engine injects the CDI devices); {} on older engines",
            How::NativeCdi.name(),
            older.name()
        ),
        (How::Raw, _) if user_namespace && matches!(route, Route::Cdi(..)) => format!(
            "{} (a user namespace: the engine's CDI injection would bind nodes from their container path)",
            How::Raw.name()
        ),
        (how, _) => how.name().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Reason;

    fn engine(name: &str, version: &str) -> Engine {
        Engine {
            name: name.into(),
            version: version.into(),
        }
    }

    #[test]
    fn engines_that_inject_cdi() {
        assert!(engine("containerd", "2.1.9").injects_cdi());
        assert!(engine("containerd", "v2.3.4").injects_cdi());
        assert!(engine("containerd", "2.3.0-rc.1").injects_cdi());
        assert!(!engine("containerd", "unknown").injects_cdi());
        assert!(!engine("containerd", "1.7.24").injects_cdi());
        assert!(!engine("containerd", "2.0.5").injects_cdi());
        assert!(engine("cri-o", "1.36.3").injects_cdi());
        assert!(!engine("cri-o", "1.33.0").injects_cdi());
        assert!(!engine("other", "9.9").injects_cdi());
        assert!(!engine("containerd", "").injects_cdi());
    }

    #[test]
    fn cdi_requests_are_injected_by_new_engines_outside_user_namespaces() {
        let cdi = Route::Cdi(vec!["nvidia.com/gpu=0".into()], Reason::QualifiedNames);
        let new = engine("containerd", "2.1.9");
        assert_eq!(how(&cdi, true, &new, false, false), How::NativeCdi);
        assert_eq!(how(&cdi, true, &new, true, false), How::Raw);
        assert_eq!(how(&cdi, true, &new, false, true), How::Raw);
        assert_eq!(
            how(&cdi, true, &engine("containerd", "1.7.24"), false, false),
            How::Raw
        );
        let text = describe(&cdi, true, false);
        assert!(
            text.starts_with("NRI CDI injection on containerd 2.1+"),
            "{text}"
        );
        assert!(text.ends_with("raw adjustment on older engines"), "{text}");
        assert!(describe(&cdi, true, true).contains("user namespace"));
    }
}
