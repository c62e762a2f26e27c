//! JSON text to Python objects, built directly (no intermediate tree, no text round trip),
//! with exactly what `json.loads` would return.
//!
//! serde_json streams the text into a [`Visitor`] that builds dicts, lists, strings and
//! numbers. Where serde_json's reading of a number can differ from Python's — an integer
//! beyond 64 bits or a `-0` (serde_json gives a float for both, `json.loads` an `int`) —
//! and for anything serde_json refuses but `json.loads` accepts (a lone surrogate escape,
//! `1e999`), the conversion gives up and that one text goes through `json.loads` instead.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyList, PyString};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use session_store::MessageText;

/// Floats at or beyond this magnitude may be integers serde_json could not hold in 64 bits.
const INTEGER_RANGE: f64 = 9.2e18;

/// The Python strings of the object keys met so far in one call, by text: a key read again
/// (every message has `role`, `content`…) is the same string, its hash already computed,
/// as `json.loads` memoizes keys.
pub(crate) struct Keys<'py> {
    py: Python<'py>,
    seen: RefCell<rustc_hash::FxHashMap<Box<str>, Bound<'py, PyString>>>,
}

impl<'py> Keys<'py> {
    /// An empty memo.
    pub(crate) fn new(py: Python<'py>) -> Keys<'py> {
        Keys {
            py,
            seen: RefCell::default(),
        }
    }

    /// The string of `key`.
    fn get(&self, key: &str) -> Bound<'py, PyString> {
        let mut seen = self.seen.borrow_mut();
        if let Some(s) = seen.get(key) {
            return s.clone();
        }
        let s = PyString::new(self.py, key);
        // Bounded: a message with thousands of distinct keys does not grow the memo past
        // this.
        if seen.len() < 1024 {
            seen.insert(key.into(), s.clone());
        }
        s
    }
}

/// A Python object from one JSON value.
#[derive(Clone, Copy)]
struct Value<'a, 'py>(&'a Keys<'py>);

/// A map key, borrowed from the text when it holds no escape.
struct Key;

/// A message object as a session item: its `id` member dropped and `item_id_key` renamed
/// to `id` (see `session_store.agents`).
#[derive(Clone, Copy)]
struct Item<'a, 'py, 'k> {
    keys: &'a Keys<'py>,
    item_id_key: &'k str,
}

fn py_err<E: de::Error>(e: PyErr) -> E {
    E::custom(e)
}

impl<'de, 'py> DeserializeSeed<'de> for Value<'_, 'py> {
    type Value = Bound<'py, PyAny>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, 'py> Visitor<'de> for Value<'_, 'py> {
    type Value = Bound<'py, PyAny>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(PyBool::new(self.0.py, v).to_owned().into_any())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        v.into_bound_py_any(self.0.py).map_err(py_err)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        v.into_bound_py_any(self.0.py).map_err(py_err)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        if v.abs() >= INTEGER_RANGE || (v == 0.0 && v.is_sign_negative()) {
            return Err(E::custom("a number json.loads may read otherwise"));
        }
        Ok(PyFloat::new(self.0.py, v).into_any())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(PyString::new(self.0.py, v).into_any())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(self.0.py.None().into_bound(self.0.py))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let list = PyList::empty(self.0.py);
        while let Some(v) = seq.next_element_seed(self)? {
            list.append(v).map_err(py_err)?;
        }
        Ok(list.into_any())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let dict = PyDict::new(self.0.py);
        while let Some(key) = map.next_key_seed(Key)? {
            let value = map.next_value_seed(self)?;
            dict.set_item(self.0.get(&key), value).map_err(py_err)?;
        }
        Ok(dict.into_any())
    }
}

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
}

impl<'de, 'py> DeserializeSeed<'de> for Item<'_, 'py, '_> {
    type Value = Bound<'py, PyAny>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, 'py> Visitor<'de> for Item<'_, 'py, '_> {
    type Value = Bound<'py, PyAny>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a message object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let dict = PyDict::new(self.keys.py);
        while let Some(key) = map.next_key_seed(Key)? {
            if key == "id" {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let value = map.next_value_seed(Value(self.keys))?;
            let key = if key == self.item_id_key { "id" } else { &key };
            dict.set_item(self.keys.get(key), value).map_err(py_err)?;
        }
        Ok(dict.into_any())
    }
}

/// A message from its JSON text: as `json.loads` gives it, or as a session item when
/// `item_id_key` is given (see [`Item`]).
#[derive(Clone, Copy)]
struct Message<'a, 'py, 'k> {
    keys: &'a Keys<'py>,
    item_id_key: Option<&'k str>,
}

