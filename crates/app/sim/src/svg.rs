//! Hand-written SVG line charts (no network, no plotting crate).

use std::fmt::Write;

pub struct Series<'a> {
    pub name: &'a str,
    pub points: Vec<(f64, f64)>,
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// A line chart with axes, ticks and a legend. `log_x` plots x on a log10 scale.
pub fn line_chart(
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Series],
    log_x: bool,
) -> String {
    let (w, h, ml, mr, mt, mb) = (720.0, 420.0, 70.0, 160.0, 40.0, 50.0);
    let tx = |x: f64| if log_x { x.max(1e-9).log10() } else { x };
    let (x0, x1, y1) = data_range(series, tx);
    let y0 = 0.0;
    let px = |x: f64| ml + (tx(x) - x0) / (x1 - x0) * (w - ml - mr);
    let py = |y: f64| h - mb - (y - y0) / (y1 - y0) * (h - mt - mb);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    let _ = write!(
        s,
        r#"<line x1="{ml}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{ml}" y1="{mt}" x2="{ml}" y2="{}" stroke="black"/>"#,
        h - mb,
        w - mr,
        h - mb,
        h - mb
    );
    for i in 0..=5 {
        let fy = y0 + (y1 - y0) * i as f64 / 5.0;
        let _ = write!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end">{}</text><line x1="{ml}" y1="{2}" x2="{}" y2="{2}" stroke="#ddd"/>"##,
            ml - 5.0,
            py(fy) + 4.0,
            fmt(fy),
            w - mr
        );
        let fx = x0 + (x1 - x0) * i as f64 / 5.0;
        let label = if log_x { fmt(10f64.powf(fx)) } else { fmt(fx) };
        let xp = ml + (fx - x0) / (x1 - x0) * (w - ml - mr);
        let _ = write!(
            s,
            r#"<text x="{xp}" y="{}" text-anchor="middle">{label}</text>"#,
            h - mb + 16.0
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        ml + (w - ml - mr) / 2.0,
        h - 10.0,
        esc(xlabel)
    );
    let _ = write!(
        s,
        r#"<text x="16" y="{}" transform="rotate(-90 16 {0})" text-anchor="middle">{}</text>"#,
        mt + (h - mt - mb) / 2.0,
        esc(ylabel)
    );
    draw_series(&mut s, series, &px, &py, (w, mr, mt));
    s.push_str("</svg>\n");
    s
}

/// The plotted x range (after `tx`) and the top of the y range (from 0), widened
/// where the data are one point or none.
fn data_range(series: &[Series], tx: impl Fn(f64) -> f64) -> (f64, f64, f64) {
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(tx(x));
        x1 = x1.max(tx(x));
        y1 = y1.max(y);
    }
    if x0 >= x1 {
        x1 = x0 + 1.0;
    }
    if y1.is_nan() || y1 <= 0.0 {
        y1 = 1.0;
    }
    (x0, x1, y1)
}

/// Each series' polyline and its legend entry in the right margin.
fn draw_series(
    s: &mut String,
    series: &[Series],
    px: &dyn Fn(f64) -> f64,
    py: &dyn Fn(f64) -> f64,
    (w, mr, mt): (f64, f64, f64),
) {
    for (i, se) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = se
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        let ly = mt + 18.0 * i as f64 + 10.0;
        let _ = write!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            w - mr + 10.0,
            w - mr + 30.0,
            w - mr + 35.0,
            ly + 4.0,
            esc(se.name)
        );
    }
}

fn fmt(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_is_well_formed_and_has_all_series() {
        let s = line_chart(
            "t<1>",
            "x",
            "y",
            &[
                Series {
                    name: "a",
                    points: vec![(1.0, 1.0), (10.0, 3.0)],
                },
                Series {
                    name: "b",
                    points: vec![(1.0, 2.0)],
                },
            ],
            true,
        );
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains("t&lt;1&gt;"));
    }
}
