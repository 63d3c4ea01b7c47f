//! `sallyctl lock`: lock a user now (`get locks` lists them, `rm lock/ID` lifts one, in
//! `resources`).

use anyhow::{Result, anyhow};
use sallyport_core::api::*;
use sallyport_core::routes;

use super::Format;
use crate::http::Api;
use crate::println;

pub(super) async fn lock(
    api: &Api,
    user: &str,
    message: Option<&str>,
    ttl: Option<&str>,
    format: Format,
) -> Result<()> {
    let ttl_secs = match ttl {
        Some(t) => Some(
            sallyport_core::duration::parse(t)
                .map_err(|e| anyhow!("--ttl: {e}"))?
                .as_secs(),
        ),
        None => None,
    };
    let l: LockInfo = api
        .post(
            routes::auth::LOCKS,
            &AddLock {
                user: user.to_string(),
                message: message.map(str::to_string),
                ttl_secs,
            },
        )
        .await?;
    if format == Format::Json {
        println!("{}", serde_json::to_string(&l)?);
    } else {
        println!(
            "User {} is locked ({}) until {}; lift with `sallyctl rm lock/{}`",
            l.user,
            l.message,
            l.expires.as_deref().unwrap_or("removed"),
            l.id
        );
    }
    Ok(())
}
