//! Reports as pictures: SVG charts drawn here (no library, no script) and a self-contained
//! HTML page around them, for `holdfast-bench drill` (throughput and latency per second,
//! the event marked, the stall shaded) and `holdfast-bench bench` (bars per target).

use std::fmt::Write as _;

/// A series of (x, y) points with its name.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// What a time chart shows besides its series.
#[derive(Default)]
pub struct Marks {
    /// Vertical lines at x, with a label (the event).
    pub events: Vec<(f64, String)>,
    /// Spans of x shaded (the stall).
    pub shaded: Vec<(f64, f64)>,
}

const W: f64 = 720.0;
const H: f64 = 220.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 24.0;
const BOTTOM: f64 = 34.0;
const COLOURS: [&str; 6] = [
    "#2757c7", "#c2410c", "#15803d", "#7c3aed", "#b45309", "#0e7490",
];

/// Escapes text for XML and HTML.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round number at or above `v` for an axis top (1, 2 or 5 times a power of ten).
fn nice_top(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let power = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|t| *t >= v)
        .unwrap_or(10.0 * power)
}

fn number(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A line chart over x from 0 to `x_max` (seconds, say): `title`, `y_unit` on the axis.
pub fn time_chart(
    title: &str,
    x_unit: &str,
    y_unit: &str,
    x_max: f64,
    series: &[Series],
    marks: &Marks,
) -> String {
    let y_max = nice_top(
        series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0, f64::max),
    );
    let x_max = if x_max > 0.0 { x_max } else { 1.0 };
    let x = |v: f64| LEFT + (v / x_max).clamp(0.0, 1.0) * (W - LEFT - RIGHT);
    let y = |v: f64| H - BOTTOM - (v / y_max).clamp(0.0, 1.0) * (H - TOP - BOTTOM);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" role="img" aria-label="{t}" font-family="system-ui, sans-serif" font-size="11">"#,
        t = escape(title)
    );
    let _ = write!(
        svg,
        r##"<rect width="{W}" height="{H}" fill="#fff"/><text x="{LEFT}" y="15" font-size="13" font-weight="600" fill="#1d232a">{}</text>"##,
        escape(title)
    );
    for &(from, to) in &marks.shaded {
        let _ = write!(
            svg,
            r##"<rect class="stall" x="{:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#fde2e1"/>"##,
            x(from),
            (x(to) - x(from)).max(1.0),
            H - TOP - BOTTOM
        );
    }
    for i in 0..=4 {
        let v = y_max * f64::from(i) / 4.0;
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#e5e7eb"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#6b7280">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            y(v) + 4.0,
            number(v),
            y = y(v)
        );
    }
    for i in 0..=6 {
        let v = x_max * f64::from(i) / 6.0;
        let _ = write!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#6b7280">{}</text>"##,
            x(v),
            H - BOTTOM + 14.0,
            number(v)
        );
    }
    let _ = write!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#6b7280">{}</text><text x="8" y="{:.1}" fill="#6b7280" transform="rotate(-90 8 {:.1})" text-anchor="middle">{}</text>"##,
        W - RIGHT,
        H - 4.0,
        escape(x_unit),
        (TOP + H - BOTTOM) / 2.0,
        (TOP + H - BOTTOM) / 2.0,
        escape(y_unit)
    );
    for (at, label) in &marks.events {
        let _ = write!(
            svg,
            r##"<line class="event" x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{:.1}" stroke="#b45309" stroke-width="1.5" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" fill="#b45309">{}</text>"##,
            H - BOTTOM,
            x(*at) + 4.0,
            TOP + 11.0,
            escape(label),
            x = x(*at)
        );
    }
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<String> = s
            .points
            .iter()
            .map(|&(px, py)| format!("{:.1},{:.1}", x(px), y(py)))
            .collect();
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{}"><title>{}</title></polyline>"#,
            points.join(" "),
            escape(&s.name)
        );
        if series.len() > 1 {
            let lx = LEFT + 8.0 + 130.0 * i as f64;
            let _ = write!(
                svg,
                r#"<rect x="{lx:.1}" y="{:.1}" width="10" height="3" fill="{colour}"/><text x="{:.1}" y="{:.1}" fill="{colour}">{}</text>"#,
                TOP + 20.0,
                lx + 14.0,
                TOP + 24.0,
                escape(&s.name)
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

/// Horizontal bars, one per (label, value), with each value's text and a note (a ratio).
pub fn bar_chart(title: &str, unit: &str, bars: &[(String, f64, String)]) -> String {
    let row = 26.0;
    let height = TOP + 10.0 + row * bars.len() as f64 + 8.0;
    let label_w = 230.0;
    let max = nice_top(bars.iter().map(|b| b.1).fold(0.0, f64::max));
    let span = W - label_w - 150.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height:.0}" role="img" aria-label="{t}" font-family="system-ui, sans-serif" font-size="12"><rect width="{W}" height="{height:.0}" fill="#fff"/><text x="8" y="16" font-size="13" font-weight="600" fill="#1d232a">{t} ({u})</text>"##,
        t = escape(title),
        u = escape(unit)
    );
    for (i, (label, value, note)) in bars.iter().enumerate() {
        let y = TOP + 10.0 + row * i as f64;
        let w = (value / max).clamp(0.0, 1.0) * span;
        let colour = COLOURS[i % COLOURS.len()];
        let _ = write!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#1d232a">{}</text><rect class="bar" x="{label_w}" y="{y:.1}" width="{w:.1}" height="{:.1}" fill="{colour}"/><text x="{:.1}" y="{:.1}" fill="#1d232a">{} <tspan fill="#6b7280">{}</tspan></text>"##,
            label_w - 8.0,
            y + 13.0,
            escape(label),
            row - 8.0,
            label_w + w + 6.0,
            y + 13.0,
            number(*value),
            escape(note)
        );
    }
    svg.push_str("</svg>");
    svg
}

