//! `burn-vision plot RUN_DIR... -o curves.png`: the training curves of one or several runs
//! (their `metrics.jsonl`), overlaid in four panels — loss, top-1 accuracy (training solid,
//! validation dashed), learning rate and images per second against the epoch — drawn with
//! plotters into memory and written as a PNG (atomically). The text uses an embedded DejaVu
//! Sans Mono, so no system font is needed.

use crate::error::{Error, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// One run's curves.
#[derive(Debug, Clone, PartialEq)]
pub struct RunCurves {
    /// The label in the legends (the run folder's name).
    pub name: String,
    /// The metrics lines, one JSON object per epoch.
    pub epochs: Vec<serde_json::Value>,
}

impl RunCurves {
    /// Reads `run/metrics.jsonl`.
    ///
    /// # Errors
    /// [`Error::Plot`] when it is missing, empty or not JSON lines.
    pub fn read(run: &Path) -> Result<Self> {
        let file = run.join("metrics.jsonl");
        let bad = |reason: String| Error::Plot { path: file.clone(), reason };
        let text = std::fs::read_to_string(&file).map_err(|e| {
            bad(format!("{e}; pass run folders written by `burn-vision train` (they hold metrics.jsonl)"))
        })?;
        let epochs = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(i, l)| serde_json::from_str(l).map_err(|e| bad(format!("line {}: {e}", i + 1))))
            .collect::<Result<Vec<serde_json::Value>>>()?;
        if epochs.is_empty() {
            return Err(bad("no epoch finished yet: nothing to plot".into()));
        }
        let name = run.file_name().map_or_else(|| run.display().to_string(), |n| n.to_string_lossy().into_owned());
        Ok(Self { name, epochs })
    }

    /// `(epoch, key's value × scale)` for every line that has `key`.
    fn points(&self, key: &str, scale: f64) -> Vec<(f64, f64)> {
        self.epochs.iter().filter_map(|e| Some((e["epoch"].as_f64()?, e[key].as_f64()? * scale))).collect()
    }
}

/// A panel: its title and the metrics it draws (key, label, scale, dashed).
struct Panel {
    title: &'static str,
    series: &'static [(&'static str, &'static str, f64, bool)],
}

const PANELS: [Panel; 4] = [
    Panel { title: "loss", series: &[("train_loss", "train", 1.0, false), ("val_loss", "val", 1.0, true)] },
    Panel {
        title: "top-1 accuracy (%)",
        series: &[("train_acc", "train", 100.0, false), ("val_acc", "val", 100.0, true)],
    },
    Panel { title: "learning rate (end of epoch)", series: &[("lr", "lr", 1.0, false)] },
    Panel { title: "images / s (all ranks)", series: &[("img_per_s", "img/s", 1.0, false)] },
];

const FONT: &[u8] = include_bytes!("../assets/DejaVuSansMono.ttf");

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// Draws `runs` into a `width` × `height` PNG at `out`.
///
/// # Errors
/// [`Error::Plot`] when drawing fails; I/O errors writing `out`.
pub fn plot_runs(runs: &[RunCurves], out: &Path, (width, height): (u32, u32)) -> Result<()> {
    register_font();
    let failed = |e: String| Error::Plot { path: out.to_path_buf(), reason: e };
    let mut pixels = vec![0u8; width as usize * height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| failed(e.to_string()))?;
        for (area, panel) in root.split_evenly((2, 2)).iter().zip(&PANELS) {
            draw_panel(area, panel, runs).map_err(failed)?;
        }
        root.present().map_err(|e| failed(e.to_string()))?;
    }
    let mut png = Vec::new();
    image::RgbImage::from_raw(width, height, pixels)
        .expect("buffer sized for the image")
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .map_err(|e| failed(e.to_string()))?;
    crate::atomic_file::write_atomic(out, &png)
}

/// The range of `values`, widened a little (and made non-empty).
fn padded(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = if hi > lo { 0.05 * (hi - lo) } else { 0.05 * hi.abs().max(1e-9) };
    (lo - pad, hi + pad)
}

/// One drawn line: the run's index, the series' label, dashed, and its points.
type Curve<'a> = (usize, &'a str, bool, Vec<(f64, f64)>);

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    runs: &[RunCurves],
) -> std::result::Result<(), String> {
    let curves: Vec<Curve> = runs
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            panel.series.iter().map(move |&(key, label, scale, dashed)| (i, label, dashed, r.points(key, scale)))
        })
        .collect();
    let (x0, x1) = padded(curves.iter().flat_map(|c| c.3.iter().map(|p| p.0)));
    let (y0, y1) = padded(curves.iter().flat_map(|c| c.3.iter().map(|p| p.1)));
    let mut chart = ChartBuilder::on(area)
        .caption(panel.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| e.to_string())?;
    chart.configure_mesh().x_desc("epoch").label_style(("sans-serif", 12)).draw().map_err(|e| e.to_string())?;
    for (i, label, dashed, points) in curves {
        let color = Palette99::pick(i).to_rgba();
        let style = color.stroke_width(2);
        let name = if runs.len() > 1 || panel.series.len() > 1 {
            format!("{} {label}", runs[i].name)
        } else {
            runs[i].name.clone()
        };
        let drawn = if dashed {
            chart.draw_series(DashedLineSeries::new(points.clone(), 6, 4, style)).map_err(|e| e.to_string())?
        } else {
            chart.draw_series(LineSeries::new(points.clone(), style)).map_err(|e| e.to_string())?
        };
        drawn.label(name).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        // Markers, so a one-epoch run shows too.
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 12))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| e.to_string())
}

/// Reads every run folder in `runs` and draws them into `out`.
///
/// # Errors
/// As [`RunCurves::read`] and [`plot_runs`].
pub fn plot_folders(runs: &[PathBuf], out: &Path) -> Result<()> {
    let curves = runs.iter().map(|r| RunCurves::read(r)).collect::<Result<Vec<_>>>()?;
    plot_runs(&curves, out, (1400, 900))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_ranges_are_never_empty() {
        assert_eq!(padded([1.0, 3.0].into_iter()), (0.9, 3.1));
        let (lo, hi) = padded([2.0].into_iter());
        assert!(lo < 2.0 && hi > 2.0);
        assert_eq!(padded(std::iter::empty()), (0.0, 1.0));
    }
}
