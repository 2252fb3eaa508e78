//! The `redis` log backend (Redis Streams). PLACEHOLDER: being written.
