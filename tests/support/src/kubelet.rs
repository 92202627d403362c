//! What the kubelet records of a device plugin's allocation, as tests write it.

/// A protobuf `ContainerAllocateResponse` carrying only `envs` (k8s.io/kubelet
/// `pkg/apis/deviceplugin/v1beta1/api.proto`: field 1, `map<string, string>`), encoded by hand
/// from the protobuf wire format (a map entry is a length-delimited field 1 holding key = 1 and
/// value = 2), so tests do not use nvshim's decoder's own definition. The kubelet's checkpoint
/// stores it as `AllocResp`, base64 (Go's JSON of `[]byte`). Keys and values under 128 bytes.
pub fn allocate_response(envs: &[(&str, &str)]) -> Vec<u8> {
    let mut msg = Vec::new();
    for (k, v) in envs {
        assert!(k.len() < 128 && v.len() < 128, "one-byte lengths only");
        let mut entry = vec![0x0a, k.len() as u8];
        entry.extend(k.as_bytes());
        entry.extend([0x12, v.len() as u8]);
        entry.extend(v.as_bytes());
        msg.extend([0x0a, entry.len() as u8]);
        msg.extend(entry);
    }
    msg
}
