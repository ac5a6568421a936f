//! The shared harness (the `tokenmint-test-support` crate), under the name the API tests
//! import it by: `use crate::helpers::…`.

pub use tokenmint_test_support::*;
