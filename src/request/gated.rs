//! The feature-gated requests: `NVIDIA_GDS`, `NVIDIA_MOFED`, `NVIDIA_GDRCOPY` and
//! `NVIDIA_NVSWITCH`, each asked for with exactly `enabled` (NVIDIA's
//! `internal/modifier/cdi.go`, `gatedDevices`: any other value, `true` or `Enabled` included,
//! asks for nothing). NVIDIA serves them only beside a device request
//! (`internal/modifier/gated.go`), so [`super::from_spec`] reads them only then.

use crate::host::gated::Feature;

/// The value that enables a feature.
pub const ENABLED: &str = "enabled";

/// The features `env` enables, in [`Feature::ALL`]'s order.
pub fn parse(env: &[(&str, &str)]) -> Vec<Feature> {
    Feature::ALL
        .into_iter()
        .filter(|f| super::lookup(env, f.variable()) == Some(ENABLED))
        .collect()
}

/// The fix a refused feature variable names ([`super::env_policy`]): NVIDIA's device plugin
/// sets the variable in its allocate response when run with the feature's flag
/// (`internal/plugin/server.go`, `getAllocateResponse`); it has none for NVSwitch.
pub fn fix(feature: Feature) -> String {
    let rest = "unset the variable in the pod, or run the container privileged; on a node where every pod may use these devices set accept-envvar-unprivileged = true";
    let flag = match feature {
        Feature::Gds => "--gds-enabled",
        Feature::Mofed => "--mofed-enabled",
        Feature::Gdrcopy => "--gdrcopy-enabled",
        Feature::Nvswitch => return format!("NVIDIA's device plugin never sets it: {rest}"),
    };
    format!("run the device plugin with {flag} (its allocation then sets the variable) and set accept-envvar-unprivileged = \"allocation-backed\" (read from the kubelet's device checkpoint on containerd nodes), or {rest}")
}

/// Whether `var` is one of the feature variables.
pub fn is_variable(var: &str) -> bool {
    Feature::ALL.iter().any(|f| f.variable() == var)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_value_enabled_asks() {
        let env = [
            ("NVIDIA_GDS", "enabled"),
            ("NVIDIA_MOFED", "true"),
            ("NVIDIA_GDRCOPY", "Enabled"),
            ("NVIDIA_NVSWITCH", " enabled"),
        ];
        assert_eq!(parse(&env), vec![Feature::Gds]);
        assert_eq!(parse(&[("NVIDIA_GDS", "")]), vec![]);
        assert_eq!(parse(&[]), vec![]);
    }

    #[test]
    fn every_feature_in_nvidias_order() {
        let env = [
            ("NVIDIA_NVSWITCH", "enabled"),
            ("NVIDIA_GDRCOPY", "enabled"),
            ("NVIDIA_MOFED", "enabled"),
            ("NVIDIA_GDS", "enabled"),
        ];
        assert_eq!(
            parse(&env),
            vec![
                Feature::Gds,
                Feature::Mofed,
                Feature::Gdrcopy,
                Feature::Nvswitch
            ]
        );
    }
}
