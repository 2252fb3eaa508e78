//! The `replay` subcommand (SPEC §9). PLACEHOLDER: being written.
