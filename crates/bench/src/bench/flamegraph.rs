//! Folded stacks drawn as a flame graph: one SVG, no external tool. Each box is a function,
//! as wide as the samples it was on the stack for; its callers are below it. Hovering a box
//! shows its name and share (an SVG `<title>`).

use std::collections::BTreeMap;
use std::fmt::Write;

const WIDTH: f64 = 1200.0;
const FRAME_HEIGHT: f64 = 16.0;
const TOP_MARGIN: f64 = 32.0;
/// Boxes narrower than this (in pixels) are left out, with their callees.
const MIN_WIDTH: f64 = 0.3;
/// Approximate width of one character of the 11px font, for fitting labels.
const CHAR_WIDTH: f64 = 6.6;

#[derive(Default)]
struct Node {
    samples: u64,
    children: BTreeMap<String, Node>,
}

impl Node {
    fn depth(&self) -> usize {
        self.children
            .values()
            .map(|c| c.depth() + 1)
            .max()
            .unwrap_or(0)
    }
}

/// Renders `folded` (`frame;frame;...` stacks, root first, with sample counts) as an SVG.
pub fn render(title: &str, folded: &[(String, u64)]) -> String {
    let mut root = Node::default();
    for (stack, n) in folded {
        root.samples += n;
        let mut node = &mut root;
        for frame in stack.split(';') {
            node = node.children.entry(frame.to_string()).or_default();
            node.samples += n;
        }
    }
    let depth = root.depth() + 1;
    let height = TOP_MARGIN + depth as f64 * FRAME_HEIGHT + 8.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<?xml version="1.0" standalone="no"?>
<svg version="1.1" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg" font-family="Verdana, sans-serif" font-size="11">
<rect x="0" y="0" width="100%" height="100%" fill="#f8f8f8"/>
<text x="{x}" y="20" text-anchor="middle" font-size="15">{title} ({n} samples)</text>
"##,
        x = WIDTH / 2.0,
        title = escape(title),
        n = root.samples,
    );
    if root.samples > 0 {
        let scale = WIDTH / root.samples as f64;
        let bottom = height - 8.0 - FRAME_HEIGHT;
        draw_children(&mut svg, &root, 0.0, bottom, scale, root.samples);
    }
    svg.push_str("</svg>\n");
    svg
}

fn draw_children(svg: &mut String, node: &Node, x: f64, y: f64, scale: f64, total: u64) {
    let mut left = x;
    for (name, child) in &node.children {
        let width = child.samples as f64 * scale;
        if width >= MIN_WIDTH {
            draw_frame(svg, name, child.samples, left, y, width, total);
            draw_children(svg, child, left, y - FRAME_HEIGHT, scale, total);
        }
        left += width;
    }
}

fn draw_frame(svg: &mut String, name: &str, samples: u64, x: f64, y: f64, w: f64, total: u64) {
    let share = 100.0 * samples as f64 / total as f64;
    let label_chars = ((w - 6.0) / CHAR_WIDTH).floor().max(0.0) as usize;
    let label = if label_chars < 3 {
        String::new()
    } else if name.chars().count() <= label_chars {
        name.to_string()
    } else {
        let cut: String = name.chars().take(label_chars - 2).collect();
        format!("{cut}..")
    };
    let _ = writeln!(
        svg,
        r#"<g><title>{name} ({samples} samples, {share:.2}%)</title><rect x="{x:.2}" y="{y:.1}" width="{w:.2}" height="{h}" fill="{fill}" rx="2"/><text x="{tx:.2}" y="{ty:.1}">{label}</text></g>"#,
        name = escape(name),
        h = FRAME_HEIGHT - 1.0,
        fill = color(name),
        tx = x + 3.0,
        ty = y + FRAME_HEIGHT - 4.5,
        label = escape(&label),
    );
}

/// Kernel frames orange, holdfast's own code blue, everything else (std, tokio, libc) in
/// warm tones varied by name so that neighbours stand apart.
fn color(name: &str) -> String {
    let h = name
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    let v = (h % 55) as u8;
    if name.ends_with("_[k]") {
        format!("rgb(240,{},60)", 140 + v)
    } else if name.contains("holdfast") {
        format!("rgb({},{},235)", 90 + v, 150 + v)
    } else {
        format!("rgb(230,{},{})", 90 + v * 2, 50 + v)
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_follow_samples_and_names_are_escaped() {
        let folded = vec![
            ("main;a<T>".to_string(), 3),
            ("main;b".to_string(), 1),
            ("main;b;sys_[k]".to_string(), 4),
        ];
        let svg = render("t", &folded);
        assert!(svg.contains("(8 samples)"));
        assert!(svg.contains("a&lt;T&gt; (3 samples, 37.50%)"), "{svg}");
        // main spans the whole width; b (5 of 8 samples) five eighths of it.
        assert!(svg.contains(r#"width="1200.00""#), "{svg}");
        assert!(svg.contains(r#"width="750.00""#), "{svg}");
        assert!(svg.contains("sys_[k] (4 samples, 50.00%)"));
        assert!(svg.ends_with("</svg>\n"));
    }
}
