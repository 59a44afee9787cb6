//! A counting upstream HTTP server for tests (written next).
