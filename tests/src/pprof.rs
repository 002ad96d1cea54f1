//! Reading the profiles the binaries serve, as `go tool pprof` would: gzipped or plain
//! pprof protobuf.

use std::io::Read;

use pprof::protos::Message;

/// What a decoded profile holds.
#[derive(Debug)]
pub struct ProfileSummary {
    /// `(type, unit)` of each sample value, e.g. `("cpu", "nanoseconds")`.
    pub sample_types: Vec<(String, String)>,
    pub samples: usize,
    /// Function names (symbolized profiles).
    pub functions: Vec<String>,
}

/// Decodes a pprof profile (gunzipping it first when it is gzipped).
pub fn decode(body: &[u8]) -> Result<ProfileSummary, String> {
    let raw = if body.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(body)
            .read_to_end(&mut out)
            .map_err(|e| format!("gunzip: {e}"))?;
        out
    } else {
        body.to_vec()
    };
    let profile =
        pprof::protos::Profile::decode(raw.as_slice()).map_err(|e| format!("decode: {e}"))?;
    let text = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| profile.string_table.get(i))
            .cloned()
            .unwrap_or_default()
    };
    Ok(ProfileSummary {
        sample_types: profile
            .sample_type
            .iter()
            .map(|t| (text(t.ty), text(t.unit)))
            .collect(),
        samples: profile.sample.len(),
        functions: profile.function.iter().map(|f| text(f.name)).collect(),
    })
}
