//! What the benchmarks' reports share: statistics, tables, headings, the provenance lines
//! (command, date, nproc) and printing plus the Markdown copy.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

/// The median, `None` for no values.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 0 {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// A number with `decimals` places, or `-` for none.
pub fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map(|v| format!("{v:.decimals$}"))
        .unwrap_or_else(|| "-".into())
}

/// `a / b` with three places, or `-` when either is missing or `b` is not positive.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.3}", a / b),
        _ => "-".into(),
    }
}

/// A report being written, as plain text for the terminal or as Markdown for `--out`.
/// `write!` appends to it.
pub struct Doc {
    pub md: bool,
    out: String,
}

impl std::fmt::Write for Doc {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.out.push_str(s);
        Ok(())
    }
}

impl Doc {
    pub fn new(md: bool) -> Doc {
        Doc {
            md,
            out: String::new(),
        }
    }

    /// A section heading: `## title` in Markdown, underlined in text.
    pub fn heading(&mut self, title: &str) {
        if self.md {
            let _ = writeln!(self.out, "\n## {title}\n");
        } else {
            let _ = writeln!(self.out, "\n{title}\n{}", "-".repeat(title.len()));
        }
    }

    /// A line of the Markdown header list (`- line`); text reports leave these out.
    pub fn item(&mut self, line: impl std::fmt::Display) {
        if self.md {
            let _ = writeln!(self.out, "- {line}");
        }
    }

    /// A paragraph after a table (Markdown needs a blank line before it).
    pub fn paragraph(&mut self, text: impl std::fmt::Display) {
        let _ = writeln!(self.out, "{}{text}", if self.md { "\n" } else { "" });
    }

    pub fn table(&mut self, t: &Table) {
        self.out.push_str(&t.render(self.md));
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// How a report came about: the command line, when, on how many CPUs.
pub struct Provenance {
    pub command: String,
    pub date: String,
    pub nproc: usize,
}

impl Provenance {
    /// This process's command line, `started_at` and the CPUs available now.
    pub fn of_this_run(started_at: SystemTime) -> Provenance {
        Provenance {
            command: shell_words(std::env::args()),
            date: format_utc(started_at),
            nproc: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
        }
    }

    /// `# title` and the provenance items (Markdown only).
    pub fn header(&self, doc: &mut Doc, title: &str) {
        if doc.md {
            let _ = writeln!(doc, "# {title}\n");
        }
        doc.item(format_args!("command: `{}`", self.command));
        doc.item(format_args!("date: {}", self.date));
        doc.item(format_args!("nproc: {}", self.nproc));
    }
}

/// Prints the text report on stdout and, with `out`, writes the Markdown one there.
pub fn publish(render: impl Fn(bool) -> String, out: Option<&Path>, tool: &str) -> Result<()> {
    println!("{}", render(false));
    if let Some(out) = out {
        fs::write(out, render(true)).with_context(|| format!("writing {}", out.display()))?;
        eprintln!("{tool}: report written to {}", out.display());
    }
    Ok(())
}

/// A small text/Markdown table.
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Table {
            headers: headers.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    fn render(&self, md: bool) -> String {
        let mut out = String::new();
        if md {
            let esc = |s: &str| s.replace('|', "\\|").replace('\n', " ");
            let _ = writeln!(out, "| {} |", self.headers.join(" | "));
            let _ = writeln!(out, "|{}", "---|".repeat(self.headers.len()));
            for r in &self.rows {
                let cells: Vec<String> = r.iter().map(|c| esc(c)).collect();
                let _ = writeln!(out, "| {} |", cells.join(" | "));
            }
            return out;
        }
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                // A failure message spans the rest of the row; don't widen the column for it.
                if c.starts_with("FAILED: ") {
                    continue;
                }
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(c.chars().count());
                }
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                let w = widths.get(i).copied().unwrap_or(0);
                let numeric = c.parse::<f64>().is_ok() || c == "-";
                if i > 0 {
                    s.push_str("  ");
                }
                if numeric {
                    let _ = write!(s, "{c:>w$}");
                } else {
                    let _ = write!(s, "{c:<w$}");
                }
            }
            s.trim_end().to_string()
        };
        let _ = writeln!(out, "{}", line(&self.headers));
        for r in &self.rows {
            let _ = writeln!(out, "{}", line(r));
        }
        out
    }
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_=./:,@+%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Words as one shell command line, quoted where needed.
pub fn shell_words<S: AsRef<str>>(words: impl IntoIterator<Item = S>) -> String {
    words
        .into_iter()
        .map(|w| shell_quote(w.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `YYYY-MM-DD HH:MM:SS UTC` without a date crate (civil-from-days, H. Hinnant).
fn format_utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_utc_dates() {
        assert_eq!(format_utc(UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
        let t = UNIX_EPOCH + Duration::from_secs(1_709_210_096); // 2024-02-29 12:34:56
        assert_eq!(format_utc(t), "2024-02-29 12:34:56 UTC");
    }

    #[test]
    fn medians_and_nearest_rank_percentiles() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&v, 95.0), Some(19.0));
        assert_eq!(percentile(&v, 100.0), Some(20.0));
        assert_eq!(percentile(&[3.0], 95.0), Some(3.0));
        assert_eq!(percentile(&[], 95.0), None);
    }

    #[test]
    fn quotes_shell_words() {
        assert_eq!(
            shell_words(["--time=5", "a b", "it's"]),
            "--time=5 'a b' 'it'\\''s'"
        );
    }

    #[test]
    fn headings_and_items_per_format() {
        let mut text = Doc::new(false);
        text.heading("Medians");
        text.item("only in Markdown");
        assert_eq!(text.finish(), "\nMedians\n-------\n");
        let mut md = Doc::new(true);
        md.heading("Medians");
        md.item("in Markdown");
        assert_eq!(md.finish(), "\n## Medians\n\n- in Markdown\n");
    }
}
