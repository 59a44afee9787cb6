//! Redis server processes for tests (written next).
