//! Response audio: wav (16-bit), pcm (s16le) and flac, whole or as a stream of chunks.

use cosy::audio::{encode_audio, pcm16_bytes, wav16_stream_header, OutputFormat};

use super::error::ApiError;

/// The `response_format`s this server writes. mp3, opus and aac are refused with a 400 that lists
/// these: no encoder crate for them is both pure Rust and well kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AudioFormat {
    Wav,
    Pcm,
    Flac,
}

pub const ALLOWED: &str = "wav, pcm or flac";

impl AudioFormat {
    pub fn parse(name: &str) -> Result<AudioFormat, ApiError> {
        match name.trim().to_ascii_lowercase().as_str() {
            "wav" => Ok(AudioFormat::Wav),
            "pcm" => Ok(AudioFormat::Pcm),
            "flac" => Ok(AudioFormat::Flac),
            "mp3" | "opus" | "aac" => Err(ApiError::bad_request(
                "unsupported_response_format",
                format!("response_format {name:?} is not supported by this server; use {ALLOWED} (pcm = s16le mono 24 kHz)"),
            )
            .param("response_format")),
            _ => Err(ApiError::bad_request(
                "invalid_response_format",
                format!("response_format {name:?} is unknown; use {ALLOWED}"),
            )
            .param("response_format")),
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            AudioFormat::Wav => "audio/wav",
            AudioFormat::Pcm => "audio/pcm",
            AudioFormat::Flac => "audio/flac",
        }
    }

    /// The whole response for `samples`: a wav equals the file `cosy file` writes.
    pub fn encode_whole(self, samples: &[f32], rate: u32) -> Result<Vec<u8>, ApiError> {
        match self {
            AudioFormat::Wav => encode_audio(samples, rate, OutputFormat::Wav16).map_err(ApiError::from_engine),
            AudioFormat::Pcm => Ok(pcm16_bytes(samples)),
            AudioFormat::Flac => encode_flac(samples, rate),
        }
    }

    /// Bytes that start a streamed response (the wav header of unknown length).
    pub fn stream_prefix(self, rate: u32) -> Vec<u8> {
        match self {
            AudioFormat::Wav => wav16_stream_header(rate).to_vec(),
            AudioFormat::Pcm | AudioFormat::Flac => Vec::new(),
        }
    }
}

/// 16-bit mono FLAC of `samples` (flacenc, fixed 4096-sample blocks).
fn encode_flac(samples: &[f32], rate: u32) -> Result<Vec<u8>, ApiError> {
    use flacenc::component::BitRepr;
    use flacenc::error::Verify;
    let ints: Vec<i32> = samples.iter().map(|&x| i32::from(cosy::audio::f32_to_i16(x))).collect();
    let config = flacenc::config::Encoder::default()
        .into_verified()
        .map_err(|e| ApiError::internal(format!("flac encoder settings: {e:?}")))?;
    let source = flacenc::source::MemSource::from_samples(&ints, 1, 16, rate as usize);
    let stream = flacenc::encode_with_fixed_block_size(&config, source, 4096)
        .map_err(|e| ApiError::internal(format!("flac encoding failed: {e:?}")))?;
    let mut sink = flacenc::bitsink::ByteSink::new();
    stream.write(&mut sink).map_err(|e| ApiError::internal(format!("flac encoding failed: {e:?}")))?;
    let mut bytes = sink.as_slice().to_vec();
    // STREAMINFO's minimum block size must exclude the last block (FLAC format, 8.2): flacenc
    // counts the short last block, which makes a fixed-block-size stream look variable, and
    // decoders (symphonia) then misread its frames. Every block but the last has the maximum size.
    if bytes.len() >= 12 && &bytes[..4] == b"fLaC" {
        let max_block = [bytes[10], bytes[11]];
        bytes[8..10].copy_from_slice(&max_block);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: Vec<u8>) -> cosy::frontend::audio::Audio {
        cosy::frontend::audio::decode_bytes(std::path::Path::new("test"), bytes).expect("decodes")
    }

    #[test]
    fn flac_round_trips_to_the_int16_samples() {
        let samples: Vec<f32> = (0..30_000).map(|i| ((i as f32) * 0.03).sin() * 0.5).collect();
        let flac = AudioFormat::Flac.encode_whole(&samples, 24_000).expect("flac");
        assert_eq!(&flac[..4], b"fLaC");
        let audio = decode(flac);
        assert_eq!(audio.sample_rate, 24_000);
        assert_eq!(audio.samples.len(), samples.len());
        // Lossless: equal to the int16 conversion (decoded back to float by the decoder).
        for (a, b) in audio.samples.iter().zip(&samples) {
            let want = f32::from(cosy::audio::f32_to_i16(*b)) / 32768.0;
            assert!((a - want).abs() < 1e-6, "{a} vs {want}");
        }
    }

    #[test]
    fn flac_of_noise_round_trips() {
        // Random-weight models make noise: the encoder's worst case (verbatim or high-order blocks).
        let mut state = 12345u64;
        let samples: Vec<f32> = (0..60_000)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
            })
            .collect();
        let flac = AudioFormat::Flac.encode_whole(&samples, 24_000).expect("flac");
        let audio = decode(flac);
        assert_eq!(audio.samples.len(), samples.len());
    }

    #[test]
    fn streamed_wav_decodes() {
        let samples: Vec<f32> = (0..8000).map(|i| ((i as f32) * 0.05).sin() * 0.5).collect();
        let mut bytes = AudioFormat::Wav.stream_prefix(24_000);
        bytes.extend(pcm16_bytes(&samples));
        let audio = decode(bytes);
        assert_eq!(audio.samples.len(), samples.len());
    }

    #[test]
    fn unsupported_formats_list_the_allowed_ones() {
        for name in ["mp3", "opus", "aac", "ogg", ""] {
            let err = AudioFormat::parse(name).expect_err(name);
            assert_eq!(err.status, 400);
            assert!(err.message.contains(ALLOWED), "{}", err.message);
        }
        assert_eq!(AudioFormat::parse(" WAV ").ok(), Some(AudioFormat::Wav));
    }
}
