//! Whether a JPEG file holds all of its image data. The decoder fills what a cut file lacks with
//! grey and says nothing, so a file cut inside its image data would train as if whole; this walk
//! over the file's markers finds the end-of-image marker after the last scan, or says where the
//! data stops (libjpeg's "premature end of data").

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
        }
    }
}
