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
