//! The chart: one PNG with latency, requests, peers, failover, election
//! handover and observer lag, the scale runs' refresh intervals and their
//! cost per renewal and per lease at each count, and the targets. Text is drawn with a TrueType
//! font found on the machine (DejaVu Sans on Debian), loaded at run time.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::ops::{OPS, READ_CALL};
use crate::report::Report;

type DynErr = Box<dyn std::error::Error>;

const FONT: &str = "sans-serif";

/// Height of the eight panels (with the title).
const PANELS_H: u32 = 2320;
/// Characters per line of the targets' text.
const TARGET_WRAP: usize = 250;

/// Registers a TrueType font for plotters' text, or says which to install.
fn load_font() -> Result<(), String> {
    let mut candidates: Vec<String> = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Ok(out) = std::process::Command::new("fc-match")
        .args(["-f", "%{file}", "sans-serif:fontformat=TrueType"])
        .output()
    {
        candidates.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    for c in candidates {
        if let Ok(bytes) = std::fs::read(&c) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if register_font(FONT, FontStyle::Normal, bytes).is_ok() {
                let _ = register_font(FONT, FontStyle::Bold, bytes);
                return Ok(());
            }
        }
    }
    Err("no TrueType font found for the chart's text (install Debian's fonts-dejavu-core)".into())
}

fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    C[i % C.len()]
}

/// A grouped bar chart: one group per category, one bar per series;
/// `log` for a log-scale y axis. `values[series][category]`.
#[allow(clippy::too_many_arguments)]
fn bars(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    title: &str,
    y_desc: &str,
    categories: &[String],
    series: &[String],
    values: &[Vec<f64>],
    ticks: Option<&[Vec<f64>]>,
    log: bool,
) -> Result<(), DynErr> {
    let n = categories.len().max(1);
    let finite = || {
        values
            .iter()
            .flatten()
            .copied()
            .filter(|v| v.is_finite() && *v > 0.0)
    };
    if categories.is_empty() || finite().next().is_none() {
        // Nothing measured here (a section skipped or failed): say so
        // instead of drawing axes over an empty range.
        area.draw(&Text::new(
            format!("{title}: not measured in this run"),
            (20, 20),
            (FONT, 16).into_font(),
        ))?;
        return Ok(());
    }
    let vmax = finite()
        .chain(
            ticks
                .into_iter()
                .flatten()
                .flatten()
                .copied()
                .filter(|v| v.is_finite()),
        )
        .fold(0.0f64, f64::max)
        .max(1e-3);
    let vmin = finite().fold(f64::INFINITY, f64::min);
    let x = -0.5..(n as f64 - 0.5);
    let names = categories.to_vec();
    let fmt = move |v: &f64| {
        let i = v.round();
        if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
            names[i as usize].clone()
        } else {
            String::new()
        }
    };
    let width = 0.8 / series.len().max(1) as f64;
    macro_rules! draw {
        ($chart:expr, $base:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(n)
                .x_label_formatter(&fmt)
                .y_desc(y_desc)
                .label_style((FONT, 14))
                .draw()?;
            for (s, name) in series.iter().enumerate() {
                let c = color(s);
                let rects = values[s]
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_finite() && **v > 0.0)
                    .map(|(i, v)| {
                        let x0 = i as f64 - 0.4 + s as f64 * width;
                        Rectangle::new([(x0, $base), (x0 + width * 0.9, *v)], c.filled())
                    });
                chart
                    .draw_series(rects)?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled())
                    });
                if let Some(t) = ticks {
                    let marks = t[s]
                        .iter()
                        .enumerate()
                        .filter(|(_, v)| v.is_finite() && **v > 0.0)
                        .map(|(i, v)| {
                            let x0 = i as f64 - 0.4 + s as f64 * width;
                            PathElement::new(
                                vec![(x0, *v), (x0 + width * 0.9, *v)],
                                BLACK.stroke_width(2),
                            )
                        });
                    chart.draw_series(marks)?;
                }
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .label_font((FONT, 13))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()?;
        }};
    }
    let mut b = ChartBuilder::on(area);
    b.caption(title, (FONT, 18))
        .margin(12)
        .x_label_area_size(28)
        .y_label_area_size(70);
    if log {
        let lo = (vmin / 2.0).max(1e-4);
        let chart = b.build_cartesian_2d(x, (lo..vmax * 3.0).log_scale())?;
        draw!(chart, lo);
    } else {
        let chart = b.build_cartesian_2d(x, 0.0..vmax * 1.7)?;
        draw!(chart, 0.0);
    }
    Ok(())
}

