//! Runnable examples live beside this file; see `Cargo.toml` for their names.
