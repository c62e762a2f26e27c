//! Helpers shared by the benches (`mod common;` in a bench file).
#![allow(dead_code)]

/// The median of `v` (sorted in place, total order on floats); 0 for an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A count rounded to an integer, with thousands separators: `1234567.8` → `1,234,568`.
pub fn fmt_count(n: f64) -> String {
    let digits = format!("{:.0}", n.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}
