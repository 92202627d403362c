//! `nvshim-bench SPEC.json [--out RESULTS.json]`: the timing harness behind `scripts/bench.sh`.
//!
//! Why not hyperfine alone: hyperfine runs all of one command's runs, then all of the next
//! one's, so on a shared 2-core machine a burst of load from elsewhere lands on one command and
//! not on its baseline. This harness interleaves: every round runs each command once, in an
//! order shuffled each round (a fixed-seed generator, so runs are repeatable), so a command and
//! its baseline see the same conditions. Shuffled, not rotated: a rotation keeps every command
//! right after the same neighbour, and a container start measured just after another
//! container's teardown was seen to differ by several ms from one measured after a cheap
//! command. Medians and the interquartile range are reported, not means, for the same reason.
//!
//! Each command is a list of steps (argv vectors, no shell) run one after the other and timed
//! together, from just before the first spawn to the end of the last wait; `prepare` steps run
//! before it, untimed (to put config.json back, say). Stdout and stderr go to /dev/null; stdin
//! is `/dev/null` or the file named by `stdin` (OCI hooks read the state there).
//!
//! Peak memory is measured in a separate pass with GNU time's `%M` (`/usr/bin/time -f %M`), the
//! figure NVIDIA's numbers are given in; for a step that execs another program (the shim execs
//! `/bin/true`), it is the peak over the whole process, before and after the exec.
//!
//! The spec:
//! ```json
//! {"runs": 50, "warmup": 5, "mem_runs": 5,
//!  "commands": [{"name": "floor", "steps": [["/tmp/floor", "state", "x"]],
//!                "prepare": [["cp", "a", "b"]], "env": {"K": "V"}, "stdin": "/path"}],
//!  "rows": [{"figure": "state (shim)", "cmd": "shim-state", "baseline": "floor",
//!            "goal_ms": 0.1}, {"figure": "peak RSS", "cmd": "shim-state", "metric": "rss",
//!            "baseline": "true", "goal_kib": 3072}]}
//! ```
//! It prints one Markdown table: each row's figure, baseline, difference and ratio, and whether
//! the goal holds.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    #[serde(default = "default_runs")]
    runs: usize,
    #[serde(default)]
    warmup: usize,
    #[serde(default)]
    mem_runs: usize,
    commands: Vec<CommandSpec>,
    #[serde(default)]
    rows: Vec<Row>,
}

