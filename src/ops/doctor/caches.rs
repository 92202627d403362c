//! `nvshim doctor`'s view of `cache-dir`: the `cache-dir` check, and `--caches` and
//! `--clear-caches`, which list and remove nvshim's files there (`crate::cache::list`).

use std::fmt::Write as _;
use std::path::Path;

use super::{check, Check, Status};
use crate::cache::{self, CacheFile};
use crate::config::Config;

/// How many of nvshim's files `cache-dir` holds, and a warning for any nvshim ignores (not
/// root's, or writable by others: someone else wrote it), or for a `cache-dir` the config
/// refused (`Config::cache_dir_refused`).
pub fn cache_check(config: &Config) -> Check {
    if let Some(why) = &config.cache_dir_refused {
        return check(
            "cache-dir",
            Status::Warning,
            format!("not used, every create reads the host again ({why})"),
            Some("make cache-dir and its parent owned by root, writable by root only".into()),
        );
    }
    let dir = config.cache_dir.as_path();
    if dir.as_os_str().is_empty() {
        return check("cache-dir", Status::Ok, "off (cache-dir = \"\")", None);
    }
    let shown = dir.display();
    match cache::list(dir) {
        Err(e) => check(
            "cache-dir",
            Status::Warning,
            format!("{shown} cannot be listed: {e}; every create reads the host again"),
            Some(format!("make {shown} a directory owned by root, mode 0700")),
        ),
        Ok(files) => {
            let ignored = files.iter().filter(|f| !f.used).count();
            let bytes: u64 = files.iter().map(|f| f.bytes).sum();
            let summary = format!(
                "{shown}: {} files of at most {}, {} KiB",
                files.len(),
                cache::MAX_FILES,
                bytes.div_ceil(1024)
            );
            if ignored == 0 {
                check("cache-dir", Status::Ok, summary, None)
            } else {
                check(
                    "cache-dir",
                    Status::Warning,
                    format!("{summary}; {ignored} ignored (not root's, or writable by others)"),
                    Some("nvshim doctor --clear-caches".into()),
                )
            }
        }
    }
}

/// `--caches`: one line per file (size, age, whether used); `--clear-caches` (`clear`): the
/// files removed. The text printed, and whether it went well.
pub fn caches_command(dir: &Path, clear: bool) -> (String, bool) {
    if dir.as_os_str().is_empty() {
        return (
            "cache-dir is off (cache-dir = \"\"): nothing kept\n".into(),
            true,
        );
    }
    let shown = dir.display();
    if clear {
        return match cache::clear(dir) {
            Ok(n) => (format!("removed {n} cache files from {shown}\n"), true),
            Err(e) => (format!("cannot clear {shown}: {e}\n"), false),
        };
    }
    match cache::list(dir) {
        Ok(files) => (render(dir, &files), true),
        Err(e) => (format!("cannot list {shown}: {e}\n"), false),
    }
}

fn render(dir: &Path, files: &[CacheFile]) -> String {
    let mut o = String::new();
    for f in files {
        let name = f.path.strip_prefix(dir).unwrap_or(&f.path).display();
        let used = if f.used { "used" } else { "ignored" };
        let _ = writeln!(
            o,
            "{name}  {} bytes  {}s old  {used}",
            f.bytes,
            f.age.as_secs()
        );
    }
    let _ = writeln!(
        o,
        "{} cache files in {} (at most {})",
        files.len(),
        dir.display(),
        cache::MAX_FILES
    );
    o
}
