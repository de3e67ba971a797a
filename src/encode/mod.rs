//! Encoded audio: mp3, opus (in Ogg), wav (16-bit), pcm (s16le) and flac, whole or as a stream of
//! bytes made as the audio comes. docs/server.md ("Formats") says why each encoder was chosen.
//! The server's responses (`crate::serve`, which names the formats in its API) and `cosy file`'s
//! outputs ([`file`]: every format, chapter marks, one file per chapter) both encode here, so a
//! format is encoded one way.
//!
//! Every format streams through a [`StreamEncoder`]: `push` takes the next chunk of samples and
//! gives the bytes that are ready (the header with the first), `finish` the rest. The streamed
//! bytes of a format, put together, are a valid file of it: a wav with the unknown-length header,
//! a flac whose STREAMINFO leaves the length and MD5 unknown, an Ogg Opus whose last page ends the
//! stream, mp3 frames. A whole response (`stream: false`) is the file with exact sizes instead:
//! the wav `cosy file` writes, a flac with its length and MD5, an mp3 that starts with LAME's Info
//! tag (so players know its exact length and skip the encoder delay).

use cosy::audio::{encode_audio, f32_to_i16, pcm16_bytes, wav16_stream_header, OutputFormat};

pub mod file;
mod tags;

// The book writer's API (`cosy file BOOK`: chapters, one file per chapter).
pub use file::{write_split, write_with_chapters, FileFormat};
pub use tags::{ChapterMark, Tags};

/// An encoder failed (a setting it refused, a buffer it could not fill): not the user's doing.
/// The server answers it as a 500, the command line as an internal error.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct EncodeError(pub String);

impl EncodeError {
    fn new(message: impl Into<String>) -> EncodeError {
        EncodeError(message.into())
    }
}

impl From<EncodeError> for cosy::Error {
    fn from(e: EncodeError) -> cosy::Error {
        cosy::Error::Runtime(e.0)
    }
}

/// The formats the server writes (`crate::serve::encode` parses their API names; aac is refused
/// there) and the encoded ones `cosy file` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AudioFormat {
    Mp3,
    Opus,
    Wav,
    Pcm,
    /// cosy's own: raw f32le mono, the model's samples exactly (what `cosy say` and `cosy file`
    /// ask a local server for, so they play and write what the model made, as without a server).
    /// Not among the formats of OpenAI's API that clients choose from.
    PcmF32,
    Flac,
}

/// The mp3 bit rate: MPEG-2 layer III at 24 kHz mono (the highest rates give speech no more).
const MP3_KBPS: mp3lame_encoder::Bitrate = mp3lame_encoder::Bitrate::Kbps64;
/// The Opus bit rate: transparent for 24 kHz speech.
const OPUS_BPS: i32 = 48_000;
/// FLAC block size (samples): frames leave a streamed flac every 4096 samples (~0.17 s).
const FLAC_BLOCK: usize = 4096;

impl AudioFormat {
    /// The whole response for `samples`: a wav equals the file `cosy file` writes.
    pub fn encode_whole(self, samples: &[f32], rate: u32) -> Result<Vec<u8>, EncodeError> {
        match self {
            AudioFormat::Wav => encode_audio(samples, rate, OutputFormat::Wav16).map_err(|e| EncodeError::new(e.to_string())),
            AudioFormat::Pcm => Ok(pcm16_bytes(samples)),
            AudioFormat::PcmF32 => Ok(f32le_bytes(samples)),
            AudioFormat::Flac => encode_flac(samples, rate),
            AudioFormat::Mp3 => Mp3::whole(samples, rate),
            AudioFormat::Opus => {
                let mut enc = self.stream_encoder(rate)?;
                let mut bytes = enc.push(samples)?;
                bytes.extend(enc.finish()?);
                Ok(bytes)
            }
        }
    }

    /// An encoder for a response sent as it is made.
    pub fn stream_encoder(self, rate: u32) -> Result<StreamEncoder, EncodeError> {
        let inner = match self {
            AudioFormat::Wav => Inner::Wav { header: true },
            AudioFormat::Pcm => Inner::Pcm,
            AudioFormat::PcmF32 => Inner::PcmF32,
            AudioFormat::Mp3 => Inner::Mp3(Box::new(Mp3::new(rate, false)?)),
            AudioFormat::Opus => Inner::Opus(Box::new(OggOpus::new(rate, None, Vec::new())?)),
            AudioFormat::Flac => Inner::Flac(Box::new(FlacStream::new(rate, None)?)),
        };
        Ok(StreamEncoder { inner, rate })
    }
}

