//! The device plugin's allocate response as the kubelet records it: the `AllocResp` of a
//! checkpoint entry (kubelet `devicemanager/checkpoint`) is Go's JSON of a `[]byte`, standard
//! base64 of the protobuf `ContainerAllocateResponse` (k8s.io/kubelet
//! `pkg/apis/deviceplugin/v1beta1/api.proto`: 1 `map<string, string> envs`, 2 mounts,
//! 3 devices, 4 annotations, 5 cdi_devices). Only `envs` is read: it is what the device plugin
//! set in the container's environment (NVIDIA's `internal/plugin/server.go`,
//! `getAllocateResponse`: `NVIDIA_VISIBLE_DEVICES`, and `NVIDIA_GDS`, `NVIDIA_MOFED`,
//! `NVIDIA_GDRCOPY` = `enabled` when run with `--gds-enabled`, `--mofed-enabled`,
//! `--gdrcopy-enabled`). prost skips the other fields.

use std::collections::HashMap;

use base64::Engine;

#[derive(Clone, PartialEq, prost::Message)]
struct ContainerAllocateResponse {
    #[prost(map = "string, string", tag = "1")]
    envs: HashMap<String, String>,
}

/// The environment an `AllocResp` value gives the container, sorted by name; `None` when it
/// is not base64 of such a message.
pub fn allocate_envs(alloc_resp: &str) -> Option<Vec<(String, String)>> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(alloc_resp)
        .ok()?;
    let resp = <ContainerAllocateResponse as prost::Message>::decode(bytes.as_slice()).ok()?;
    let mut envs: Vec<(String, String)> = resp.envs.into_iter().collect();
    envs.sort_unstable();
    Some(envs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_envs_and_skips_the_rest() {
        use nvshim_testsupport::kubelet::allocate_response;
        let mut msg = allocate_response(&[("NVIDIA_VISIBLE_DEVICES", "GPU-a,GPU-b")]);
        // A mount (field 2: container_path = 1) and an annotation (field 4, a map entry as
        // field 1's) are skipped.
        msg.extend([0x12, 4, 0x0a, 2, b'/', b'x']);
        let mut annotation = allocate_response(&[("cdi.k8s.io/x", "nvidia.com/gpu=0")]);
        annotation[0] = (4 << 3) | 2;
        msg.extend(annotation);
        msg.extend(allocate_response(&[("NVIDIA_GDS", "enabled")]));
        let b64 = base64::engine::general_purpose::STANDARD.encode(&msg);
        assert_eq!(
            allocate_envs(&b64).unwrap(),
            [
                ("NVIDIA_GDS".to_string(), "enabled".to_string()),
                (
                    "NVIDIA_VISIBLE_DEVICES".to_string(),
                    "GPU-a,GPU-b".to_string()
                ),
            ]
        );
    }

    #[test]
    fn empty_and_malformed() {
        assert_eq!(allocate_envs("").unwrap(), []);
        assert_eq!(allocate_envs("not base64!"), None);
        // A length running past the end.
        let b64 = base64::engine::general_purpose::STANDARD.encode([0x0a, 9, 0x0a]);
        assert_eq!(allocate_envs(&b64), None);
    }
}
