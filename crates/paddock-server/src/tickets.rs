//! The single-use tickets of signed routes (`routes`), apart from its handlers so that the
//! server's state can hold them without importing a handler.

use std::collections::HashMap;
use std::sync::Mutex;

/// Unused tickets: value → (sandbox, port, expiry in Unix seconds). Lost with the process,
/// which is fine for something that lives seconds.
#[derive(Default)]
pub struct Tickets(pub(crate) Mutex<HashMap<String, (String, u16, u64)>>);