/// Encodes a response chunk by chunk (see the module's documentation).
pub struct StreamEncoder {
    inner: Inner,
    rate: u32,
}

enum Inner {
    Wav { header: bool },
    Pcm,
    PcmF32,
    Mp3(Box<Mp3>),
    Opus(Box<OggOpus>),
    Flac(Box<FlacStream>),
}

impl StreamEncoder {
    /// The bytes ready after `samples` (may be empty: mp3, opus and flac encode whole frames).
    pub fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, EncodeError> {
        match &mut self.inner {
            Inner::Wav { header } => {
                let mut out = Vec::with_capacity(44 + samples.len() * 2);
                if std::mem::take(header) {
                    out.extend(wav16_stream_header(self.rate));
                }
                out.extend(pcm16_bytes(samples));
                Ok(out)
            }
            Inner::Pcm => Ok(pcm16_bytes(samples)),
            Inner::PcmF32 => Ok(f32le_bytes(samples)),
            Inner::Mp3(m) => m.push(samples),
            Inner::Opus(o) => o.push(samples),
            Inner::Flac(f) => f.push(samples),
        }
    }

    /// The last bytes, once all the audio was pushed.
    pub fn finish(&mut self) -> Result<Vec<u8>, EncodeError> {
        match &mut self.inner {
            Inner::Wav { header } => Ok(if std::mem::take(header) { wav16_stream_header(self.rate).to_vec() } else { Vec::new() }),
            Inner::Pcm | Inner::PcmF32 => Ok(Vec::new()),
            Inner::Mp3(m) => m.finish(),
            Inner::Opus(o) => o.finish(),
            Inner::Flac(f) => f.finish(),
        }
    }
}

