//! Usage totals: token counts and costs folded from `usage` events into per-session
//! totals, per model and overall. Costs are exact decimals (an integer mantissa and a
//! scale) summed without floating point; every sum is checked, so a batch whose totals
//! would overflow is refused, never wrapped or rounded.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Most fractional digits a cost may have.
pub const MAX_COST_SCALE: u32 = 18;

/// Longest cost text accepted (digits and the point).
const MAX_COST_CHARS: usize = 64;

/// Most digits before the point of the cost of one appended `usage` event (under a million
/// billion). Totals are exact at the largest scale seen, in 38 digits: one cost of 10^21
/// left no room for any later cost of 18 decimals (every such event was refused, the
/// totals would overflow), so one hostile event kept a session from recording costs for
/// good. With this bound, 340,000 events of the largest cost still sum exactly.
pub(crate) const MAX_CALL_COST_WHOLE_DIGITS: u32 = 15;

/// An exact non-negative decimal amount, e.g. a cost in dollars: `mantissa / 10^scale`.
/// Written and read as a decimal string (`"0.0123"`): digits, optionally a point and at
/// most [`MAX_COST_SCALE`] more digits; no sign, exponent or spaces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    mantissa: u128,
    scale: u32,
}

impl Cost {
    /// Parses a decimal string.
    ///
    /// # Errors
    /// Why the text is not a decimal this type holds (empty, a sign, an exponent, more
    /// than [`MAX_COST_SCALE`] fractional digits, too large).
    pub fn parse(text: &str) -> Result<Cost, String> {
        if text.len() > MAX_COST_CHARS {
            return Err(format!("cost is longer than {MAX_COST_CHARS} characters"));
        }
        let (whole, fraction) = match text.split_once('.') {
            Some((w, f)) => (w, Some(f)),
            None => (text, None),
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(whole) || fraction.is_some_and(|f| !digits(f)) {
            return Err(format!(
                "cost {text:?} is not a decimal string like \"0.0123\" (digits, an optional point and digits)"
            ));
        }
        let fraction = fraction.unwrap_or("");
        let scale = u32::try_from(fraction.len()).unwrap_or(u32::MAX);
        if scale > MAX_COST_SCALE {
            return Err(format!(
                "cost {text:?} has more than {MAX_COST_SCALE} fractional digits"
            ));
        }
        let mut mantissa: u128 = 0;
        for b in whole.bytes().chain(fraction.bytes()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(u128::from(b - b'0')))
                .ok_or_else(|| format!("cost {text:?} is too large"))?;
        }
        Ok(Cost { mantissa, scale })
    }

    /// Whether this is more than one appended `usage` event may cost (10^15 or more,
    /// [`MAX_CALL_COST_WHOLE_DIGITS`]).
    pub(crate) fn is_over_one_call(self) -> bool {
        10u128
            .checked_pow(MAX_CALL_COST_WHOLE_DIGITS + self.scale)
            .is_none_or(|limit| self.mantissa >= limit)
    }

    /// `self + other` at the larger of the two scales; `None` on overflow.
    pub fn checked_add(self, other: Cost) -> Option<Cost> {
        let scale = self.scale.max(other.scale);
        let widen = |c: Cost| {
            10u128
                .checked_pow(scale - c.scale)
                .and_then(|f| c.mantissa.checked_mul(f))
        };
        Some(Cost {
            mantissa: widen(self)?.checked_add(widen(other)?)?,
            scale,
        })
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scale == 0 {
            return write!(f, "{}", self.mantissa);
        }
        let width = usize::try_from(self.scale).unwrap_or(0) + 1;
        let digits = format!("{:0width$}", self.mantissa);
        let (whole, fraction) = digits.split_at(digits.len() - (width - 1));
        write!(f, "{whole}.{fraction}")
    }
}

impl Serialize for Cost {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cost {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Cost, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Cost;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a decimal string like \"0.0123\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Cost, E> {
                Cost::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_str(Visitor)
    }
}

/// One `usage` event as the fold reads it (the payload, checked).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct UsageRecord {
    pub(crate) model: String,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) cache_read_tokens: u64,
    pub(crate) cache_write_tokens: u64,
    pub(crate) cost: Option<Cost>,
}

/// Token and cost totals of some `usage` events.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct UsageTotals {
    /// How many `usage` events were summed.
    pub events: u64,
    /// Sum of `input_tokens`.
    pub input_tokens: u64,
    /// Sum of `output_tokens`.
    pub output_tokens: u64,
    /// Sum of `cache_read_tokens` (absent counts 0).
    pub cache_read_tokens: u64,
    /// Sum of `cache_write_tokens` (absent counts 0).
    pub cache_write_tokens: u64,
    /// Exact sum of the `cost`s given; `None` when no event gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
}

