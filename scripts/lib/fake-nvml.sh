# Sourced by the scripts that put the fake NVML (tests/fake-nvml) in place of a simulated
# host's libnvidia-ml: the bench and the package smoke test.
#
#   fake_nvml_topology HOST [FIELDS] > FILE
#
# prints the fake's topology JSON for the host built by nvshim-fake-host in HOST: the driver
# version (the banner's first N.N[.N]: the open modules' banner has words between "Module" and
# the version), CUDA 13.0, and one GPU per proc/driver/nvidia/gpus/*/information (the
# directories sort in bus order, NVML's order). A GPU with MIG instances under
# proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/ci<C> (`nvshim-fake-host --mig N`) has
# MIG enabled and one MIG device per instance, `MIG-<minor>-<G>-4000-8000-<C>` in hex.
# FIELDS: more top-level JSON fields, written as `"memoryLimits":true,`.
fake_nvml_topology() {
    local host="$1" fields="${2:-}" sep= info minor ci gi migsep migs
    printf '{%s"driverVersion":"%s","cudaDriverVersion":13000,"gpus":[' "$fields" \
        "$(head -n1 "$host/proc/driver/nvidia/version" | grep -o '[0-9]\+\.[0-9]\+\(\.[0-9]\+\)*' | head -n1)"
    for info in "$host"/proc/driver/nvidia/gpus/*/information; do
        minor="$(sed -n 's/^Device Minor: *//p' "$info")"
        migs= migsep=
        for ci in "$host/proc/driver/nvidia/capabilities/gpu$minor"/mig/gi*/ci*; do
            [ -d "$ci" ] || continue
            gi="${ci%/ci*}"; gi="${gi##*/gi}"; ci="${ci##*/ci}"
            migs="$migs$(printf '%s{"uuid":"MIG-%08x-%04x-4000-8000-%012x","gpuInstanceId":%s,"computeInstanceId":%s,"profile":"1g.18gb","sliceCount":1}' \
                "$migsep" "$minor" "$gi" "$ci" "$gi" "$ci")"
            migsep=,
        done
        printf '%s{"name":"%s","uuid":"%s","minor":%s,"busId":"%s","memoryTotal":85899345920%s}' "$sep" \
            "$(sed -n 's/^Model: *//p' "$info")" "$(sed -n 's/^GPU UUID: *//p' "$info")" \
            "$minor" "$(sed -n 's/^Bus Location: *//p' "$info")" \
            "${migs:+,\"migEnabled\":true,\"migDevices\":[$migs]}"
        sep=,
    done
    printf ']}\n'
}
