//! Arbitrary bytes as the JSON Lines input of `session-store append`: every line parsed as
//! a `Batch` and appended to one session (see `session_store_fuzz::append_jsonl`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    session_store_fuzz::append_jsonl(data);
});