impl<'de, 'py> DeserializeSeed<'de> for Message<'_, 'py, '_> {
    type Value = Bound<'py, PyAny>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        match self.item_id_key {
            Some(item_id_key) => Item {
                keys: self.keys,
                item_id_key,
            }
            .deserialize(d),
            None => Value(self.keys).deserialize(d),
        }
    }
}

/// The message of an event payload `{"message": <message>, …}`.
struct Payload<'a, 'py, 'k>(Message<'a, 'py, 'k>);

impl<'de, 'py> DeserializeSeed<'de> for Payload<'_, 'py, '_> {
    type Value = Bound<'py, PyAny>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, 'py> Visitor<'de> for Payload<'_, 'py, '_> {
    type Value = Bound<'py, PyAny>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a message payload")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut message = None;
        while let Some(key) = map.next_key_seed(Key)? {
            if key == "message" {
                if message.is_some() {
                    return Err(de::Error::duplicate_field("message"));
                }
                message = Some(map.next_value_seed(self.0)?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        message.ok_or_else(|| de::Error::missing_field("message"))
    }
}

/// What a read raises (a `SessionStoreError`) for a stored payload nested deeper than
/// `json.loads` reads, whose `RecursionError` named nothing (the package's own
/// `json.loads` calls raise it too: `_native.TOO_DEEP`).
pub(crate) fn too_deep_message() -> String {
    format!(
        "a stored payload nests objects and arrays deeper than Python's json module reads \
         (sys.getrecursionlimit()); an append refuses payloads nested more than {} deep, \
         this one was stored before that rule: the CLI reads it (session-store events)",
        session_store::format::MAX_PAYLOAD_NESTING
    )
}

/// `e`, or for a text nested deeper than `json.loads` reads (its `RecursionError`) a
/// `SessionStoreError` saying so ([`too_deep_message`]).
fn too_deep(py: Python<'_>, e: PyErr) -> PyErr {
    if e.is_instance_of::<pyo3::exceptions::PyRecursionError>(py) {
        return crate::SessionStoreError::new_err(too_deep_message());
    }
    e
}

/// Python's `json.loads`.
fn json_loads(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static LOADS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    LOADS.import(py, "json", "loads")
}

/// The Python object of a stored message (`json.loads` of its text), or its session item
/// when `item_id_key` is given (its `id` dropped, `item_id_key` renamed `id`). Built in one
/// pass over the text; through `json.loads` when that pass gives up (see the module).
///
/// # Errors
/// `ValueError` (`json.JSONDecodeError`) for text that is not JSON, `KeyError` for a
/// payload without a `message`, `TypeError` for an item that is not an object,
/// `SessionStoreError` for one nested deeper than `json.loads` reads.
pub(crate) fn message<'py>(
    keys: &Keys<'py>,
    text: &MessageText,
    item_id_key: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = keys.py;
    let seed = Message { keys, item_id_key };
    let (json, fast) = match text {
        MessageText::Payload(json) => {
            let mut d = serde_json::Deserializer::from_str(json);
            (
                json,
                Payload(seed)
                    .deserialize(&mut d)
                    .and_then(|v| d.end().map(|()| v)),
            )
        }
        MessageText::Message(json) => {
            let mut d = serde_json::Deserializer::from_str(json);
            (
                json,
                seed.deserialize(&mut d).and_then(|v| d.end().map(|()| v)),
            )
        }
    };
    if let Ok(v) = fast {
        return Ok(v);
    }
    let mut message = json_loads(py)?
        .call1((json.as_str(),))
        .map_err(|e| too_deep(py, e))?;
    if let MessageText::Payload(_) = text {
        message = message.get_item("message")?;
    }
    let Some(item_id_key) = item_id_key else {
        return Ok(message);
    };
    let message = message.cast_into::<PyDict>()?;
    let item = PyDict::new(py);
    for (key, value) in message.iter() {
        if key.eq("id")? {
            continue;
        }
        if key.eq(item_id_key)? {
            item.set_item("id", value)?;
        } else {
            item.set_item(key, value)?;
        }
    }
    Ok(item.into_any())
}
