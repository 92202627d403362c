//! nvshim-nri's CreateContainer answer under load (scripts/bench/nri.sh runs it; figure 10 of
//! scripts/bench.sh): `--concurrency` requests at once, each on its own thread, straight into
//! the plugin's handler (what the ttRPC server calls per request), for `--rounds` rounds.
//! Requests alternate between a MIG device by UUID (`NVIDIA_VISIBLE_DEVICES`, the legacy
//! resolver, NVML's answer from cache-dir) and a `cdi.k8s.io` annotation naming a MIG device
//! of the node spec and a DRA claim's device (the spec directory of `--specs`, answered as NRI CDI injection).
//! Prints the answer times (p50, p99, max) and the process's peak RSS as one JSON line.
//!
//!   nri-bench --config C --mig-uuids U1,U2,... --claims C1,C2,... [--concurrency 50]
//!             [--rounds 20] [--only mig|cdi]

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use nvshim_nri::adjust::{Engine, Options};
use nvshim_nri::plugin::Handler;
use nvshim_nri::proto::nri;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// `--only mig` or `--only cdi`: one kind of request (to see what each costs).
fn request(n: usize, migs: &[String], claims: &[String]) -> nri::CreateContainerRequest {
    let only = std::env::args()
        .skip_while(|a| a != "--only")
        .nth(1)
        .unwrap_or_default();
    let mig = match only.as_str() {
        "mig" => true,
        "cdi" => false,
        _ => n % 2 == 0,
    };
    let mut c = nri::Container::new();
    c.id = format!("{n:064x}");
    c.name = format!("c{n}");
    c.env = vec!["PATH=/usr/bin:/bin".into()];
    if mig {
        c.env.push(format!(
            "NVIDIA_VISIBLE_DEVICES={}",
            migs[(n / 2) % migs.len()]
        ));
    } else {
        c.annotations.insert(
            "cdi.k8s.io/claim".into(),
            // A MIG device of the node spec (`<gpu>:<mig>`: every GPU has MIG on here).
            format!(
                "nvidia.com/gpu={}:{},{}",
                (n / 2) % 8,
                (n / 2) % 7,
                claims[(n / 2) % claims.len()]
            ),
        );
    }
    // The kubelet's container: device cgroup rules of an unprivileged one.
    let mut rule = nri::LinuxDeviceCgroup::new();
    rule.access = "rwm".into();
    let mut res = nri::LinuxResources::new();
    res.devices.push(rule);
    let mut linux = nri::LinuxContainer::new();
    linux.resources = Some(res).into();
    c.linux = Some(linux).into();
    let mut pod = nri::PodSandbox::new();
    pod.name = "bench".into();
    pod.namespace = "default".into();
    nri::CreateContainerRequest {
        pod: Some(pod).into(),
        container: Some(c).into(),
        ..Default::default()
    }
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let config = arg(&args, "--config").expect("--config");
    let migs: Vec<String> = arg(&args, "--mig-uuids")
        .expect("--mig-uuids")
        .split(',')
        .map(String::from)
        .collect();
    let claims: Vec<String> = arg(&args, "--claims")
        .expect("--claims")
        .split(',')
        .map(String::from)
        .collect();
    let concurrency: usize = arg(&args, "--concurrency").map_or(50, |v| v.parse().unwrap());
    let rounds: usize = arg(&args, "--rounds").map_or(20, |v| v.parse().unwrap());
    let handler = Arc::new(Handler::new(config.into(), Options::default(), false));
    handler.set_engine(Engine {
        name: "containerd".into(),
        version: "2.1.9".into(),
    });
    // One answer of each kind first: a failing request fails the bench, not its figures.
    for n in 0..2 {
        handler
            .create(&request(n, &migs, &claims))
            .unwrap_or_else(|e| panic!("request {n}: {e}"));
    }
    let mut times: Vec<Duration> = Vec::new();
    for round in 0..rounds {
        let barrier = Arc::new(Barrier::new(concurrency));
        let threads: Vec<_> = (0..concurrency)
            .map(|i| {
                let handler = Arc::clone(&handler);
                let barrier = Arc::clone(&barrier);
                let req = request(round * concurrency + i, &migs, &claims);
                std::thread::spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let answer = handler.create(&req);
                    let took = start.elapsed();
                    answer.expect("a request the bench makes is served");
                    took
                })
            })
            .collect();
        times.extend(threads.into_iter().map(|t| t.join().unwrap()));
    }
    times.sort_unstable();
    let at = |q: f64| times[((times.len() as f64 * q).ceil() as usize).clamp(1, times.len()) - 1];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{{\"requests\":{},\"concurrency\":{concurrency},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"max_ms\":{:.3},\"peak_rss_kib\":{}}}",
        times.len(),
        ms(at(0.50)),
        ms(at(0.99)),
        ms(at(1.0)),
        peak_rss_kib()
    );
}
