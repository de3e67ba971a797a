//! Text frontend rules, sentence splitting, tokenizer parity.
//!
//! The tokenizer tests need the tiny reference model's `tokenizer.json`: `COSY_TOKENIZER_JSON`, or
//! it is built with the exporter's venv (`cosy_export.tokenizer.build_tokenizer_json` on
//! `../shared/reference/tiny-official/CosyVoice-BlankEN`). Without either they print why and skip.

use std::path::{Path, PathBuf};

use cosy::frontend::text::{
    bypasses_frontend, contains_chinese, is_only_punctuation, normalize, normalize_and_split, replace_blank,
    spell_out_numbers, split_paragraph, zh_post_rules, IdentityNormalizer, Lang, SplitOptions,
};
use cosy::frontend::tokenizer::TextTokenizer;
use cosy::npy;

use crate::common::shared_dir;

fn tokenizer() -> Option<TextTokenizer> {
    if let Some(path) = std::env::var_os("COSY_TOKENIZER_JSON") {
        return Some(TextTokenizer::from_file(Path::new(&path)).expect("tokenizer.json loads"));
    }
    // Build the tiny reference model's tokenizer.json with the exporter (what `cosy_export export`
    // writes), once per test process.
    static BUILT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    let path = BUILT.get_or_init(|| {
        let shared = shared_dir()?;
        let python = crate::common::python()?;
        let out = std::env::temp_dir().join(format!("cosy-tok-{}.json", std::process::id()));
        let blanken = shared.join("reference/tiny-official/CosyVoice-BlankEN");
        let status = std::process::Command::new(python)
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx"))
            .args(["-c", "import sys; from cosy_export.tokenizer import build_tokenizer_json; build_tokenizer_json(sys.argv[1], sys.argv[2])"])
            .arg(&blanken)
            .arg(&out)
            .status()
            .expect("run the exporter's python");
        assert!(status.success(), "building tokenizer.json for {} failed", blanken.display());
        Some(out)
    });
    Some(TextTokenizer::from_file(path.as_ref()?).expect("tokenizer.json loads"))
}

/// Splitting length that counts words, for tests that do not need the real tokenizer.
fn words(s: &str) -> usize {
    s.split_whitespace().count()
}

fn opts(max: usize, min: usize, merge: usize) -> SplitOptions {
    SplitOptions { token_max_n: max, token_min_n: min, merge_len: merge, comma_split: false }
}

#[test]
fn split_paragraph_table() {
    let chars = |_: &str| 0usize; // unused for zh
    // (text, lang, options, expected)
    let zh_cases: Vec<(&str, SplitOptions, Vec<&str>)> = vec![
        // Appends 。 when no end mark; one short sentence stays whole.
        ("你好", SplitOptions::default(), vec!["你好。"]),
        // Pieces merge until adding one would pass max (6) while the segment already passes min (2).
        ("一二。三四。五六。七八。", opts(6, 2, 1), vec!["一二。三四。", "五六。七八。"]),
        // Max 4: every 3-char piece is flushed on its own.
        ("一二。三四。五六。七八。", opts(4, 2, 1), vec!["一二。", "三四。", "五六。", "七八。"]),
        // The last short piece joins the previous segment (merge_len 3 > len("七。") = 2).
        ("一二三。四五六。七。", opts(4, 2, 3), vec!["一二三。", "四五六。七。"]),
        // ... but not when it is long enough.
        ("一二三。四五六。七。", opts(4, 2, 2), vec!["一二三。", "四五六。", "七。"]),
        // Quotes stay attached to the sentence they close.
        ("他说：“好。”然后走了。", opts(3, 1, 1), vec!["他说：", "“好。”", "然后走了。"]),
        // An empty piece (doubled mark) loses its mark.
        ("好！！", SplitOptions::default(), vec!["好！"]),
        // zh also cuts at ASCII marks and 、 but not at ASCII ':'.
        ("a:b、c", opts(1, 0, 0), vec!["a:b、", "c。"]),
    ];
    for (text, o, expect) in zh_cases {
        assert_eq!(split_paragraph(text, Lang::Zh, &chars, o), expect, "zh {text:?}");
    }
    let en_cases: Vec<(&str, SplitOptions, Vec<&str>)> = vec![
        ("Hello world", SplitOptions::default(), vec!["Hello world."]),
        ("One two. Three four. Five six.", opts(3, 1, 1), vec!["One two.", " Three four.", " Five six."]),
        ("One two. Three four. Five.", opts(3, 1, 2), vec!["One two.", " Three four. Five."]),
        ("He said \"go.\" Then left", opts(2, 1, 1), vec!["He said \"go.\"", " Then left."]),
        // Flush needs BOTH: adding exceeds max AND the current exceeds min.
        ("a b c. d e f. g h i.", opts(5, 3, 1), vec!["a b c. d e f.", " g h i."]),
    ];
    for (text, o, expect) in en_cases {
        assert_eq!(split_paragraph(text, Lang::En, &words, o), expect, "en {text:?}");
    }
    assert!(split_paragraph("", Lang::En, &words, SplitOptions::default()).is_empty());
}