fn default_runs() -> usize {
    30
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandSpec {
    name: String,
    steps: Vec<Vec<String>>,
    #[serde(default)]
    prepare: Vec<Vec<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    stdin: Option<PathBuf>,
    /// Only time it; no memory pass (multi-step commands whose peak is runc's).
    #[serde(default)]
    no_mem: bool,
    /// The sample is what the steps measured themselves, not their wall time: the sum of the
    /// nanosecond lines written to this file during the run (emptied before it). A hook timed
    /// in place under runc (`scripts/bench/hook-timer.c`) writes one line per hook run.
    #[serde(default)]
    measured_by: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    figure: String,
    cmd: String,
    #[serde(default)]
    baseline: Option<String>,
    /// `time` (default) or `rss`.
    #[serde(default)]
    metric: Option<String>,
    /// Goal on the difference from the baseline, in ms; without a baseline, on the figure.
    #[serde(default)]
    goal_ms: Option<f64>,
    /// Goal on the absolute peak RSS, in KiB.
    #[serde(default)]
    goal_kib: Option<u64>,
    #[serde(default)]
    note: Option<String>,
}

#[derive(Debug, Serialize)]
struct Stats {
    name: String,
    samples_ms: Vec<f64>,
    median_ms: f64,
    p25_ms: f64,
    p75_ms: f64,
    min_ms: f64,
    max_ms: f64,
    rss_kib: Vec<u64>,
    median_rss_kib: Option<u64>,
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // Linear interpolation between closest ranks (type 7, as R and numpy default).
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

fn command(argv: &[String], env: &BTreeMap<String, String>) -> Result<Command> {
    let Some((program, args)) = argv.split_first() else {
        bail!("empty argv in the spec");
    };
    let mut c = Command::new(program);
    c.args(args)
        .envs(env)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Ok(c)
}

fn run_checked(
    argv: &[String],
    env: &BTreeMap<String, String>,
    stdin: Option<&PathBuf>,
) -> Result<()> {
    let mut c = command(argv, env)?;
    c.stdin(match stdin {
        Some(p) => Stdio::from(File::open(p).with_context(|| format!("opening {}", p.display()))?),
        None => Stdio::null(),
    });
    let status = c
        .status()
        .with_context(|| format!("running {}", argv.join(" ")))?;
    ensure!(status.success(), "{} exited with {status}", argv.join(" "));
    Ok(())
}

/// Runs the command's steps once; returns the wall time in ms.
fn time_once(cmd: &CommandSpec) -> Result<f64> {
    for p in &cmd.prepare {
        run_checked(p, &cmd.env, None)?;
    }
    // Open stdin and build the commands before the clock starts.
    let mut prepared = Vec::with_capacity(cmd.steps.len());
    for step in &cmd.steps {
        let mut c = command(step, &cmd.env)?;
        c.stdin(match &cmd.stdin {
            Some(p) => {
                Stdio::from(File::open(p).with_context(|| format!("opening {}", p.display()))?)
            }
            None => Stdio::null(),
        });
        prepared.push((step, c));
    }
    if let Some(log) = &cmd.measured_by {
        std::fs::write(log, "").with_context(|| format!("emptying {}", log.display()))?;
    }
    let start = Instant::now();
    for (step, c) in &mut prepared {
        let status = c
            .status()
            .with_context(|| format!("running {}", step.join(" ")))?;
        ensure!(
            status.success(),
            "{}: {} exited with {status}",
            cmd.name,
            step.join(" ")
        );
    }
    let wall = start.elapsed().as_secs_f64() * 1e3;
    let Some(log) = &cmd.measured_by else {
        return Ok(wall);
    };
    let text =
        std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    let mut ns = 0u64;
    for line in text.lines() {
        ns += line.trim().parse::<u64>().with_context(|| {
            format!("{}: {line:?} is not a count of nanoseconds", log.display())
        })?;
    }
    ensure!(ns > 0, "{}: no time written to {}", cmd.name, log.display());
    Ok(ns as f64 / 1e6)
}

/// Peak RSS (KiB) of the command's steps, as GNU time's `%M` reports it (the largest step).
fn rss_once(cmd: &CommandSpec, scratch: &std::path::Path) -> Result<u64> {
    for p in &cmd.prepare {
        run_checked(p, &cmd.env, None)?;
    }
    let out = scratch.join("time-M");
    let mut peak = 0;
    for step in &cmd.steps {
        let mut argv = vec![
            "/usr/bin/time".to_string(),
            "-f".into(),
            "%M".into(),
            "-o".into(),
            out.display().to_string(),
        ];
        argv.extend(step.iter().cloned());
        run_checked(&argv, &cmd.env, cmd.stdin.as_ref())?;
        let text =
            std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
        let kib: u64 = text
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .parse()
            .with_context(|| format!("GNU time wrote {text:?}"))?;
        peak = peak.max(kib);
    }
    Ok(peak)
}

/// xorshift64: enough to shuffle a few dozen commands without a dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Fisher–Yates.
fn shuffle(v: &mut [usize], state: &mut u64) {
    for i in (1..v.len()).rev() {
        let j = (next(state) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

fn fmt_ms(v: f64) -> String {
    format!("{v:.3} ms")
}

fn main() -> ExitCode {
    match real_main() {
        Ok(true) => ExitCode::SUCCESS,
        // Some goal does not hold: the table says which; still a successful measurement.
        Ok(false) => ExitCode::from(3),
        Err(e) => {
            eprintln!("nvshim-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main() -> Result<bool> {
    let mut args = std::env::args_os().skip(1);
    let spec_path = PathBuf::from(
        args.next()
            .context("usage: nvshim-bench SPEC.json [--out RESULTS.json]")?,
    );
    let mut out_path = None;
    while let Some(a) = args.next() {
        match a.to_str() {
            Some("--out") => out_path = args.next().map(PathBuf::from),
            _ => bail!("unexpected argument {a:?}"),
        }
    }
    let text = std::fs::read_to_string(&spec_path)
        .with_context(|| format!("reading {}", spec_path.display()))?;
    let spec: Spec =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", spec_path.display()))?;
    ensure!(!spec.commands.is_empty(), "the spec has no commands");
    let scratch = tempfile::tempdir().context("creating a scratch dir")?;

    let n = spec.commands.len();
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(spec.runs); n];
    let mut rng: u64 = 0x6e76_7368_696d_6265;
    for round in 0..spec.warmup + spec.runs {
        let mut order: Vec<usize> = (0..n).collect();
        shuffle(&mut order, &mut rng);
        for i in order {
            let ms = time_once(&spec.commands[i])?;
            if round >= spec.warmup {
                samples[i].push(ms);
            }
        }
    }
    let mut stats: Vec<Stats> = Vec::with_capacity(n);
    for (cmd, mut s) in spec.commands.iter().zip(samples) {
        let mut rss = Vec::new();
        if !cmd.no_mem {
            for _ in 0..spec.mem_runs {
                rss.push(rss_once(cmd, scratch.path())?);
            }
        }
        let raw = s.clone();
        s.sort_by(f64::total_cmp);
        let mut sorted_rss = rss.clone();
        sorted_rss.sort_unstable();
        stats.push(Stats {
            name: cmd.name.clone(),
            median_ms: quantile(&s, 0.5),
            p25_ms: quantile(&s, 0.25),
            p75_ms: quantile(&s, 0.75),
            min_ms: s.first().copied().unwrap_or(f64::NAN),
            max_ms: s.last().copied().unwrap_or(f64::NAN),
            samples_ms: raw,
            median_rss_kib: sorted_rss.get(sorted_rss.len() / 2).copied(),
            rss_kib: rss,
        });
    }
    if let Some(p) = &out_path {
        let json = serde_json::to_string_pretty(&stats)?;
        std::fs::write(p, json).with_context(|| format!("writing {}", p.display()))?;
    }
    let by_name: BTreeMap<&str, &Stats> = stats.iter().map(|s| (s.name.as_str(), s)).collect();
    let get = |name: &str| {
        by_name
            .get(name)
            .copied()
            .with_context(|| format!("row names unknown command {name:?}"))
    };

    println!(
        "| figure | nvshim | spread (p25–p75) | baseline | baseline figure | difference | ratio | goal |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut all_met = true;
    for row in &spec.rows {
        let s = get(&row.cmd)?;
        let base = row.baseline.as_deref().map(get).transpose()?;
        let note = row
            .note
            .as_deref()
            .map(|n| format!(" {n}"))
            .unwrap_or_default();
        if row.metric.as_deref() == Some("rss") {
            let v = s.median_rss_kib.context("no memory samples")?;
            let (bname, bval, diff, ratio) = match base {
                Some(b) => {
                    let bv = b.median_rss_kib.context("no memory samples")?;
                    (
                        b.name.as_str(),
                        format!("{:.2} MiB", bv as f64 / 1024.0),
                        format!("{:+.2} MiB", (v as f64 - bv as f64) / 1024.0),
                        format!("{:.2}×", v as f64 / bv as f64),
                    )
                }
                None => ("–", "–".into(), "–".into(), "–".into()),
            };
            let goal = match row.goal_kib {
                Some(g) => {
                    let met = v <= g;
                    all_met &= met;
                    format!(
                        "≤ {:.0} MiB: {}",
                        g as f64 / 1024.0,
                        if met { "met" } else { "**not met**" }
                    )
                }
                None => "–".into(),
            };
            println!(
                "| {}{note} | {:.2} MiB | {}–{} KiB | {bname} | {bval} | {diff} | {ratio} | {goal} |",
                row.figure,
                v as f64 / 1024.0,
                s.rss_kib.iter().min().copied().unwrap_or_default(),
                s.rss_kib.iter().max().copied().unwrap_or_default(),
            );
            continue;
        }
        let (bname, bval, diff, ratio, d) = match base {
            Some(b) => {
                let d = s.median_ms - b.median_ms;
                (
                    b.name.as_str(),
                    fmt_ms(b.median_ms),
                    format!("{d:+.3} ms"),
                    format!("{:.2}×", s.median_ms / b.median_ms),
                    Some(d),
                )
            }
            None => ("–", "–".into(), "–".into(), "–".into(), None),
        };
        let goal = match (row.goal_ms, d) {
            (Some(g), Some(d)) => {
                let met = d <= g;
                all_met &= met;
                format!("≤ +{g} ms: {}", if met { "met" } else { "**not met**" })
            }
            (Some(g), None) => {
                let met = s.median_ms <= g;
                all_met &= met;
                format!("≤ {g} ms: {}", if met { "met" } else { "**not met**" })
            }
            _ => "–".into(),
        };
        println!(
            "| {}{note} | {} | {:.3}–{:.3} | {bname} | {bval} | {diff} | {ratio} | {goal} |",
            row.figure,
            fmt_ms(s.median_ms),
            s.p25_ms,
            s.p75_ms,
        );
    }
    Ok(all_met)
}
