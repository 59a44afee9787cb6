//! One HTTP/1.1 request on a connection of its own, read until the server
//! closes it: for tests that talk to a listener of the binary (probes, the
//! admin API) with nothing but a socket.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

/// `method path` with the extra `headers` (whole lines, each ending in
/// `\r\n`) and `body`; the status and body (`(0, "")` when nothing answers).
pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
    let Ok(mut stream) = TcpStream::connect(addr) else { return (0, String::new()) };
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default())
}

/// The `Authorization` line for a bearer token.
pub fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}\r\n")
}
