//! The replayed HiFT sine noise against the official values (cosyvoice3.md §11 for the full-size
//! model, golden/construction_constants.json for the tiny reference model).
#![allow(clippy::excessive_precision)] // reference values are kept as documented



use cosy::rng::{sine_noise, sine_noise_offset, Mt19937, SineNoise};

use crate::common::reference_dir;

const FULL_SIZE_K: u64 = 5_052_970;

#[test]
fn full_size_sine_noise_head_matches_official() {
    assert_eq!(sine_noise_offset(6561, 80, 192, 80, 80, 512, 1), FULL_SIZE_K);
    let want = [
        0.922825992f32, 0.47744751, 0.827051818, 0.28345716, 0.793481588, 0.173434794, 0.852375031,
        0.922854602, 0.731019974,
    ];
    let got = sine_noise(FULL_SIZE_K, 1);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        // The documented values are printed with 9 significant digits.
        assert!((g - w).abs() < 1e-8, "flat index {i}: {g} vs {w}");
    }
}

#[test]
fn full_size_sine_noise_far_offsets_match_official() {
    // Flat index i is output K + i of the seed-0 stream; far indices tell a shifted stream from a
    // wrong transform.
    for (index, want) in [(1_000_000u64, 0.877275884f32), (30_000_000, 0.515471756), (64_799_999, 0.656220615)] {
        let mut mt = Mt19937::new(0);
        mt.discard(FULL_SIZE_K + index);
        let got = mt.next_torch_f32();
        assert!((got - want).abs() < 1e-8, "flat index {index}: {got} vs {want}");
    }
}

#[test]
fn tiny_model_sine_noise_matches_construction_constants() {
    let Some(dir) = reference_dir() else { return };
    let path = dir.join("golden/construction_constants.json");
    let text = std::fs::read_to_string(&path).expect("construction_constants.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("valid json");
    let entry = &json["hift.m_source.l_sin_gen.sine_waves"];
    let head: Vec<f32> = entry["head"]
        .as_array()
        .expect("head array")
        .iter()
        .map(|v| v.as_f64().expect("number") as f32)
        .collect();
    assert!(head.len() >= 16);
    // Tiny config: flow V=6561, I=80, S=192, O=80; f0 F=80, C=24, N=1.
    let k = sine_noise_offset(6561, 80, 192, 80, 80, 24, 1);
    assert_eq!(k, 1_755_066);
    let mut table = SineNoise::new(k);
    let rows = head.len().div_ceil(9);
    let got = table.rows(rows);
    for (i, (g, w)) in got.iter().zip(&head).enumerate() {
        // Integer-only: (mt19937 output & 0xFFFFFF) / 2^24 is exact on every CPU.
        assert_eq!(g.to_bits(), w.to_bits(), "flat index {i}: {g} vs {w}");
    }
}