impl UsageTotals {
    /// These totals plus one record.
    ///
    /// # Errors
    /// Which sum would overflow, with the total so far and what was added.
    fn plus(&self, r: &UsageRecord) -> Result<UsageTotals, String> {
        let count = |name: &str, total: u64, added: u64| {
            total.checked_add(added).ok_or_else(|| {
                format!(
                    "the total {name} ({total}) plus {added} would pass {}",
                    u64::MAX
                )
            })
        };
        Ok(UsageTotals {
            events: count("events", self.events, 1)?,
            input_tokens: count("input_tokens", self.input_tokens, r.input_tokens)?,
            output_tokens: count("output_tokens", self.output_tokens, r.output_tokens)?,
            cache_read_tokens: count(
                "cache_read_tokens",
                self.cache_read_tokens,
                r.cache_read_tokens,
            )?,
            cache_write_tokens: count(
                "cache_write_tokens",
                self.cache_write_tokens,
                r.cache_write_tokens,
            )?,
            cost: match (self.cost, r.cost) {
                (Some(a), Some(b)) => Some(a.checked_add(b).ok_or_else(|| {
                    format!(
                        "the total cost ({a}) plus {b} has more digits than an exact sum \
                         holds (38, at the larger of their scales)"
                    )
                })?),
                (a, b) => a.or(b),
            },
        })
    }
}

/// A session's usage: the totals of every `usage` event its projection folds (for a fork
/// or rewind, the inherited ones included), overall and per model.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Usage {
    /// Over every model.
    pub total: UsageTotals,
    /// Per `model`, in name order.
    pub by_model: BTreeMap<String, UsageTotals>,
}

impl Usage {
    /// Whether no `usage` event was folded.
    pub fn is_empty(&self) -> bool {
        self.total.events == 0
    }

    /// Adds one record; no change when a sum would overflow.
    ///
    /// # Errors
    /// Which sum would overflow (the overall one first, which is never below a model's).
    pub(crate) fn add(&mut self, r: &UsageRecord) -> Result<(), String> {
        let total = self.total.plus(r)?;
        let model = self
            .by_model
            .get(&r.model)
            .map_or_else(|| UsageTotals::default().plus(r), |t| t.plus(r))?;
        self.total = total;
        self.by_model.insert(r.model.clone(), model);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(s: &str) -> Cost {
        Cost::parse(s).unwrap()
    }

    #[test]
    fn costs_parse_print_and_add_exactly() {
        for s in ["0", "12", "0.5", "0.0123", "10.000000000000000001"] {
            assert_eq!(cost(s).to_string(), s);
        }
        assert_eq!(
            cost("0.1").checked_add(cost("0.2")).unwrap().to_string(),
            "0.3"
        );
        assert_eq!(
            cost("0.10").checked_add(cost("2")).unwrap().to_string(),
            "2.10"
        );
        for bad in [
            "",
            ".",
            "1.",
            ".5",
            "-1",
            "+1",
            "1e3",
            " 1",
            "1 ",
            "0x10",
            "1.2.3",
            "NaN",
            "½",
            "0.0000000000000000001",
            "999999999999999999999999999999999999999999",
        ] {
            assert!(Cost::parse(bad).is_err(), "{bad:?}");
        }
        let max = Cost {
            mantissa: u128::MAX,
            scale: 0,
        };
        assert_eq!(max.checked_add(cost("1")), None);
        assert_eq!(
            cost("1")
                .checked_add(cost("0.000000000000000001"))
                .unwrap()
                .to_string(),
            "1.000000000000000001"
        );
    }

    #[test]
    fn an_overflowing_record_changes_nothing() {
        let mut u = Usage::default();
        let big = UsageRecord {
            model: "m".to_owned(),
            input_tokens: u64::MAX,
            ..UsageRecord::default()
        };
        assert_eq!(u.add(&big), Ok(()));
        let before = u.clone();
        assert_eq!(
            u.add(&big),
            Err(format!(
                "the total input_tokens ({0}) plus {0} would pass {0}",
                u64::MAX
            ))
        );
        assert_eq!(u, before);
        let mut u = Usage::default();
        let costly = |c: &str| UsageRecord {
            model: "m".to_owned(),
            cost: Some(cost(c)),
            ..UsageRecord::default()
        };
        assert_eq!(u.add(&costly("1000000000000000000000")), Ok(()));
        let e = u.add(&costly("0.000000000000000001")).unwrap_err();
        assert!(
            e.starts_with(
                "the total cost (1000000000000000000000) plus 0.000000000000000001 has more digits"
            ),
            "{e}"
        );
    }

    #[test]
    fn one_call_costs_at_most_fifteen_digits_before_the_point() {
        for (c, over) in [
            ("999999999999999.999999999999999999", false),
            ("999999999999999", false),
            ("0.000000000000000001", false),
            ("1000000000000000", true),
            ("1000000000000000.0", true),
            ("340282366920938463463374607431768211455", true),
        ] {
            assert_eq!(cost(c).is_over_one_call(), over, "{c}");
        }
        // 340,000 events of the largest one-call cost still sum exactly.
        let max = cost("999999999999999.999999999999999999");
        let total = Cost {
            mantissa: max.mantissa * 340_000,
            scale: 18,
        };
        assert!(total.checked_add(max).is_some());
    }
}
