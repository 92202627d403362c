//! Logging: nvshim's own log file through tracing, and fatal errors in the shape runc writes to
//! its `--log` file, which is where containerd looks for the reason a create failed.
//!
//! Never stdout: for `run` and for containerd's shim, stdout may be the container's console.
//! The writer is synchronous: the shim `exec`s runc, and buffered lines would be lost.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use crate::config::LogLevel;

/// Sends tracing output to `log_file` (appended). Without a file, nothing is logged. Errors
/// opening the file are ignored: logging must never stop a container.
pub fn init(log_file: Option<&Path>, level: LogLevel, debug: bool) {
    let Some(path) = log_file else {
        return;
    };
    if path == Path::new("/dev/null") {
        return;
    }
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let Ok(file) = OpenOptions::new().create(true).append(true).open(path) else {
        return;
    };
    let level = if debug {
        tracing::Level::DEBUG
    } else {
        level.as_tracing()
    };
    let _ = tracing_subscriber::fmt()
        .with_writer(Mutex::new(file))
        .with_ansi(false)
        .with_max_level(level)
        .with_target(false)
        .try_init();
}

/// One error line as runc (logrus) writes it: JSON `{"level":"error","msg":...,"time":...}`
/// for `--log-format json` (containerd parses this and reports `msg`), or logrus's text form.
pub fn runc_error_line(msg: &str, json: bool, now: std::time::SystemTime) -> String {
    let time = humantime::format_rfc3339_nanos(now).to_string();
    if json {
        serde_json::json!({"level": "error", "msg": msg, "time": time}).to_string()
    } else {
        format!(
            "time=\"{time}\" level=error msg={}",
            serde_json::Value::String(msg.to_string())
        )
    }
}

/// Appends the error to runc's `--log` file.
pub fn write_runc_error(log: &Path, json: bool, msg: &str) {
    let line = runc_error_line(msg, json, std::time::SystemTime::now());
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(log) {
        let _ = writeln!(f, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_line_shape() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let line = runc_error_line("unknown GPU \"x\"", true, t);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "error");
        assert_eq!(v["msg"], "unknown GPU \"x\"");
        assert_eq!(v["time"], "2023-11-14T22:13:20.000000000Z");
        let text = runc_error_line("boom", false, t);
        assert!(text.contains("level=error msg=\"boom\""), "{text}");
    }
}
