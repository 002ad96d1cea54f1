//! Reading the profiles the binaries serve, as `go tool pprof` would: gzipped or plain
//! pprof protobuf.

use std::io::Read;

use pprof::protos::Message;

use crate::error::{Error, Result};

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
pub fn decode(body: &[u8]) -> Result<ProfileSummary> {
    let raw = if body.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(body)
            .read_to_end(&mut out)
            .map_err(|e| Error::Profile(format!("gunzip: {e}")))?;
        out
    } else {
        body.to_vec()
    };
    let profile = pprof::protos::Profile::decode(raw.as_slice())
        .map_err(|e| Error::Profile(format!("decode: {e}")))?;
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

/// Checks a CPU profile as both binaries serve it: pprof with a `cpu` sample type.
/// Samples are not required: a short profile sometimes has none.
pub fn check_cpu(body: &[u8]) -> Result<ProfileSummary> {
    let profile = decode(body)?;
    if !profile.sample_types.iter().any(|(t, _)| t == "cpu") {
        return Err(Error::Profile(format!(
            "no cpu samples type in {profile:?}"
        )));
    }
    Ok(profile)
}

/// Checks a heap profile as both binaries serve it (jemalloc's, through
/// `jemalloc_pprof`): in-use bytes, at least one sample, and symbolized in the process
/// (readable without the binary), one function name containing `symbol`.
pub fn check_heap(body: &[u8], symbol: &str) -> Result<ProfileSummary> {
    let heap = decode(body)?;
    if heap.sample_types != [("inuse_space".to_owned(), "bytes".to_owned())] {
        return Err(Error::Profile(format!(
            "sample types {:?}, not in-use bytes",
            heap.sample_types
        )));
    }
    if heap.samples == 0 {
        return Err(Error::Profile(format!("no samples in {heap:?}")));
    }
    if !heap.functions.iter().any(|f| f.contains(symbol)) {
        return Err(Error::Profile(format!(
            "no function containing {symbol:?} among {:?}",
            &heap.functions[..heap.functions.len().min(30)]
        )));
    }
    Ok(heap)
}