/// A self-contained HTML page: `title`, a line of context, and sections of (heading,
/// markup) where the markup is this module's SVG or escaped text.
pub fn page(title: &str, context: &[String], sections: &[(String, String)]) -> String {
    let mut html = String::new();
    let _ = write!(
        html,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{t}</title>\
         <style>body{{margin:0 auto;max-width:760px;padding:1rem;font:14px/1.45 system-ui,sans-serif;color:#1d232a;background:#fbfbfa}}\
         h1{{font-size:1.3rem}}h2{{font-size:1rem;margin-top:1.6rem}}svg{{width:100%;height:auto;border:1px solid #e4e4e0;border-radius:6px;margin:.3rem 0}}\
         p.context{{color:#6b7280;margin:.2rem 0}}pre{{white-space:pre-wrap;font-size:12px;background:#fff;border:1px solid #e4e4e0;padding:.5rem}}</style></head><body>\n<h1>{t}</h1>\n",
        t = escape(title)
    );
    for line in context {
        let _ = writeln!(html, "<p class=\"context\">{}</p>", escape(line));
    }
    for (heading, body) in sections {
        let _ = writeln!(html, "<h2>{}</h2>\n{body}", escape(heading));
    }
    html.push_str("</body></html>\n");
    html
}

/// The spans of seconds whose throughput fell below half the run's median (the stall), from
/// (second, tps, ...) intervals; each interval covers the second before its mark.
pub fn slow_seconds(intervals: &[(f64, f64, f64)]) -> Vec<(f64, f64)> {
    let mut tps: Vec<f64> = intervals.iter().map(|i| i.1).collect();
    tps.sort_by(f64::total_cmp);
    let median = tps.get(tps.len() / 2).copied().unwrap_or(0.0);
    let mut spans: Vec<(f64, f64)> = Vec::new();
    for &(second, tps, _) in intervals {
        if tps < median / 2.0 {
            match spans.last_mut() {
                Some(last) if (last.1 - (second - 1.0)).abs() < 0.01 => last.1 = second,
                _ => spans.push((second - 1.0, second)),
            }
        }
    }
    spans
}

/// sysbench's per-second lines (`--report-interval=1`): (second, tps, p95 ms).
pub fn sysbench_intervals(text: &str) -> Vec<(f64, f64, f64)> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let second: f64 = l
                .strip_prefix('[')?
                .split('s')
                .next()?
                .trim()
                .parse()
                .ok()?;
            let after = |key: &str| -> Option<f64> {
                l.split(key).nth(1)?.split_whitespace().next()?.parse().ok()
            };
            let tps = after(" tps: ")?;
            let p95 = after("%): ").unwrap_or(0.0);
            Some((second, tps, p95))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINES: &str = "\
[ 1s ] thds: 20 tps: 812.95 qps: 16324.01 (r/w/o: 11441.02/3250.13/1632.86) lat (ms,95%): 42.61 err/s: 0.00 reconn/s: 0.00
[ 2s ] thds: 20 tps: 0.00 qps: 0.00 (r/w/o: 0.00/0.00/0.00) lat (ms,95%): 0.00 err/s: 0.00 reconn/s: 0.00
[ 3s ] thds: 20 tps: 790.10 qps: 15800.00 (r/w/o: 11060.00/3160.00/1580.00) lat (ms,95%): 1050.76 err/s: 0.00 reconn/s: 0.00
";

    #[test]
    fn reads_sysbench_seconds() {
        let s = sysbench_intervals(LINES);
        assert_eq!(
            s,
            vec![
                (1.0, 812.95, 42.61),
                (2.0, 0.0, 0.0),
                (3.0, 790.10, 1050.76)
            ]
        );
    }

    #[test]
    fn the_stall_is_the_seconds_below_half_the_median() {
        let s = sysbench_intervals(LINES);
        assert_eq!(slow_seconds(&s), vec![(1.0, 2.0)]);
        let longer = [
            (1.0, 800.0, 0.0),
            (2.0, 10.0, 0.0),
            (3.0, 0.0, 0.0),
            (4.0, 790.0, 0.0),
        ];
        assert_eq!(slow_seconds(&longer), vec![(1.0, 3.0)]);
    }

    /// A report opens in Debian's headless Chromium: every chart is in the page it parsed,
    /// and the browser logs no error.
    #[test]
    fn a_report_opens_in_chromium_without_errors() {
        let chromium = std::path::Path::new("/usr/bin/chromium");
        assert!(
            chromium.is_file(),
            "Chromium is needed: scripts/deps.sh installs it (apt-get install chromium)"
        );
        let s = sysbench_intervals(LINES);
        let marks = Marks {
            events: vec![(1.5, "switchover".into())],
            shaded: slow_seconds(&s),
        };
        let tps = time_chart(
            "switchover: transactions per second",
            "seconds",
            "tps",
            3.0,
            &[Series {
                name: "tps".into(),
                points: s.iter().map(|i| (i.0, i.1)).collect(),
            }],
            &marks,
        );
        let bars = bar_chart(
            "transactions per second",
            "tps",
            &[
                ("haproxy".into(), 23556.0, String::new()),
                ("holdfast".into(), 25079.0, "1.06x HAProxy".into()),
            ],
        );
        let dir = std::env::temp_dir().join(format!("holdfast-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("report.html");
        std::fs::write(
            &file,
            page(
                "holdfast drill",
                &["a test".into()],
                &[("switchover".into(), tps), ("bench".into(), bars)],
            ),
        )
        .unwrap();
        let out = std::process::Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--enable-logging=stderr",
                "--v=0",
                "--dump-dom",
            ])
            .arg(format!("--user-data-dir={}", dir.join("profile").display()))
            .arg(format!("file://{}", file.display()))
            .output()
            .expect("running chromium");
        let dom = String::from_utf8_lossy(&out.stdout);
        let log = String::from_utf8_lossy(&out.stderr);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(out.status.success(), "{log}");
        assert_eq!(dom.matches("<svg").count(), 2, "{dom}");
        assert!(dom.contains("class=\"event\"") && dom.contains("class=\"bar\""));
        let errors: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
            .collect();
        assert!(errors.is_empty(), "the browser logged: {errors:?}");
    }

    #[test]
    fn charts_escape_text_and_mark_the_event() {
        let series = [Series {
            name: "tps <a>".into(),
            points: vec![(1.0, 800.0), (2.0, 0.0), (3.0, 790.0)],
        }];
        let marks = Marks {
            events: vec![(1.5, "switchover & back".into())],
            shaded: vec![(1.5, 2.5)],
        };
        let svg = time_chart("tps", "s", "tps", 3.0, &series, &marks);
        assert!(svg.contains("switchover &amp; back"));
        assert!(svg.contains("tps &lt;a&gt;"));
        assert!(svg.contains("class=\"event\"") && svg.contains("class=\"stall\""));
        assert!(!svg.contains("NaN"));
        let bars = bar_chart(
            "tps",
            "per second",
            &[("haproxy".into(), 100.0, "1.00x".into())],
        );
        assert!(bars.contains("class=\"bar\""));
        let html = page("r", &["<b>".into()], &[("h".into(), svg)]);
        assert!(html.contains("&lt;b&gt;"));
        assert_eq!(nice_top(0.0), 1.0);
        assert_eq!(nice_top(812.0), 1000.0);
        assert_eq!(nice_top(42.6), 50.0);
    }
}