/// `samples` as little-endian f32 bytes (`pcm_f32`; `crate::client` reads them back).
fn f32le_bytes(samples: &[f32]) -> Vec<u8> {
    samples.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn to_i16(samples: &[f32]) -> Vec<i16> {
    samples.iter().map(|&x| f32_to_i16(x)).collect()
}

fn encoder_error(what: &str, e: impl std::fmt::Debug) -> EncodeError {
    EncodeError::new(format!("{what} encoding failed: {e:?}"))
}

/// mp3 through LAME: constant bit rate, mono, at the model's rate (24 kHz is MPEG-2 layer III).
struct Mp3 {
    lame: mp3lame_encoder::Encoder,
}

impl Mp3 {
    /// `info_tag`: reserve LAME's Info frame (a whole file only: it is written at the end).
    fn new(rate: u32, info_tag: bool) -> Result<Mp3, EncodeError> {
        use mp3lame_encoder::{Builder, Mode, Quality, VbrMode};
        let setup = |what: &str, e: mp3lame_encoder::BuildError| EncodeError::new(format!("mp3 encoder setting {what}: {e:?}"));
        let mut b = Builder::new().ok_or_else(|| EncodeError::new("mp3 encoder: LAME could not allocate its state"))?;
        b.set_num_channels(1).map_err(|e| setup("channels", e))?;
        b.set_sample_rate(rate).map_err(|e| setup("sample rate", e))?;
        b.set_mode(Mode::Mono).map_err(|e| setup("mode", e))?;
        b.set_vbr_mode(VbrMode::Off).map_err(|e| setup("vbr", e))?;
        b.set_brate(MP3_KBPS).map_err(|e| setup("bit rate", e))?;
        b.set_quality(Quality::Good).map_err(|e| setup("quality", e))?;
        b.set_to_write_vbr_tag(info_tag).map_err(|e| setup("info tag", e))?;
        let lame = b.build().map_err(|e| setup("init", e))?;
        Ok(Mp3 { lame })
    }

    fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, EncodeError> {
        let pcm = to_i16(samples);
        // LAME's documented worst case: 1.25 × samples + 7200 bytes.
        let mut out = Vec::with_capacity(pcm.len() * 5 / 4 + 7200);
        self.lame.encode_to_vec(mp3lame_encoder::MonoPcm(&pcm[..]), &mut out).map_err(|e| encoder_error("mp3", e))?;
        Ok(out)
    }

    fn finish(&mut self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::with_capacity(7200);
        self.lame.flush_to_vec::<mp3lame_encoder::FlushGap>(&mut out).map_err(|e| encoder_error("mp3", e))?;
        Ok(out)
    }

    /// A whole mp3 whose first frame is LAME's Info tag (exact length, encoder delay, padding).
    fn whole(samples: &[f32], rate: u32) -> Result<Vec<u8>, EncodeError> {
        let mut m = Mp3::new(rate, true)?;
        let mut bytes = m.push(samples)?;
        bytes.extend(m.finish()?);
        let mut tag = Vec::with_capacity(m.lame.lame_tag_size());
        if let Some(n) = m.lame.lame_tag_encode_to_vec(&mut tag) {
            // LAME wrote a frame of this size as a placeholder at the start.
            if n.get() <= bytes.len() {
                bytes[..n.get()].copy_from_slice(&tag[..n.get()]);
            }
        }
        Ok(bytes)
    }
}

/// Opus in Ogg (RFC 7845), as OpenAI sends it: an `OpusHead` page, an `OpusTags` page, then
/// 20 ms packets, a page per pushed chunk; granule positions count the 48 kHz samples decoded
/// so far, including the pre-skip (the encoder's lookahead, which decoders drop); the last page
/// ends the stream and its granule position trims the padding of the last packet.
struct OggOpus {
    enc: opus_rs::OpusEncoder,
    pages: ogg::PacketWriter<'static, Vec<u8>>,
    serial: u32,
    /// Samples at the input rate not yet in a packet.
    pending: Vec<f32>,
    /// Input samples received.
    received: u64,
    /// Packets written.
    packets: u64,
    /// Input samples per packet (20 ms).
    frame: usize,
    /// 48 kHz samples per input sample.
    scale: u64,
    pre_skip: u16,
    rate: u32,
    header: bool,
    /// The OpusTags comments (`KEY=value`): none in a server's response.
    comments: Vec<String>,
}

impl OggOpus {
    /// `serial`: the stream's number, `None` for one that differs between calls (a response);
    /// a file passes its own so that the same audio gives the same bytes.
    fn new(rate: u32, serial: Option<u32>, comments: Vec<String>) -> Result<OggOpus, EncodeError> {
        if !matches!(rate, 8000 | 12000 | 16000 | 24000 | 48000) {
            return Err(EncodeError::new(format!("opus needs 8, 12, 16, 24 or 48 kHz audio, the model makes {rate} Hz")));
        }
        let mut enc = opus_rs::OpusEncoder::new(rate as i32, 1, opus_rs::Application::Audio).map_err(|e| encoder_error("opus", e))?;
        enc.bitrate_bps = OPUS_BPS;
        let scale = u64::from(48_000 / rate);
        // libopus's lookahead (OPUS_GET_LOOKAHEAD): 2.5 ms plus the 4 ms delay compensation.
        let lookahead = rate as u64 / 400 + rate as u64 / 250;
        let pre_skip = u16::try_from(lookahead * scale).unwrap_or(u16::MAX);
        // Any number names the stream; one that differs between responses helps a tool that
        // concatenates them.
        let serial = serial.unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(1));
        Ok(OggOpus {
            enc,
            pages: ogg::PacketWriter::new(Vec::new()),
            serial,
            pending: Vec::new(),
            received: 0,
            packets: 0,
            frame: rate as usize / 50,
            scale,
            pre_skip,
            rate,
            header: true,
            comments,
        })
    }

    fn write(&mut self, packet: Vec<u8>, end: ogg::PacketWriteEndInfo, granule: u64) -> Result<(), EncodeError> {
        self.pages.write_packet(packet, self.serial, end, granule).map_err(|e| encoder_error("ogg", e))
    }

    fn headers(&mut self) -> Result<(), EncodeError> {
        let rate = self.rate;
        let mut head = b"OpusHead".to_vec();
        head.push(1); // version
        head.push(1); // channels
        head.extend(self.pre_skip.to_le_bytes());
        head.extend(rate.to_le_bytes()); // the input's rate, for information
        head.extend(0i16.to_le_bytes()); // output gain
        head.push(0); // channel mapping family: mono/stereo
        self.write(head, ogg::PacketWriteEndInfo::EndPage, 0)?;
        let vendor = concat!("cosy ", env!("CARGO_PKG_VERSION"), " (opus-rs)");
        let mut tags = b"OpusTags".to_vec();
        tags.extend(tags::vorbis_comment_body(vendor, &self.comments));
        self.write(tags, ogg::PacketWriteEndInfo::EndPage, 0)
    }

    /// Encodes every whole frame of `pending`; the last packet written ends a page (or the
    /// stream, with `last`).
    fn encode_frames(&mut self, last: bool) -> Result<(), EncodeError> {
        let frames = self.pending.len() / self.frame;
        let mut packet = vec![0u8; 1275]; // the largest Opus packet
        for i in 0..frames {
            let input = &self.pending[i * self.frame..(i + 1) * self.frame];
            let n = self.enc.encode(input, self.frame, &mut packet).map_err(|e| encoder_error("opus", e))?;
            self.packets += 1;
            let end = match (i + 1 == frames, last) {
                (false, _) => ogg::PacketWriteEndInfo::NormalPacket,
                (true, false) => ogg::PacketWriteEndInfo::EndPage,
                (true, true) => ogg::PacketWriteEndInfo::EndStream,
            };
            // What a decoder gets from the packets so far, the pre-skip included (RFC 7845, 4);
            // the last page's position says where the audio ends, trimming the padding (4.4).
            let full = self.packets * self.frame as u64 * self.scale;
            let granule = if last && i + 1 == frames { (u64::from(self.pre_skip) + self.received * self.scale).min(full) } else { full };
            self.write(packet[..n].to_vec(), end, granule)?;
        }
        self.pending.drain(..frames * self.frame);
        Ok(())
    }

    fn take(&mut self) -> Vec<u8> {
        std::mem::take(self.pages.inner_mut())
    }

    fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, EncodeError> {
        if std::mem::take(&mut self.header) {
            self.headers()?;
        }
        self.received += samples.len() as u64;
        self.pending.extend_from_slice(samples);
        if self.pending.len() >= self.frame {
            self.encode_frames(false)?;
        }
        Ok(self.take())
    }

    fn finish(&mut self) -> Result<Vec<u8>, EncodeError> {
        if std::mem::take(&mut self.header) {
            self.headers()?;
        }
        // Zeros through the lookahead, then to a whole frame: every input sample gets out.
        let lookahead = usize::from(self.pre_skip) / self.scale as usize;
        let padded = (self.pending.len() + lookahead).div_ceil(self.frame).max(1) * self.frame;
        self.pending.resize(padded, 0.0);
        self.encode_frames(true)?;
        Ok(self.take())
    }
}

