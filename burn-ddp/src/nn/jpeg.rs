//! What a JPEG file's markers say, read without decoding it: whether the file holds all of its
//! image data, and the frame of a JPEG the GPU decoders take (its size and chroma sampling).
//! Decoders fill what a cut file lacks with grey and say nothing, so a file cut inside its image
//! data would train as if whole; [`check_whole`] walks the markers to the end-of-image marker
//! after the last scan, or says where the data stops (libjpeg's "premature end of data").
//! [`device_decodable`] lets a data loader choose per file between the GPU decoder and the host,
//! and the GPU decoder lay out each image's planes (`nn::cuda::nvjpeg`).

/// Checks that the JPEG in `bytes` runs to its end-of-image marker.
///
/// # Errors
/// A sentence naming what is missing, for a file that ends early.
pub fn check_whole(bytes: &[u8]) -> Result<(), String> {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return Err("not a JPEG (no start-of-image marker)".into());
    }
    let mut at = 2;
    loop {
        let Some(marker_at) = next_marker(bytes, at) else {
            return Err(format!(
                "truncated: the file ends after {} bytes without its end-of-image marker",
                bytes.len()
            ));
        };
        let marker = bytes[marker_at];
        at = marker_at + 1;
        match marker {
            0xD9 => return Ok(()),
            0xD0..=0xD7 | 0x01 => continue,
            _ => {}
        }
        let Some(len) = bytes.get(at..at + 2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]]))) else {
            return Err(format!("truncated: the file ends inside a segment header at byte {at}"));
        };
        if len < 2 || at + len > bytes.len() {
            return Err(format!(
                "truncated: a segment of {len} bytes at byte {at} runs past the end of the file ({} bytes)",
                bytes.len()
            ));
        }
        at += len;
        if marker == 0xDA {
            at = scan_end(bytes, at).ok_or_else(|| {
                format!("truncated: the image data stops at byte {} (premature end of data)", bytes.len())
            })?;
        }
    }
}

/// The frame of a JPEG the GPU decoders take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// How many times chroma is halved across and down: `[0, 0]` 4:4:4, `[1, 0]` 4:2:2,
    /// `[0, 1]` 4:4:0, `[1, 1]` 4:2:0.
    pub chroma_shift: [u8; 2],
    /// Whether the components are Y, Cb and Cr (nearly every JPEG) rather than R, G and B
    /// (an Adobe marker with transform 0, or components named `R`, `G`, `B`), as libjpeg reads them.
    pub ycbcr: bool,
}

/// The frame of a JPEG that GPU decoders take (nvJPEG's hardware decoder among them): baseline
/// or extended sequential Huffman coding (SOF0 / SOF1), 8-bit samples, three components with
/// chroma at full, half or quarter resolution (4:4:4, 4:2:2, 4:4:0, 4:2:0). `None` for anything
/// else — progressive, arithmetic-coded, 12-bit, greyscale or CMYK JPEGs, and bytes that are not
/// a JPEG — which the CPU decodes.
pub fn device_decodable(bytes: &[u8]) -> Option<Frame> {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let mut at = 2;
    // An Adobe marker's colour transform (0: the components are R, G, B).
    let mut adobe_transform = None;
    loop {
        let marker_at = next_marker(bytes, at)?;
        let marker = bytes[marker_at];
        at = marker_at + 1;
        if matches!(marker, 0xD0..=0xD7 | 0x01) {
            continue;
        }
        let len = usize::from(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]));
        let segment = bytes.get(at + 2..at + len)?;
        match marker {
            0xC0 | 0xC1 => return sequential_frame(segment, adobe_transform),
            0xEE if segment.starts_with(b"Adobe") => {
                adobe_transform = segment.get(11).copied();
                at += len;
            }
            // Any other start of frame, a scan or the end before a frame: not for the GPU.
            0xC2..=0xCF | 0xDA | 0xD9 if marker != 0xC4 && marker != 0xC8 && marker != 0xCC => return None,
            _ => at += len,
        }
    }
}

/// The frame in a baseline frame header (precision, height, width, components) when its
/// sampling is one the GPU decoders take; `adobe_transform` from an Adobe marker before it.
fn sequential_frame(s: &[u8], adobe_transform: Option<u8>) -> Option<Frame> {
    let (precision, height, width, components) = (
        *s.first()?,
        u16::from_be_bytes([*s.get(1)?, *s.get(2)?]),
        u16::from_be_bytes([*s.get(3)?, *s.get(4)?]),
        *s.get(5)?,
    );
    if precision != 8 || components != 3 || height == 0 || width == 0 {
        return None;
    }
    let ids: Vec<u8> = (0..3).map(|c| s.get(6 + 3 * c).copied()).collect::<Option<_>>()?;
    let factors: Vec<u8> = (0..3).map(|c| s.get(6 + 3 * c + 1).copied()).collect::<Option<_>>()?;
    let luma = (factors[0] >> 4, factors[0] & 15);
    let chroma_full = factors[1] == 0x11 && factors[2] == 0x11;
    (chroma_full && matches!(luma, (1, 1) | (2, 1) | (1, 2) | (2, 2))).then(|| Frame {
        width: u32::from(width),
        height: u32::from(height),
        chroma_shift: [luma.0 - 1, luma.1 - 1],
        ycbcr: adobe_transform != Some(0) && ids != b"RGB",
    })
}

