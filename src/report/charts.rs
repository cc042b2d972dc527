//! The report's charts, drawn with `plotters` into SVG strings.

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

/// A chart's size in pixels.
const SIZE: (u32, u32) = (760, 380);

fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("drawing a chart: {e:?}")
}

/// A colour of the palette for series `i`.
fn color(i: usize) -> RGBColor {
    const C: [(u8, u8, u8); 14] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
        (0, 0, 128),
        (128, 0, 0),
        (0, 128, 128),
        (200, 200, 200),
    ];
    let (r, g, b) = C[i % C.len()];
    RGBColor(r, g, b)
}

/// A range that holds `values` with a margin (never empty, never NaN).
fn range(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    // beyond +-1e300 the margins overflow (and plotters never finds its ticks)
    for v in values.filter(|v| plottable(*v)) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    if hi - lo < 1e-12 {
        let pad = hi.abs().max(1.0) * 0.05;
        return (lo - pad, hi + pad);
    }
    let pad = (hi - lo) * 0.05;
    (if from_zero && lo >= 0.0 { lo } else { lo - pad }, hi + pad)
}

/// Every chart's frame: its title, margins and room for the axis labels.
fn builder<'a, 'b, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, plotters::coord::Shift>,
    title: &'b str,
) -> ChartBuilder<'a, 'b, DB> {
    let mut b = ChartBuilder::on(area);
    b.caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(64);
    b
}

/// The legend of a chart's labelled series, top right.
fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .draw()
        .map_err(err)
}

/// A value a chart can place: finite and within +-1e300.
fn plottable(v: f64) -> bool {
    v.is_finite() && v.abs() <= 1e300
}

/// A short number for an axis tick.
fn tick(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e5).contains(&a) {
        format!("{v:.1e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Lines, one per series `(label, points)`, with a legend; points that are not finite are left
/// out.
pub fn lines(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<String, String> {
    let clean: Vec<(&String, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(l, p)| {
            let p = p
                .iter()
                .copied()
                .filter(|(x, y)| plottable(*x) && plottable(*y))
                .collect();
            (l, p)
        })
        .collect();
    let (x0, x1) = range(clean.iter().flat_map(|s| s.1.iter().map(|p| p.0)), false);
    let (y0, y1) = range(clean.iter().flat_map(|s| s.1.iter().map(|p| p.1)), false);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = builder(&root, title)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(err)?;
        for (i, (label, pts)) in clean.iter().enumerate() {
            let c = color(i);
            let style = c.stroke_width(2);
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), style))
                .map_err(err)?
                .label(label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            // a run with a single point still shows
            if pts.len() == 1 {
                chart
                    .draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled())))
                    .map_err(err)?;
            }
        }
        legend(&mut chart)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Stacked bars: one bar per `bars` entry (label, segment values in `parts` order), a legend of
