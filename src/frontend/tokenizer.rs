//! Text tokenizer: the Qwen2 byte-level BPE with the CosyVoice3 special tokens, loaded from the
//! exported `tokenizer.json` (docs/model-format.md). Encoding matches the official
//! `tokenizer([text])['input_ids'][0]`: no BOS/EOS added, added/special tokens (`<|endofprompt|>`,
//! `[breath]`, `[a]` …) matched atomically, NFC applied by the file's normaliser.

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use crate::error::{Error, Result};

/// Id of `<|endofprompt|>` in the CosyVoice3 vocabulary.
pub const ENDOFPROMPT_ID: u32 = 151646;
/// The marker text the LLM requires in `prompt_text ++ text`.
pub const ENDOFPROMPT: &str = "<|endofprompt|>";

/// A loaded `tokenizer.json`.
pub struct TextTokenizer {
    inner: Tokenizer,
    path: PathBuf,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer").field("path", &self.path).finish()
    }
}

impl TextTokenizer {
    /// Loads `tokenizer.json` and checks that `<|endofprompt|>` is the single token 151646.
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = Tokenizer::from_file(path)
            .map_err(|e| Error::model(path, format!("cannot load tokenizer ({e}); re-run the exporter")))?;
        let tokenizer = Self { inner, path: path.to_path_buf() };
        let ids = tokenizer.encode(ENDOFPROMPT)?;
        if ids != [ENDOFPROMPT_ID] {
            return Err(Error::model(
                path,
                format!("{ENDOFPROMPT} encodes to {ids:?}, expected [{ENDOFPROMPT_ID}]; the CosyVoice3 specials are missing, re-run the exporter"),
            ));
        }
        Ok(tokenizer)
    }

    /// Token ids of `text`. Encoded like the official HF call (`add_special_tokens=True`); the Qwen2
    /// post-processor adds no BOS/EOS, so the ids are exactly the text's tokens.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, true)
            .map_err(|e| Error::invalid(format!("cannot tokenize text ({e}): {text:?}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Number of tokens of `text` (the English sentence-splitting length). Unencodable text
    /// counts as its character count so splitting never fails.
    pub fn count(&self, text: &str) -> usize {
        self.encode(text).map_or_else(|_| text.chars().count(), |ids| ids.len())
    }

    /// Text of `ids` (special tokens kept), for logs and debugging.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| Error::invalid(format!("cannot decode ids ({e})")))
    }
}