/// A streamed flac: `fLaC` and a STREAMINFO that leaves the length and MD5 unknown (0, as the
/// format allows), then a frame per [`FLAC_BLOCK`] samples.
struct FlacStream {
    config: flacenc::error::Verified<flacenc::config::Encoder>,
    info: flacenc::component::StreamInfo,
    pending: Vec<i32>,
    frames: usize,
    header: bool,
    /// A file's VORBIS_COMMENT block (`KEY=value`), after STREAMINFO; none in a response.
    comments: Option<Vec<String>>,
    /// The samples so far: their count and MD5, for a file's final STREAMINFO.
    seen: flacenc::source::Context,
}

impl FlacStream {
    fn new(rate: u32, comments: Option<Vec<String>>) -> Result<FlacStream, EncodeError> {
        use flacenc::error::Verify;
        let config = flacenc::config::Encoder::default().into_verified().map_err(|e| encoder_error("flac settings", e))?;
        let mut info = flacenc::component::StreamInfo::new(rate as usize, 1, 16).map_err(|e| encoder_error("flac", e))?;
        info.set_block_sizes(FLAC_BLOCK, FLAC_BLOCK).map_err(|e| encoder_error("flac", e))?;
        let seen = flacenc::source::Context::new(16, 1);
        Ok(FlacStream { config, info, pending: Vec::new(), frames: 0, header: true, comments, seen })
    }

    fn header_bytes(&self) -> Result<Vec<u8>, EncodeError> {
        self.header_with(&self.info)
    }

