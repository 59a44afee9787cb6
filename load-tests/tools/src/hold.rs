//! P10: opens `--connections` keep-alive connections, sends one `GET` on
//! each (so the server has served a request on every one), prints
//! `{"open":N}` and holds them idle for `--hold-ms`, then closes them all.
//!
//! Flags: `--target 127.0.0.1:PORT`, `--connections 1000`, `--hold-ms 3000`,
//! `--path /`.

use std::time::Duration;

use bytes::Bytes;

use crate::Args;
use crate::client::{Connection, Shape};

pub fn main(args: &Args) -> Result<(), String> {
    let target = args.loopback("target")?;
    let count = args.num("connections", 1000)? as usize;
    let hold = Duration::from_millis(args.num("hold-ms", 3000)?);
    let shape = Shape { method: http::Method::GET, path: args.str("path", "/"), body: Bytes::new() };
    crate::runtime(1)?.block_on(async move {
        let mut open = Vec::with_capacity(count);
        for _ in 0..count {
            let mut connection = Connection::open(target).await?;
            let answer = connection.send(&shape, None).await?;
            if !answer.status.is_success() {
                return Err(format!("GET {} answered {}", shape.path, answer.status));
            }
            open.push(connection);
        }
        println!("{{\"open\":{}}}", open.len());
        tokio::time::sleep(hold).await;
        drop(open);
        Ok(())
    })
}