/// The index of the marker code after the `0xFF` (and fill bytes) at or after `at`, where a
/// segment is expected to start.
fn next_marker(bytes: &[u8], at: usize) -> Option<usize> {
    let mut i = at;
    while bytes.get(i) == Some(&0xFF) {
        i += 1;
    }
    (i > at && i < bytes.len()).then_some(i)
}

/// The index of the `0xFF` that ends the entropy-coded data starting at `at`: the first `0xFF`
/// followed by neither a stuffed `0x00` nor a restart marker.
fn scan_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let ff = at + bytes.get(at..)?.iter().position(|&b| b == 0xFF)?;
        match bytes.get(ff + 1)? {
            0x00 | 0xD0..=0xD7 | 0xFF => at = ff + 1,
            _ => return Some(ff),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jpeg(w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(w, h, |x, y| {
            image::Rgb([(x * 7 % 256) as u8, (y * 13 % 256) as u8, ((x ^ y) % 256) as u8])
        });
        let mut out = std::io::Cursor::new(Vec::new());
        image::DynamicImage::ImageRgb8(img).write_to(&mut out, image::ImageFormat::Jpeg).unwrap();
        out.into_inner()
    }

    #[test]
    fn whole_files_pass_and_every_cut_is_caught() {
        let whole = jpeg(40, 30);
        assert_eq!(check_whole(&whole), Ok(()));
        let mut trailing = whole.clone();
        trailing.extend_from_slice(b"\0\0camera trailer");
        assert_eq!(check_whole(&trailing), Ok(()), "data after the end-of-image marker is allowed");
        for cut in 2..whole.len() - 1 {
            assert!(check_whole(&whole[..cut]).is_err(), "a file cut at {cut} of {} bytes passed", whole.len());
        }
        let err = check_whole(&whole[..whole.len() * 2 / 3]).unwrap_err();
        assert!(err.contains("premature end of data"), "{err}");
        assert!(check_whole(b"\x89PNG").is_err());
    }

    #[test]
    fn device_decodable_reads_the_size_of_baseline_colour_jpegs_only() {
        // The `image` crate's encoder keeps chroma at full size (4:4:4).
        for (w, h) in [(40, 30), (17, 9), (1, 1)] {
            let frame = Frame { width: w, height: h, chroma_shift: [0, 0], ycbcr: true };
            assert_eq!(device_decodable(&jpeg(w, h)), Some(frame));
        }
        // The luma component's sampling factors (the byte after its id in the frame header)
        // give the other samplings.
        let sof = jpeg(16, 8);
        let at = sof.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap() + 2 + 2 + 6 + 1;
        for (factors, shift) in [(0x11, [0, 0]), (0x21, [1, 0]), (0x12, [0, 1]), (0x22, [1, 1])] {
            let mut b = sof.clone();
            b[at] = factors;
            assert_eq!(device_decodable(&b).map(|f| f.chroma_shift), Some(shift), "factors {factors:#x}");
        }
        let mut quarter = sof.clone();
        quarter[at] = 0x41;
        assert_eq!(device_decodable(&quarter), None, "4:1:1");
        // Components coded as R, G, B: named so, or so said by an Adobe marker (transform 0).
        let mut named = sof.clone();
        for (k, id) in b"RGB".iter().enumerate() {
            named[at - 1 + 3 * k] = *id;
        }
        assert_eq!(device_decodable(&named).map(|f| f.ycbcr), Some(false), "components R, G, B");
        let adobe = |transform: u8| {
            let mut b = vec![0xFF, 0xD8, 0xFF, 0xEE, 0, 14];
            b.extend_from_slice(b"Adobe");
            b.extend_from_slice(&[0, 100, 0, 0, 0, 0, transform]);
            b.extend_from_slice(&sof[2..]);
            b
        };
        assert_eq!(device_decodable(&adobe(0)).map(|f| f.ycbcr), Some(false), "Adobe transform 0");
        assert_eq!(device_decodable(&adobe(1)).map(|f| f.ycbcr), Some(true), "Adobe transform 1");
        let grey = {
            let mut out = std::io::Cursor::new(Vec::new());
            image::DynamicImage::ImageLuma8(image::GrayImage::new(8, 8))
                .write_to(&mut out, image::ImageFormat::Jpeg)
                .unwrap();
            out.into_inner()
        };
        assert_eq!(device_decodable(&grey), None, "one component");
        let mut progressive = jpeg(16, 16);
        let sof = progressive.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        progressive[sof + 1] = 0xC2;
        assert_eq!(device_decodable(&progressive), None);
        assert_eq!(device_decodable(b"\x89PNG\r\n"), None);
        let whole = jpeg(16, 16);
        for cut in 0..whole.len().min(200) {
            let _ = device_decodable(&whole[..cut]);
        }
    }

    #[test]
    fn never_panics_on_arbitrary_bytes() {
        let whole = jpeg(16, 16);
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..2000 {
            let mut b = whole.clone();
            for _ in 0..4 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let i = (state as usize) % b.len();
                b[i] = (state >> 32) as u8;
            }
            let _ = check_whole(&b[..(state as usize >> 8) % b.len()]);
            let _ = device_decodable(&b[..(state as usize >> 8) % b.len()]);
        }
    }
}