    /// `fLaC`, STREAMINFO `info` and, in a file, the VORBIS_COMMENT block.
    fn header_with(&self, info: &flacenc::component::StreamInfo) -> Result<Vec<u8>, EncodeError> {
        use flacenc::component::BitRepr;
        let mut stream = flacenc::component::Stream::new(info.sample_rate(), 1, 16).map_err(|e| encoder_error("flac", e))?;
        *stream.stream_info_mut() = info.clone();
        let mut sink = flacenc::bitsink::ByteSink::new();
        stream.write(&mut sink).map_err(|e| encoder_error("flac", e))?;
        let mut bytes = sink.as_slice().to_vec();
        if let Some(comments) = &self.comments {
            // STREAMINFO is no longer the last metadata block (its header's top bit: FLAC 8.1).
            if bytes.len() > 4 {
                bytes[4] &= 0x7f;
            }
            let vendor = concat!("cosy ", env!("CARGO_PKG_VERSION"), " (flacenc)");
            let body = tags::vorbis_comment_body(vendor, comments);
            let len = u32::try_from(body.len()).ok().filter(|&n| n < 1 << 24).ok_or_else(|| EncodeError::new("flac: the tags are over 16 MiB"))?;
            bytes.push(0x80 | 4); // last block, VORBIS_COMMENT
            bytes.extend(&len.to_be_bytes()[1..]);
            bytes.extend(body);
        }
        Ok(bytes)
    }

    /// The header again, now with the stream's length and MD5 (a file rewrites its start with
    /// it once all the audio is in): as long as the first one.
    fn final_header(&self) -> Result<Vec<u8>, EncodeError> {
        let mut info = self.info.clone();
        info.set_total_samples(self.seen.total_samples());
        info.set_md5_digest(&self.seen.md5_digest());
        self.header_with(&info)
    }

    fn frame(&mut self, block: &[i32]) -> Result<Vec<u8>, EncodeError> {
        use flacenc::component::BitRepr;
        use flacenc::source::Fill;
        let mut fb = flacenc::source::FrameBuf::with_size(1, FLAC_BLOCK).map_err(|e| encoder_error("flac", e))?;
        fb.fill_interleaved(block).map_err(|e| encoder_error("flac", e))?;
        let frame = flacenc::encode_fixed_size_frame(&self.config, &fb, self.frames, &self.info).map_err(|e| encoder_error("flac", e))?;
        self.frames += 1;
        let mut sink = flacenc::bitsink::ByteSink::new();
        frame.write(&mut sink).map_err(|e| encoder_error("flac", e))?;
        Ok(sink.as_slice().to_vec())
    }

    fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, EncodeError> {
        let mut out = if std::mem::take(&mut self.header) { self.header_bytes()? } else { Vec::new() };
        let start = self.pending.len();
        self.pending.extend(samples.iter().map(|&x| i32::from(f32_to_i16(x))));
        {
            use flacenc::source::Fill;
            // The MD5 of the samples as 16-bit little-endian (FLAC's STREAMINFO), in one call.
            let bytes: Vec<u8> = self.pending[start..].iter().flat_map(|&x| (x as i16).to_le_bytes()).collect();
            self.seen.fill_le_bytes(&bytes, 2).map_err(|e| encoder_error("flac", e))?;
        }
        let whole = self.pending.len() / FLAC_BLOCK * FLAC_BLOCK;
        let blocks: Vec<i32> = self.pending.drain(..whole).collect();
        for block in blocks.chunks(FLAC_BLOCK) {
            out.extend(self.frame(block)?);
        }
        Ok(out)
    }

    fn finish(&mut self) -> Result<Vec<u8>, EncodeError> {
        let mut out = if std::mem::take(&mut self.header) { self.header_bytes()? } else { Vec::new() };
        if !self.pending.is_empty() {
            let rest = std::mem::take(&mut self.pending);
            out.extend(self.frame(&rest)?);
        }
        Ok(out)
    }
}

