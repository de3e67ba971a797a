//! Text normalisation, tokenizer, prompt audio features, voices.
