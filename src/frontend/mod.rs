//! Text normalisation, tokenizer, prompt audio features, voices.
pub mod tn;