/// `parts` (name, palette colour: the same part has the same colour in every chart), to the right
/// of the bars.
pub fn stacked(
    title: &str,
    y_desc: &str,
    parts: &[(String, usize)],
    bars: &[(String, Vec<f64>)],
) -> Result<String, String> {
    let n = bars.len().max(1);
    let top = bars
        .iter()
        .map(|b| b.1.iter().filter(|v| plottable(**v)).sum::<f64>())
        .fold(0.0f64, f64::max);
    let top = if top > 0.0 && plottable(top * 1.05) {
        top * 1.05
    } else {
        1.0
    };
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        // the bars on the left, the legend on the right
        let (left, right) = root.split_horizontally(SIZE.0 - 150);
        let mut chart = builder(&left, title)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n + 1)
            .x_label_formatter(&|v| {
                let i = v.round();
                if (v - i).abs() < 1e-6 && i >= 0.0 {
                    labels.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc(y_desc)
            .y_label_formatter(&|v| tick(*v))
            .draw()
            .map_err(err)?;
        for (k, (_, palette)) in parts.iter().enumerate() {
            let c = color(*palette);
            let rects: Vec<Rectangle<(f64, f64)>> = bars
                .iter()
                .enumerate()
                .filter_map(|(i, (_, vals))| {
                    let base: f64 = vals[..k].iter().filter(|v| plottable(**v)).sum();
                    let v = *vals.get(k)?;
                    (plottable(v) && v > 0.0).then(|| {
                        Rectangle::new(
                            [(i as f64 - 0.35, base), (i as f64 + 0.35, base + v)],
                            c.filled(),
                        )
                    })
                })
                .collect();
            chart.draw_series(rects).map_err(err)?;
        }
        // the legend, top part first, as the stack reads from the top
        for (row, (part, palette)) in parts.iter().rev().enumerate() {
            let y = 40 + 18 * row as i32;
            right
                .draw(&Rectangle::new(
                    [(8, y), (20, y + 12)],
                    color(*palette).filled(),
                ))
                .map_err(err)?;
            right
                .draw(&Text::new(part.clone(), (26, y), ("sans-serif", 13)))
                .map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Points of a metric against one swept key: `(x, y, is_best)`; `categories` names the x
/// positions of a key whose values are not numbers.
pub fn scatter(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    points: &[(f64, f64, bool)],
    categories: Option<&[String]>,
) -> Result<String, String> {
    let pts: Vec<(f64, f64, bool)> = points
        .iter()
        .copied()
        .filter(|(x, y, _)| plottable(*x) && plottable(*y))
        .collect();
    let (x0, x1) = match categories {
        Some(c) => (-0.5, c.len().max(1) as f64 - 0.5),
        None => range(pts.iter().map(|p| p.0), false),
    };
    let (y0, y1) = range(pts.iter().map(|p| p.1), false);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = builder(&root, title)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(err)?;
        let cats = categories.map(|c| c.to_vec());
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(x_desc)
            .y_desc(y_desc)
            .y_label_formatter(&|v| tick(*v));
        let fmt = |v: &f64| match &cats {
            Some(c) => {
                let i = v.round();
                if (v - i).abs() < 1e-6 && i >= 0.0 {
                    c.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            }
            None => tick(*v),
        };
        if let Some(c) = categories {
            mesh.x_labels(c.len().max(1));
        }
        mesh.x_label_formatter(&fmt).draw().map_err(err)?;
        chart
            .draw_series(
                pts.iter()
                    .filter(|p| !p.2)
                    .map(|p| Circle::new((p.0, p.1), 5, color(0).filled())),
            )
            .map_err(err)?
            .label("trial")
            .legend(|(x, y)| Circle::new((x + 6, y), 5, color(0).filled()));
        chart
            .draw_series(
                pts.iter()
                    .filter(|p| p.2)
                    .map(|p| Circle::new((p.0, p.1), 8, color(3).filled())),
            )
            .map_err(err)?
            .label("best")
            .legend(|(x, y)| Circle::new((x + 6, y), 6, color(3).filled()));
        legend(&mut chart)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_never_empty_or_nan() {
        assert_eq!(range([].into_iter(), false), (0.0, 1.0));
        let (a, b) = range([2.0, 2.0].into_iter(), false);
        assert!(a < 2.0 && b > 2.0);
        let (a, b) = range([f64::NAN, 1.0, 3.0].into_iter(), true);
        assert!(a == 0.0 && b > 3.0);
        let (a, b) = range([1e308, -1e308, 1.75e308, 2.0].into_iter(), false);
        assert!(
            a.is_finite() && b.is_finite() && a < 2.0 && b > 2.0,
            "{a} {b}"
        );
    }

    #[test]
    fn a_chart_is_svg_with_its_labels() {
        let svg = lines(
            "loss",
            "step",
            "loss",
            &[(
                "run-a".into(),
                vec![(1.0, 2.0), (2.0, f64::NAN), (3.0, 1.0)],
            )],
        )
        .unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40]);
        for t in ["loss", "step", "run-a"] {
            assert!(svg.lines().any(|l| l.trim() == t), "{t}");
        }
        assert!(!svg.contains("NaN"));
    }
}