pub fn draw(report: &Report, path: &Path) -> Result<(), String> {
    load_font()?;
    draw_inner(report, path).map_err(|e| format!("chart: {e}"))
}

fn draw_inner(r: &Report, path: &Path) -> Result<(), DynErr> {
    // The targets' text, wrapped, sizes the bottom of the canvas.
    let target_lines: usize = r
        .targets
        .iter()
        .map(|c| {
            wrap(
                &format!("MISSED  {} — {}", c.target, c.measured),
                TARGET_WRAP,
            )
            .len()
        })
        .sum();
    let targets_h = 70 + 16 * target_lines as u32 + 3 * r.targets.len() as u32;
    let root = BitMapBackend::new(path, (1800, PANELS_H + targets_h)).into_drawing_area();
    root.fill(&WHITE)?;
    let m = &r.machine;
    let root = root.titled(
        &format!(
            "lease-bench · {} · {} CPUs ({}) · {} GiB{}",
            m.date_utc,
            m.cpus,
            m.cpu_model,
            m.memory_gib,
            if r.settings.quick {
                " · quick run"
            } else {
                ""
            }
        ),
        (FONT, 24),
    )?;
    let (upper, lower) = root.split_vertically(PANELS_H - 40);
    let panels = upper.split_evenly((4, 2));
    let ms = |us: f64| us / 1000.0;

    // 1. Latency per operation.
    let backends: Vec<String> = r.ops.iter().map(|b| b.backend.to_string()).collect();
    // The read's call on the raw session is a breakdown of PostgreSQL's
    // read, shown in the tables only.
    let charted: Vec<&str> = OPS.into_iter().filter(|op| *op != READ_CALL).collect();
    let ops: Vec<String> = charted.iter().map(|s| s.to_string()).collect();
    let get = |f: &dyn Fn(&crate::ops::OpResult) -> f64| -> Vec<Vec<f64>> {
        charted
            .iter()
            .map(|op| {
                r.ops
                    .iter()
                    .map(|b| b.get(op).map_or(f64::NAN, f))
                    .collect()
            })
            .collect()
    };
    bars(
        &panels[0],
        "Latency per operation: p50 (bars), p99 (black ticks)",
        "ms (log)",
        &backends,
        &ops,
        &get(&|o| ms(o.latency.p50_us)),
        Some(&get(&|o| ms(o.latency.p99_us))),
        true,
    )?;
    // 2. Requests per operation.
    let counted: Vec<_> = r.ops.iter().filter(|b| b.backend != "fake").collect();
    let cb: Vec<String> = counted.iter().map(|b| b.backend.to_string()).collect();
    let req: Vec<Vec<f64>> = OPS
        .iter()
        .map(|op| {
            counted
                .iter()
                .map(|b| {
                    b.get(op)
                        .and_then(|o| o.counter_requests.or(o.proxy_requests))
                        .map_or(f64::NAN, |c| c.median as f64)
                })
                .collect()
        })
        .collect();
    bars(
        &panels[1],
        "Requests per operation (median; by the server or client counter where one sees it, else at a TCP proxy)",
        "requests",
        &cb,
        &ops,
        &req,
        None,
        false,
    )?;
    // 3. Peers.
    let mut cats = Vec::new();
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for p in &r.peers {
        for peer in &p.peers {
            cats.push(format!("{} vs {}", p.backend, short(&peer.what)));
            ours.push(ms(p.lease.latency.p50_us));
            theirs.push(ms(peer.latency.p50_us));
        }
    }
    bars(
        &panels[2],
        "Native peers: acquire + release vs lock + unlock / create + delete (p50)",
        "ms",
        &cats,
        &[
            "lease (acquire + release)".to_string(),
            "native peer".to_string(),
        ],
        &[ours, theirs],
        None,
        false,
    )?;
    // 4. Failover.
    let fb: Vec<String> = r
        .failover
        .iter()
        .map(|f| format!("{} ({})", f.backend, if f.watch { "watch" } else { "poll" }))
        .collect();
    bars(
        &panels[3],
        "Failover (p50 bars, max ticks)",
        "ms (log)",
        &fb,
        &[
            "release → grant".to_string(),
            "silent death → grant, minus TTL".to_string(),
        ],
        &[
            r.failover
                .iter()
                .map(|f| ms(f.release_to_grant.p50_us))
                .collect(),
            r.failover.iter().map(|f| ms(f.detection.p50_us)).collect(),
        ],
        Some(&[
            r.failover
                .iter()
                .map(|f| ms(f.release_to_grant.max_us))
                .collect(),
            r.failover.iter().map(|f| ms(f.detection.max_us)).collect(),
        ]),
        true,
    )?;
    // 5. Election: handover and observer lag.
    let eb: Vec<String> = r
        .election
        .iter()
        .map(|e| format!("{} ({})", e.backend, if e.watch { "watch" } else { "poll" }))
        .collect();
    let lat = |f: fn(&crate::election::ElectionResult) -> &crate::stats::Latency, p99: bool| {
        r.election
            .iter()
            .map(|e| {
                let l = f(e);
                if l.n == 0 {
                    f64::NAN
                } else {
                    ms(if p99 { l.p99_us } else { l.p50_us })
                }
            })
            .collect::<Vec<f64>>()
    };
    type Pick = fn(&crate::election::ElectionResult) -> &crate::stats::Latency;
    let picks: [Pick; 4] = [
        |e| &e.handover,
        |e| &e.lag_proclaim,
        |e| &e.lag_no_leader,
        |e| &e.lag_new_leader,
    ];
    bars(
        &panels[4],
        "Election: handover and observer lag (p50 bars, p99 ticks)",
        "ms (log)",
        &eb,
        &[
            "handover: resign → next leader's work".to_string(),
            "observer lag: proclaim".to_string(),
            "observer lag: no leader".to_string(),
            "observer lag: new leader".to_string(),
        ],
        &picks.iter().map(|p| lat(*p, false)).collect::<Vec<_>>(),
        Some(&picks.iter().map(|p| lat(*p, true)).collect::<Vec<_>>()),
        true,
    )?;
    // 7, 8. Scale: cost per renewal and per lease at each count.
    {
        let mut sb: Vec<&'static str> = Vec::new();
        for s in &r.scale {
            if !sb.contains(&s.backend) {
                sb.push(s.backend);
            }
        }
        let mut counts: Vec<usize> = r.scale.iter().map(|s| s.leases).collect();
        counts.sort_unstable();
        counts.dedup();
        let cats: Vec<String> = sb.iter().map(|b| b.to_string()).collect();
        let series: Vec<String> = counts.iter().map(|n| format!("{n} leases")).collect();
        let grid = |f: &dyn Fn(&crate::scale::Scale) -> Option<f64>| -> Vec<Vec<f64>> {
            counts
                .iter()
                .map(|n| {
                    sb.iter()
                        .map(|b| {
                            r.scale
                                .iter()
                                .find(|s| {
                                    s.backend == *b && s.leases == *n && s.abandoned.is_none()
                                })
                                .and_then(f)
                                .unwrap_or(f64::NAN)
                        })
                        .collect()
                })
                .collect()
        };
        bars(
            &panels[6],
            "Scale: CPU per renewal, client (bars) and server (black ticks)",
            "µs (log)",
            &cats,
            &series,
            &grid(&|s| Some(s.client_cpu_per_renewal_us)),
            Some(&grid(&|s| s.server_cpu_per_renewal_us)),
            true,
        )?;
        bars(
            &panels[7],
            "Scale: memory per lease, client heap (bars) and server RSS growth (black ticks)",
            "bytes (log)",
            &cats,
            &series,
            &grid(&|s| Some(s.client_heap_per_lease_bytes)),
            Some(&grid(&|s| s.server_rss_per_lease_bytes)),
            true,
        )?;
    }
    // 6. Scale: distribution of renewal intervals.
    {
        let mut chart = ChartBuilder::on(&panels[5])
            .caption(
                "LeaseGroup: renewal interval since the previous refresh (CDF)",
                (FONT, 18),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0.25f64..0.75, 0.0f64..1.0)?;
        chart
            .configure_mesh()
            .x_desc("interval × TTL (schedule 0.30–0.55, write deadline 0.667)")
            .y_desc("share of renewals")
            .label_style((FONT, 14))
            .draw()?;
        for (x, c) in [(0.30, GREEN), (0.55, GREEN), (2.0 / 3.0, RED)] {
            chart.draw_series(LineSeries::new(vec![(x, 0.0), (x, 1.0)], c.stroke_width(2)))?;
        }
        for (i, s) in r.scale.iter().enumerate() {
            let c = color(i);
            let pts: Vec<(f64, f64)> = s
                .interval_cdf
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(|(k, v)| (v.clamp(0.25, 0.75), k as f64 / 100.0))
                .collect();
            chart
                .draw_series(LineSeries::new(pts, c.stroke_width(3)))?
                .label(format!(
                    "{}: {} leases (TTL {} s), lag p99 ≈ {:.1}% TTL",
                    s.backend,
                    s.leases,
                    s.ttl_s,
                    s.lag_p99 * 100.0
                ))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 14, y)], c.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font((FONT, 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    // 9. Targets, the full width.
    {
        let area = &lower;
        area.draw(&Text::new(
            "Performance targets",
            (20, 15),
            (FONT, 18).into_font(),
        ))?;
        let mut y = 50;
        for c in &r.targets {
            let (mark, col) = if c.informational {
                ("info  ", RGBColor(90, 90, 90))
            } else if c.pass {
                ("met   ", RGBColor(20, 120, 20))
            } else {
                ("MISSED", RGBColor(200, 20, 20))
            };
            let line = format!("{mark}  {} — {}", c.target, c.measured);
            for (k, chunk) in wrap(&line, TARGET_WRAP).into_iter().enumerate() {
                area.draw(&Text::new(
                    chunk,
                    (if k == 0 { 20 } else { 90 }, y),
                    (FONT, 12).into_font().color(&col),
                ))?;
                y += 16;
            }
            y += 3;
        }
    }
    root.present()?;
    Ok(())
}

fn short(what: &str) -> String {
    if what.starts_with("v3lock lock") {
        "v3lock".into()
    } else if what.starts_with("v3lock lease") {
        "v3lock + own lease".into()
    } else if what.starts_with("session lock") {
        "session lock".into()
    } else {
        what.into()
    }
}

fn wrap(s: &str, width: usize) -> Vec<String> {
    let mut out = vec![String::new()];
    for word in s.split(' ') {
        let cur = out.last_mut().expect("one line at least");
        if !cur.is_empty() && cur.chars().count() + word.chars().count() + 1 > width {
            out.push(word.to_string());
        } else {
            if !cur.is_empty() {
                cur.push(' ');
            }
            cur.push_str(word);
        }
    }
    out
}