/// 16-bit mono FLAC of `samples` (flacenc, fixed 4096-sample blocks).
fn encode_flac(samples: &[f32], rate: u32) -> Result<Vec<u8>, EncodeError> {
    use flacenc::component::BitRepr;
    use flacenc::error::Verify;
    let ints: Vec<i32> = samples.iter().map(|&x| i32::from(f32_to_i16(x))).collect();
    let config = flacenc::config::Encoder::default()
        .into_verified()
        .map_err(|e| EncodeError::new(format!("flac encoder settings: {e:?}")))?;
    let source = flacenc::source::MemSource::from_samples(&ints, 1, 16, rate as usize);
    let stream = flacenc::encode_with_fixed_block_size(&config, source, FLAC_BLOCK)
        .map_err(|e| EncodeError::new(format!("flac encoding failed: {e:?}")))?;
    let mut sink = flacenc::bitsink::ByteSink::new();
    stream.write(&mut sink).map_err(|e| EncodeError::new(format!("flac encoding failed: {e:?}")))?;
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

    fn tone(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i as f32) * 0.03).sin() * 0.5).collect()
    }

    /// `samples` pushed in uneven chunks, then finished.
    fn streamed(format: AudioFormat, samples: &[f32]) -> Vec<u8> {
        let mut enc = format.stream_encoder(24_000).expect("encoder");
        let mut bytes = Vec::new();
        for chunk in samples.chunks(7_001) {
            bytes.extend(enc.push(chunk).expect("push"));
        }
        bytes.extend(enc.finish().expect("finish"));
        bytes
    }

    #[test]
    fn flac_round_trips_to_the_int16_samples() {
        let samples = tone(30_000);
        let flac = AudioFormat::Flac.encode_whole(&samples, 24_000).expect("flac");
        assert_eq!(&flac[..4], b"fLaC");
        let audio = decode(flac);
        assert_eq!(audio.sample_rate, 24_000);
        assert_eq!(audio.samples.len(), samples.len());
        // Lossless: equal to the int16 conversion (decoded back to float by the decoder).
        for (a, b) in audio.samples.iter().zip(&samples) {
            let want = f32::from(f32_to_i16(*b)) / 32768.0;
            assert!((a - want).abs() < 1e-6, "{a} vs {want}");
        }
    }

    #[test]
    fn streamed_flac_round_trips() {
        let samples = tone(30_000);
        let flac = streamed(AudioFormat::Flac, &samples);
        assert_eq!(&flac[..4], b"fLaC");
        let audio = decode(flac);
        assert_eq!(audio.samples.len(), samples.len());
        for (a, b) in audio.samples.iter().zip(&samples) {
            let want = f32::from(f32_to_i16(*b)) / 32768.0;
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
        let samples = tone(8000);
        let bytes = streamed(AudioFormat::Wav, &samples);
        let audio = decode(bytes);
        assert_eq!(audio.samples.len(), samples.len());
    }

    #[test]
    fn mp3_decodes_to_about_the_length() {
        let samples = tone(48_000);
        let whole = AudioFormat::Mp3.encode_whole(&samples, 24_000).expect("mp3");
        // The whole file's Info tag gives decoders the exact length.
        assert_eq!(decode(whole.clone()).samples.len(), samples.len());
        for bytes in [streamed(AudioFormat::Mp3, &samples), whole] {
            let audio = decode(bytes);
            assert_eq!(audio.sample_rate, 24_000);
            // The encoder's delay and the last frame's padding (a frame is 576 samples).
            let n = audio.samples.len();
            assert!(n + 100 >= samples.len() && n <= samples.len() + 3000, "{n} samples decoded of {}", samples.len());
        }
    }

    #[test]
    fn ogg_opus_pages_carry_the_headers_and_the_end() {
        let samples = tone(24_000);
        let bytes = streamed(AudioFormat::Opus, &samples);
        assert_eq!(&bytes[..4], b"OggS");
        let mut reader = ogg::PacketReader::new(std::io::Cursor::new(bytes));
        let head = reader.read_packet_expected().expect("head");
        assert_eq!(&head.data[..8], b"OpusHead");
        assert_eq!(u16::from_le_bytes([head.data[10], head.data[11]]), 312, "pre-skip of libopus at 24 kHz");
        let tags = reader.read_packet_expected().expect("tags");
        assert_eq!(&tags.data[..8], b"OpusTags");
        let mut last = None;
        let mut packets = 0;
        while let Some(p) = reader.read_packet().expect("packet") {
            packets += 1;
            last = Some((p.absgp_page(), p.last_in_stream()));
        }
        // 1 s + the lookahead, in 20 ms packets; the end trims to exactly 1 s at 48 kHz.
        assert_eq!(packets, 51);
        assert_eq!(last, Some((312 + 48_000, true)));
    }
}
