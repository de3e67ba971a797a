//! Text normalisation parity: every case of tests/data/tn_cases.json (written by
//! onnx/scripts/make_tn_fixture.py from the Python wetext/kaldifst pipeline the official frontend
//! runs) must come out of `WetextNormalizer` byte for byte.
//!
//! The grammars come from the pinned wetext package: env COSY_WETEXT_DIR (the package folder, the
//! one containing `fsts/`), else the project venv's installed package. Without either the test
//! prints why and skips. COSY_TN_CASES points at another case file (e.g. the script's
//! `--random` output) for wider runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use cosy::frontend::tn::{TnLang, WetextNormalizer};
use cosy::Error;


fn wetext_package_dir() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var("COSY_WETEXT_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let python = crate::common::venv_dir()
        .map(|v| v.join("bin/python"))
        .ok_or_else(|| "no exporter venv (COSY_VENV or ~/.cache/cosy/venv)".to_string())?;
    let out = Command::new(&python)
        .args([
            "-c",
            "import wetext, os; print(os.path.dirname(wetext.__file__))",
        ])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "wetext is not installed in the venv: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Copies the TN grammars into `dst` under the names the exporter gives them (tn_assets.py).
fn copy_grammars(package: &Path, dst: &Path) -> Result<(), String> {
    for lang in [TnLang::Zh, TnLang::En] {
        for (role, name) in [
            ("tagger", lang.tagger_file_name()),
            ("verbalizer", lang.verbalizer_file_name()),
        ] {
            let src = package
                .join("fsts")
                .join(lang.as_str())
                .join("tn")
                .join(format!("{role}.fst"));
            std::fs::copy(&src, dst.join(name)).map_err(|e| format!("{}: {e}", src.display()))?;
        }
    }
    Ok(())
}

struct Case {
    what: String,
    input: String,
    lang: TnLang,
    expected: String,
}

fn load_cases() -> Vec<Case> {
    let path = std::env::var("COSY_TN_CASES")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tn_cases.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: serde_json::Value = serde_json::from_str(&text).expect("case file is JSON");
    let cases = doc["cases"].as_array().expect("cases array");
    cases
        .iter()
        .map(|c| Case {
            what: c["what"].as_str().unwrap_or("").to_owned(),
            input: c["input"].as_str().expect("input").to_owned(),
            lang: match c["lang"].as_str() {
                Some("zh") => TnLang::Zh,
                Some("en") => TnLang::En,
                other => panic!("unknown lang {other:?}"),
            },
            expected: c["expected"].as_str().expect("expected").to_owned(),
        })
        .collect()
}

#[test]
fn wetext_cases_match_python() {
    let package = match wetext_package_dir() {
        Ok(p) => p,
        Err(why) => {
            crate::common::missing(&format!("{why} (set COSY_WETEXT_DIR to the wetext package folder)"));
            return;
        }
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    if let Err(why) = copy_grammars(&package, tmp.path()) {
        crate::common::missing(&format!("wetext grammars not found: {why}"));
        return;
    }

    let t0 = Instant::now();
    let zh = WetextNormalizer::load(tmp.path(), TnLang::Zh).expect("zh grammars load");
    let t_zh = t0.elapsed();
    let t1 = Instant::now();
    let en = WetextNormalizer::load(tmp.path(), TnLang::En).expect("en grammars load");
    let t_en = t1.elapsed();
    println!("load: zh {t_zh:?}, en {t_en:?}");

    let cases = load_cases();
    assert!(cases.len() >= 40, "fixture has only {} cases", cases.len());
    let mut mismatches = Vec::new();
    let mut time = [std::time::Duration::ZERO; 2];
    let mut count = [0usize; 2];
    for case in &cases {
        // The frontend's language choice must agree with what the Python side recorded.
        assert_eq!(
            TnLang::for_text(&case.input),
            case.lang,
            "language choice for {:?}",
            case.input
        );
        let normalizer = if case.lang == TnLang::Zh { &zh } else { &en };
        let idx = (case.lang == TnLang::En) as usize;
        let t = Instant::now();
        let got = normalizer.normalize(&case.input);
        time[idx] += t.elapsed();
        count[idx] += 1;
        match got {
            Ok(got) if got == case.expected => {}
            Ok(got) => mismatches.push(format!(
                "[{}] {:?}\n   want {:?}\n   got  {:?}",
                case.what, case.input, case.expected, got
            )),
            Err(e) => mismatches.push(format!("[{}] {:?}: error {e}", case.what, case.input)),
        }
    }
    for (i, name) in ["zh", "en"].iter().enumerate() {
        if count[i] > 0 {
            println!(
                "{name}: {} cases, {:?} per sentence",
                count[i],
                time[i] / count[i] as u32
            );
        }
    }
    println!(
        "{} of {} cases match",
        cases.len() - mismatches.len(),
        cases.len()
    );
    assert!(
        mismatches.is_empty(),
        "{} mismatches:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[test]
fn missing_grammar_is_a_clear_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let err = WetextNormalizer::load(tmp.path(), TnLang::Zh)
        .err()
        .expect("loading from an empty folder fails");
    match &err {
        Error::Model { path, msg } => {
            assert!(
                path.ends_with("zh_tn_tagger.fst"),
                "path {}",
                path.display()
            );
            assert!(msg.contains("not found"), "message {msg}");
        }
        other => panic!("unexpected error {other:?}"),
    }
    // A file that is not an FST is reported as such, naming the file.
    std::fs::write(tmp.path().join("en_tn_tagger.fst"), b"not an fst").expect("write");
    std::fs::write(tmp.path().join("en_tn_verbalizer.fst"), b"not an fst").expect("write");
    let err = WetextNormalizer::load(tmp.path(), TnLang::En)
        .err()
        .expect("garbage fails to load");
    let text = err.to_string();
    assert!(
        text.contains("en_tn_tagger.fst") && text.contains("OpenFST"),
        "{text}"
    );
}