#[test]
fn frontend_rules() {
    // Bypass on markup, on empty text and when disabled: unchanged, one segment.
    let marked = "You are a helpful assistant.<|endofprompt|>  Room 42. 很好";
    assert!(bypasses_frontend(marked));
    assert_eq!(normalize_and_split(marked, true, &IdentityNormalizer, &words), vec![marked]);
    assert_eq!(normalize_and_split(" 42 ", false, &IdentityNormalizer, &words), vec![" 42 "]);
    assert_eq!(normalize_and_split("", true, &IdentityNormalizer, &words), vec![""]);
    assert!(!bypasses_frontend("a <| b"));

    assert!(contains_chinese("abc中"));
    assert!(!contains_chinese("カタカナ"));

    // zh post rules.
    assert_eq!(replace_blank("你 好 a b 中 c"), "你好a b中c");
    assert_eq!(zh_post_rules("面积5m²和3m³"), "面积5m平方和3m立方");
    // Spaces next to a non-ASCII char go first, so " - " only survives between ASCII.
    assert_eq!(zh_post_rules("价格1.5元 - 很便宜"), "价格1。5元-很便宜");
    assert_eq!(zh_post_rules("A - B很好"), "A，B很好");
    assert_eq!(zh_post_rules("（注）【重要】`代码`——完"), "注重要代码 完");
    assert_eq!(zh_post_rules("你好，、,"), "你好。");
    assert_eq!(zh_post_rules("第一行\n第二行"), "第一行第二行");

    // en digit runs.
    assert_eq!(spell_out_numbers("Room 42B at 6:30"), "Room forty-twoB at six:thirty");
    assert_eq!(spell_out_numbers("1,204.50"), "one,two hundred and four.fifty");
    assert_eq!(spell_out_numbers("call 0198 or 1001"), "call one hundred and ninety-eight or one thousand and one");

    // Punctuation-only segments are dropped, others kept.
    assert!(is_only_punctuation("。"));
    assert!(is_only_punctuation("…!?"));
    assert!(is_only_punctuation("$+"));
    assert!(!is_only_punctuation(" ."));
    assert!(!is_only_punctuation("a."));
    let n = normalize("你好。。！", true, &IdentityNormalizer, &words);
    assert_eq!(n.segments, vec!["你好。"]);
    // A punctuation-only segment of its own (long enough not to be merged back) is dropped.
    let long = format!("{}。{}。", "一".repeat(70), "…".repeat(25));
    assert_eq!(normalize_and_split(&long, true, &IdentityNormalizer, &words), vec![format!("{}。", "一".repeat(70))]);
    assert!(normalize_and_split("…!", true, &IdentityNormalizer, &words).is_empty());
    assert!(normalize_and_split("$%", true, &IdentityNormalizer, &words).is_empty());
    // split=False returns the processed whole text.
    let n = normalize("  I have 2 cats. ", true, &IdentityNormalizer, &words);
    assert_eq!(n.text, "I have two cats.");
    assert_eq!(n.segments, vec!["I have two cats."]);
}

#[test]
fn text_frontend_reference() {
    let Some(shared) = shared_dir() else { return };
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(shared.join("reference/golden/text_frontend_reference.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(reference["frontend_backend"], "none");
    let tok = tokenizer();
    let mut checked = 0;
    for (case, entry) in reference["texts"].as_object().unwrap() {
        let input = entry["input"].as_str().unwrap();
        let expect: Vec<&str> = entry["segments"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
        let segments = match &tok {
            Some(t) => normalize_and_split(input, true, &IdentityNormalizer, &|s: &str| t.count(s)),
            // zh splitting counts characters, so it needs no tokenizer.
            None if contains_chinese(input) => normalize_and_split(input, true, &IdentityNormalizer, &words),
            None => continue,
        };
        assert_eq!(segments, expect, "case {case}");
        if let Some(t) = &tok {
            for (seg, ids) in segments.iter().zip(entry["segment_tokens"].as_array().unwrap()) {
                let ids: Vec<u32> = ids.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
                assert_eq!(t.encode(seg).unwrap(), ids, "case {case} segment {seg:?}");
            }
        }
        checked += 1;
    }
    println!("text_frontend_reference: {checked} cases checked");
    assert!(checked >= 2);
}

#[test]
fn tokenizer_matches_golden_ids() {
    let (Some(shared), Some(tok)) = (shared_dir(), tokenizer()) else { return };
    for case in ["en", "zh", "num", "p16k", "stream"] {
        let dir = shared.join("reference/golden").join(case);
        let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
        for (text_key, file) in [("tts_text", "text_token.npy"), ("prompt_text", "prompt_text_token.npy")] {
            let text = meta[text_key].as_str().unwrap();
            let path = dir.join(file);
            let gold: Vec<u32> = npy::read(&path).unwrap().to_i64(&path).unwrap().iter().map(|&v| v as u32).collect();
            assert_eq!(tok.encode(text).unwrap(), gold, "{case} {text_key}");
        }
    }
    // The exporter's corpus expectations, when the file is present in this checkout.
    let expected = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx/tests/data/tokenizer_expected.json");
    let expected = std::env::var_os("COSY_TOKENIZER_EXPECTED").map(PathBuf::from).unwrap_or(expected);
    if let Ok(src) = std::fs::read_to_string(&expected) {
        let data: serde_json::Value = serde_json::from_str(&src).unwrap();
        for (name, id) in data["special_ids"].as_object().unwrap() {
            assert_eq!(tok.encode(name).unwrap(), vec![id.as_u64().unwrap() as u32], "special {name}");
        }
        for case in data["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let ids: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            assert_eq!(tok.encode(text).unwrap(), ids, "corpus {text:?}");
            assert_eq!(tok.decode(&ids).unwrap(), case["decoded"].as_str().unwrap(), "decode {text:?}");
        }
        println!("corpus: {} texts match", data["cases"].as_array().unwrap().len());
    } else {
        crate::common::missing(&format!("no {} here; corpus check skipped", expected.display()));
    }
}
