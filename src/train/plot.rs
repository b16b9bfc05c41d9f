//! `loss.png`: the loss curves of every compared precision on one plot.
//!
//! plotters draws into an RGB buffer (bitmap backend, no system libraries);
//! text goes through `ab_glyph` with the DejaVu Sans font embedded in the
//! binary (the `dejavu` crate), so a machine without fontconfig or any font
//! file still gets labels. The PNG is encoded here and written atomically.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use crate::error::{Error, Result};
use crate::tools::safetensors_io::write_atomic;

/// Width and height of `loss.png` in pixels.
pub const PLOT_SIZE: (u32, u32) = (1024, 640);

/// Distinct, readable on white (Tableau 10's first eight).
const CURVE_COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// One curve: its label (the precision) and `(step, loss)` points.
pub type LossCurve = (String, Vec<(u64, f32)>);

/// Registers the embedded font once per process; plotters looks fonts up by family name.
fn ensure_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok =
        *REGISTERED.get_or_init(|| register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_ok());
    ok.then_some(())
        .ok_or_else(|| plot_error(Path::new("loss.png"), "the embedded font does not load"))
}

fn plot_error(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Io {
        path: path.display().to_string(),
        message: format!("cannot draw the plot: {reason}"),
    }
}

/// Draws `curves` (loss against step, one colour per curve, with a legend) into a PNG of
/// [`PLOT_SIZE`] at `path`. Non-finite losses are left out of the curve. At least one finite
/// point is needed.
pub fn plot_losses(path: &Path, curves: &[LossCurve]) -> Result<()> {
    ensure_font()?;
    let points = || curves.iter().flat_map(|(_, c)| c.iter()).filter(|(_, l)| l.is_finite());
    let (min_step, max_step) = points().fold((u64::MAX, 0), |(lo, hi), &(s, _)| (lo.min(s), hi.max(s)));
    let (min_loss, max_loss) = points().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &(_, l)| {
        (lo.min(l), hi.max(l))
    });
    if min_step > max_step {
        return Err(plot_error(path, "no finite loss to plot"));
    }
    // Widen flat ranges so the axes are not empty, plus a 5% margin on the loss axis.
    let x_range = min_step as f64..(max_step.max(min_step + 1)) as f64;
    let pad = ((max_loss - min_loss) as f64 * 0.05).max(1e-3);
    let y_range = min_loss as f64 - pad..max_loss as f64 + pad;

    let (width, height) = PLOT_SIZE;
    let mut rgb = vec![0u8; (width * height * 3) as usize];
    {
        let err = |e: &dyn std::fmt::Display| plot_error(path, e);
        let root = BitMapBackend::with_buffer(&mut rgb, PLOT_SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption("training loss", ("sans-serif", 28))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d(x_range, y_range)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("loss")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .label_style(("sans-serif", 16))
            .draw()
            .map_err(|e| err(&e))?;
        for (index, (label, curve)) in curves.iter().enumerate() {
            let color = CURVE_COLORS[index % CURVE_COLORS.len()].to_rgba();
            let series = curve
                .iter()
                .filter(|(_, l)| l.is_finite())
                .map(|&(s, l)| (s as f64, l as f64));
            chart
                .draw_series(LineSeries::new(series, color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 18))
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    write_atomic(path, &encode_png(path, &rgb, width, height)?)
}

/// 8-bit RGB PNG of a row-major buffer.
fn encode_png(path: &Path, rgb: &[u8], width: u32, height: u32) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(|e| plot_error(path, e))?;
    writer.write_image_data(rgb).map_err(|e| plot_error(path, e))?;
    writer.finish().map_err(|e| plot_error(path, e))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(path: &Path) -> (png::OutputInfo, Vec<u8>) {
        let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        buf.truncate(info.buffer_size());
        (info, buf)
    }

    #[test]
    fn writes_a_png_of_the_size_that_decodes_with_coloured_curves() {
        let dir = std::env::temp_dir().join(format!("fp8-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("loss.png");
        let curve = |offset: f32| {
            (0..200u64)
                .map(|s| (s, 3.0 * (-(s as f32) / 50.0).exp() + offset))
                .collect()
        };
        let mut with_nan: Vec<(u64, f32)> = curve(0.2);
        with_nan[10].1 = f32::NAN;
        plot_losses(&path, &[("fp32".into(), curve(0.0)), ("fp8-delayed".into(), with_nan)]).unwrap();
        let (info, pixels) = decode(&path);
        assert_eq!((info.width, info.height), PLOT_SIZE);
        assert_eq!(info.color_type, png::ColorType::Rgb);
        // Not a blank image: many non-white pixels, and some that are neither grey nor white (the curves).
        let px: Vec<&[u8]> = pixels.chunks(3).collect();
        let coloured = px
            .iter()
            .filter(|p| p[0].abs_diff(p[1]) > 40 || p[1].abs_diff(p[2]) > 40)
            .count();
        let dark = px.iter().filter(|p| p.iter().all(|&c| c < 100)).count();
        assert!(coloured > 500, "only {coloured} coloured pixels");
        assert!(dark > 500, "only {dark} dark pixels (axes, text)");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nothing_finite_is_an_error() {
        let path = std::env::temp_dir().join("fp8-plot-never-written.png");
        let result = plot_losses(&path, &[("a".into(), vec![(0, f32::NAN)])]);
        assert!(result.is_err());
        assert!(plot_losses(&path, &[]).is_err());
        assert!(!path.exists());
    }
}
