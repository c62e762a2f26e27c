//! Arbitrary bytes as an exported session file: `Root::import` into a fresh root and
//! `replay_file` of a session folder holding them (see `session_store_fuzz::import_bytes`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    session_store_fuzz::import_bytes(data);
});
