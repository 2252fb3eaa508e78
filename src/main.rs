//! Binary entry point. PLACEHOLDER.
fn main() {}
